"""Which TPU VM images a spec may name: the agent trains with the image's own TensorFlow."""

from __future__ import annotations

import pytest


from trainjobs.tpu_runtimes import DEFAULT_TPU_RUNTIME, tpu_runtime_problem


@pytest.mark.parametrize("runtime, hosts", [
    ("tpu-vm-tf-2.18.0-pjrt", 1), ("tpu-vm-tf-2.16.1-pjrt", 1), ("tpu-vm-tf-2.18.0-pod-pjrt", 4),
])
def test_tensorflow_pjrt_images_of_the_right_kind_are_accepted(runtime: str, hosts: int) -> None:
    assert tpu_runtime_problem(runtime, hosts) is None


@pytest.mark.parametrize("runtime, hosts, reason", [
    ("tpu-ubuntu2204-base", 1, "is not a TensorFlow TPU VM image"),
    ("v2-alpha-tpuv5-lite", 1, "is not a TensorFlow TPU VM image"),
    ("tpu-vm-tf-2.15.0-pjrt", 1, "brings TensorFlow 2.15; the agent needs 2.16 or newer"),
    ("tpu-vm-tf-2.18.0-pjrt", 4, "this slice has 4 hosts, which need a pod image"),
    ("tpu-vm-tf-2.18.0-pod-pjrt", 1, "this slice has one host"),
])
def test_images_the_agent_cannot_use_are_refused_with_the_reason(runtime: str, hosts: int, reason: str) -> None:
    assert reason in (tpu_runtime_problem(runtime, hosts) or "")


def test_the_default_runtime_is_one_the_agent_accepts() -> None:
    assert tpu_runtime_problem(DEFAULT_TPU_RUNTIME, 1) is None


@pytest.mark.parametrize("runtime", ["tpu-vm-tf-2.18.0-pjrt\n", "tpu-vm-tf-2.18.0-pjrt\nx", " tpu-vm-tf-2.18.0-pjrt"])
def test_an_image_name_with_anything_around_it_is_refused(runtime: str) -> None:
    assert "is not a TensorFlow TPU VM image" in (tpu_runtime_problem(runtime, 1) or "")


