"""Which Keras a program job runs with (issue 37): `program.keras` is 3, the image's Keras, unless the job
asks for 2, tf_keras; and what a Keras 2 job installs beyond the image (agent/requirements.py): the
tf-keras of the image's TensorFlow, only where the image lacks it. The job itself:
tests/e2e/test_keras2_programs.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agent.requirements import keras_2_requirements
from trainjobs.spec.program import ProgramSpec


def test_a_program_runs_with_the_images_keras_unless_it_asks_for_keras_2() -> None:
    assert ProgramSpec(source="train.py").keras == 3
    assert ProgramSpec.model_validate({"source": "train.py", "keras": 2}).keras == 2


@pytest.mark.parametrize("keras", [1, 4, "2", True, "tf_keras"])
def test_a_keras_other_than_2_or_3_is_refused_naming_the_field(keras: object) -> None:
    with pytest.raises(ValidationError) as refused:
        ProgramSpec.model_validate({"source": "train.py", "keras": keras})
    assert refused.value.errors()[0]["loc"] == ("keras",)


KERAS_3_IMAGE = {"tensorflow": "2.21.0", "keras": "3.15.1", "numpy": "2.4.6"}


@pytest.mark.parametrize(("installed", "tf_keras", "wanted"), [
    (KERAS_3_IMAGE, None, ["tf-keras==2.21.*"]),  # the image lacks it: its TensorFlow's release
    (KERAS_3_IMAGE, "2.21.0", []),  # the image has that release already
    ({"tensorflow-tpu": "2.18.0", "keras": "3.6.0"}, "2.17.0", ["tf-keras==2.18.*"]),  # another TensorFlow's
    ({"tensorflow-cpu": "2.17.1+cpu", "keras": "3.4.1"}, None, ["tf-keras==2.17.*"]),  # a local version label
    ({"tensorflow": "2.15.1", "keras": "2.15.0"}, None, []),  # TensorFlow 2.15: tf.keras is Keras 2 itself
])
def test_a_keras_2_program_gets_the_tf_keras_of_the_images_tensorflow_where_the_image_lacks_it(
        installed: dict[str, str], tf_keras: str | None, wanted: list[str]) -> None:
    assert keras_2_requirements(["pandas>=2"], installed, tf_keras) == wanted


def test_a_keras_2_program_that_names_tf_keras_itself_gets_what_it_names() -> None:
    assert keras_2_requirements(["tf_keras>=2.21"], KERAS_3_IMAGE, None) == []
