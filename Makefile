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

demo: venv
	$(PY) examples/demo.py

# Types first (seconds), then one test process per core; --dist loadfile keeps each module (and its
# TensorFlow) in one process.
test: venv
	$(VENV)/bin/mypy
	$(PY) -m pytest -n 2 --dist loadfile $(PYTEST_ARGS)

bench: venv
	$(PY) bench/claim_bench.py
	$(PY) bench/trainer_bench.py

clean:
	rm -rf $(VENV) .demo *.egg-info
