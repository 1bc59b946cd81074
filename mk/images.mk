# The agent under the TensorFlow of each default machine image (issue 19). Included by the Makefile.
#
# A TPU VM or Deep Learning VM image brings its own TensorFlow and Keras, and the agent trains with them:
# the VM installs only the agent wheel's requirements beside them (worker/gcp/bootstrap.py). A venv per
# image does the same here, with TensorFlow's CPU build of the image's version and the Keras of its time,
# and runs the agent's end-to-end tests in it; `make test` runs them under the dev venv's TensorFlow only.
#
#   make test-images                     every image, every agent test below
#   make test-images IMAGES_SUBSET=ci    the subset CI runs (.ci/run): one job of each kind per image
#   make test-image-2.17                 one image
#
# The matrix: one row per TensorFlow a default image brings. tests/unit/test_default_images.py fails when
# a default image (trainjobs/tpu_runtimes.py, worker/gcp/config.py) brings a TensorFlow without a row here.
IMAGE_TENSORFLOWS := 2.18 2.17
# tpu-vm-tf-2.18.0-pjrt and -pod-pjrt, the default TPU runtimes. Keras 3.6.0: current when TF 2.18 came out.
IMAGE_PACKAGES_2.18 := tensorflow-cpu==2.18.1 keras==3.6.0
# tf-2-17-cu121-ubuntu-2204-py310 and tf-2-17-cpu-ubuntu-2204-py310, the default GPU and CPU image families.
# Keras 3.4.1: current when TF 2.17 came out, the oldest an image of the family can hold.
IMAGE_PACKAGES_2.17 := tensorflow-cpu==2.17.1 keras==3.4.1
# What the tests themselves need beyond the agent's requirements (conftest's storage emulator).
IMAGE_TEST_PACKAGES := pytest gcp-storage-emulator

# The agent's e2e tests that run it alone, as a VM does: the other e2e modules drive it through the
# control plane (API, worker, PostgreSQL, staging), whose packages a VM, and so these venvs, lack.
IMAGE_TESTS := tests/e2e/test_agent.py tests/e2e/test_agent_runs.py tests/e2e/test_epoch_steps.py \
	tests/e2e/test_agent_watchdog.py tests/e2e/test_keras_compat.py tests/e2e/test_program_runs.py \
	tests/e2e/test_pruning.py tests/e2e/test_distillation.py tests/e2e/test_optimization.py \
	tests/e2e/test_input_wait.py
# ... less the one that stages its dataset with the worker's stager.
IMAGE_TESTS_SKIP := tests/e2e/test_agent_watchdog.py::test_a_sigterm_as_a_finished_agent_reports_still_leaves_a_final_status
# CI's subset (`IMAGES_SUBSET=ci`): a job trained, exported and served (one agent run answers the
# digits tests), a two-worker job (MultiWorkerMirroredStrategy), a mixed-float16 job, a resume from a
# mid-epoch checkpoint, the step counts of each strategy, the metrics over replicas, a watchdog stop, a
# program (issue 20) stopped by SIGTERM mid-epoch that resumes through the runtime's callbacks, a
# regression and a binary task on two workers in bfloat16 (issue 21; `two_workers` selects them), and
# pruning and distillation on two workers (issue 23: Keras 3.4 takes only Constraint instances as a variable's
# constraint; a student's loss is its model's own compute_loss, replaced, which each Keras must look up),
# and every export variant compared (`report_lists`: TF 2.18's TFLite crashed timing a dynamic-range model
# whose input grew on one interpreter; model.quantize of Keras 3.4 and 3.6), and the input-wait meter's
# clock around each fetch in the train function's graph (`slow_input`).
IMAGE_TESTS_ci := digits_cnn or downloaded_saved_model or stand_in_plan or two_workers or mixed_float16 \
	or (killed and mid) or every_epoch or every_replicas or control_plane_asks or (stopped_program and sigterm) \
	or report_lists or slow_input
IMAGES_SUBSET ?= all
$(if $(filter-out all ci,$(IMAGES_SUBSET)),$(error IMAGES_SUBSET is all or ci, not $(IMAGES_SUBSET)))

IMAGE_VENVS := $(foreach tf,$(IMAGE_TENSORFLOWS),.venv-tf-$(tf))

.PHONY: test-images $(addprefix test-image-,$(IMAGE_TENSORFLOWS)) clean-images

# One resolve, as on the VM (which names the image's TensorFlow beside the wheel): the agent's
# requirements keep within the bounds of that TensorFlow and Keras.
.venv-tf-%/.installed: pyproject.toml mk/images.mk
	test -x .venv-tf-$*/bin/python || $(PYTHON) -m venv .venv-tf-$*
	$(PYTHON) -c "from worker.gcp.bootstrap import agent_requirements as r; print('\n'.join(r()))" > .venv-tf-$*/agent.txt
	.venv-tf-$*/bin/pip install -q --disable-pip-version-check $(IMAGE_PACKAGES_$*) -r .venv-tf-$*/agent.txt \
		$(IMAGE_TEST_PACKAGES)
	touch $@

$(addprefix test-image-,$(IMAGE_TENSORFLOWS)): test-image-%: .venv-tf-%/.installed
	@echo "== the agent under TensorFlow $* ($(IMAGE_PACKAGES_$*)), tests: $(IMAGES_SUBSET)"
	TRAINJOBS_TEST_TASKS=all .venv-tf-$*/bin/python -m pytest $(IMAGE_TESTS) --deselect $(IMAGE_TESTS_SKIP) \
		$(if $(IMAGE_TESTS_$(IMAGES_SUBSET)),-k "$(IMAGE_TESTS_$(IMAGES_SUBSET))") --durations=5 $(PYTEST_ARGS)

# Every image in turn; a failing one stops the run (make -k runs the rest).
test-images: $(addprefix test-image-,$(IMAGE_TENSORFLOWS))

clean-images:
	rm -rf $(IMAGE_VENVS)
