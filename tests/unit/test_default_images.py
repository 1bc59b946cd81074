"""The machine images a job gets by default bring a TensorFlow that the agent is tested under: each has
a row in `make test-images`' matrix (mk/images.mk), which runs the agent's e2e tests under it. Changing
a default to an image whose TensorFlow has no row fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainjobs.tpu_runtimes import DEFAULT_TPU_POD_RUNTIME, DEFAULT_TPU_RUNTIME, runtime_tensorflow
from worker.gcp.config import GcpConfig

IMAGES_MK = Path(__file__).resolve().parents[2] / "mk" / "images.mk"
# Deep Learning VM families name their TensorFlow: tf-2-17-cu121-ubuntu-2204-py310 brings 2.17.
_DLVM_FAMILY = re.compile(r"tf-(\d+)-(\d+)-.+")


def _family_tensorflow(family: str) -> tuple[int, int] | None:
    m = _DLVM_FAMILY.fullmatch(family)
    return None if m is None else (int(m.group(1)), int(m.group(2)))


def _variable(text: str, name: str) -> str:
    m = re.search(rf"^{re.escape(name)}\s*:?=\s*(.*)$", text, re.MULTILINE)
    assert m, f"mk/images.mk has no {name}"
    return m.group(1).strip()


def image_matrix_tensorflows() -> dict[tuple[int, int], str]:
    """(major, minor) of each row of the matrix -> the tensorflow-cpu version its venv installs."""
    text = IMAGES_MK.read_text()
    rows = {}
    for row in _variable(text, "IMAGE_TENSORFLOWS").split():
        pins = dict(p.split("==", 1) for p in _variable(text, f"IMAGE_PACKAGES_{row}").split() if "==" in p)
        major, minor = row.split(".")
        rows[(int(major), int(minor))] = pins.get("tensorflow-cpu", "")
    return rows


def default_images() -> dict[str, tuple[int, int] | None]:
    config = GcpConfig("", "")
    return {
        DEFAULT_TPU_RUNTIME: runtime_tensorflow(DEFAULT_TPU_RUNTIME),
        DEFAULT_TPU_POD_RUNTIME: runtime_tensorflow(DEFAULT_TPU_POD_RUNTIME),
        config.gpu_image_family: _family_tensorflow(config.gpu_image_family),
        config.cpu_image_family: _family_tensorflow(config.cpu_image_family),
    }


@pytest.mark.parametrize("image", list(default_images()))
def test_each_default_image_brings_a_tensorflow_the_agent_is_tested_under(image: str) -> None:
    tensorflow = default_images()[image]
    assert tensorflow is not None, f"which TensorFlow does the default image {image!r} bring?"
    assert tensorflow in image_matrix_tensorflows(), (
        f"the default image {image!r} brings TensorFlow {tensorflow[0]}.{tensorflow[1]}, which `make test-images` "
        f"does not test: add its row to mk/images.mk (IMAGE_TENSORFLOWS, IMAGE_PACKAGES_<version>)")


def test_each_row_of_the_matrix_installs_its_own_tensorflow() -> None:
    for (major, minor), pinned in image_matrix_tensorflows().items():
        assert pinned.startswith(f"{major}.{minor}."), f"the {major}.{minor} row installs tensorflow-cpu=={pinned!r}"


def test_the_image_names_are_read_as_the_tensorflow_they_bring() -> None:
    assert runtime_tensorflow("tpu-vm-tf-2.18.0-pod-pjrt") == (2, 18)
    assert runtime_tensorflow("tpu-ubuntu2204-base") is None
    assert _family_tensorflow("tf-2-17-cu121-ubuntu-2204-py310") == (2, 17)
    assert _family_tensorflow("common-cu121-debian-11") is None
