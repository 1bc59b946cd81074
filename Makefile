# Two commands on a fresh machine: `make demo` and `make test`. Each creates or refreshes .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: demo test bench venv clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

# The demo's job runs in a bubblewrap sandbox where the host has one (Linux, `bwrap` on PATH, e.g.
# Debian's bubblewrap package, and user namespaces a user may create); without one the stack says so and
# runs the demo's one project unsandboxed (worker/local/sandbox.py, TRAINJOBS_LOCAL_SANDBOX).
demo: venv
	$(PY) examples/demo.py

# Types first (seconds); then the unit tier (tests/unit: pure, seconds) in one process, and a failure
# there stops `make test` before the long tiers start; then integration and end-to-end together in three
# processes on two cores: many modules spend much of their time waiting (on agents, outages, polls),
# and a third process fills those waits (issue 12: 9m37s with two, 7m50s with three; bench/README.md).
# --dist loadfile keeps each module (and its TensorFlow) in one process; modules are handed out in
# collection order, which tests/conftest.py sorts so that the end-to-end tier and the modules with the
# most TensorFlow tests start first. The slowest 15 tests are printed. Tests scale their waits with
# TRAINJOBS_TEST_TIME_SCALE on a slower machine.
test: venv
	$(VENV)/bin/mypy
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)
	$(PY) -m pytest -n 3 --dist loadfile --no-loadscope-reorder --durations=15 tests/integration tests/e2e $(PYTEST_ARGS)

bench: venv
	$(PY) bench/claim_bench.py
	$(PY) bench/trainer_bench.py

clean: clean-images
	rm -rf $(VENV) .demo .test-tmp *.egg-info

# test-images: the agent under each default image's TensorFlow.
include mk/images.mk
