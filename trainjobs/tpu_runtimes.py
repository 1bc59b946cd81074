"""Which Cloud TPU VM images (runtime_version) the agent can train on.

The agent brings no TensorFlow of its own to a TPU VM (the PyPI build cannot drive the chips): it uses
the image's. So the image must be a TensorFlow one (tpu-vm-tf-*), new enough for the Keras 3 the agent
is written against, on the PJRT runtime, and of the right kind for the slice: Google builds `-pod-`
images for slices that span several hosts and plain ones for a single host
(https://cloud.google.com/tpu/docs/runtimes#tensorflow).
"""

from __future__ import annotations

import re

# The defaults bring a TensorFlow that `make test-images` runs the agent under (mk/images.mk): a default
# whose TensorFlow has no row there fails tests/unit/test_default_images.py.
DEFAULT_TPU_RUNTIME = "tpu-vm-tf-2.18.0-pjrt"  # one host
DEFAULT_TPU_POD_RUNTIME = "tpu-vm-tf-2.18.0-pod-pjrt"  # a slice of several hosts
MIN_TENSORFLOW = (2, 16)  # the first TPU images with Keras 3
# Matched with fullmatch: `$` would also match before a trailing newline, and the version goes into a cloud call.
_TF_IMAGE = re.compile(r"tpu-vm-tf-(\d+)\.(\d+)\.(\d+)(-pod)?-pjrt")


def default_tpu_runtime(hosts: int) -> str:
    """The image a spec gets when it names none: the tested TensorFlow, of the slice's kind."""
    return DEFAULT_TPU_POD_RUNTIME if hosts > 1 else DEFAULT_TPU_RUNTIME


def runtime_tensorflow(runtime_version: str) -> tuple[int, int] | None:
    """The TensorFlow (major, minor) a TensorFlow PJRT image brings; None for any other image."""
    m = _TF_IMAGE.fullmatch(runtime_version)
    return None if m is None else (int(m.group(1)), int(m.group(2)))


def tpu_runtime_problem(runtime_version: str, hosts: int) -> str | None:
    """Why the agent cannot run on this image with this many hosts, or None if it can."""
    pod = default_tpu_runtime(hosts)
    m = _TF_IMAGE.fullmatch(runtime_version)
    if m is None:
        return (f"{runtime_version!r} is not a TensorFlow TPU VM image the agent can use (the agent trains with the "
                f"image's TensorFlow on the PJRT runtime); use {pod!r}")
    version = (int(m.group(1)), int(m.group(2)))
    if version < MIN_TENSORFLOW:
        return (f"{runtime_version!r} brings TensorFlow {version[0]}.{version[1]}; the agent needs "
                f"{MIN_TENSORFLOW[0]}.{MIN_TENSORFLOW[1]} or newer (Keras 3); use {pod!r}")
    if hosts > 1 and not m.group(4):
        return f"this slice has {hosts} hosts, which need a pod image such as {pod!r}, not {runtime_version!r}"
    if hosts == 1 and m.group(4):
        return f"this slice has one host, which needs a single-host image such as {pod!r}, not {runtime_version!r}"
    return None
