"""The built-in models are the core's table (trainjobs/model_params.py): the API checks a spec against it at
submit, staging checks the data's features against it, and the agent builds from it. The agent keeps no
list of its own (issue 19: a typo in a built-in's params once passed everything and failed on the paid
machine)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agent.builtin_models import BUILTIN_BUILDERS, _params
from agent.model_inputs import ModelError
from trainjobs.model_params import BUILTIN_MODELS, BUILTIN_PARAMS, KERAS_APPLICATIONS, features_problem
from trainjobs.spec import JobSpec, describe_errors, parse_stored


def test_the_agent_builds_exactly_the_built_ins_the_table_names() -> None:
    assert set(BUILTIN_BUILDERS) == set(BUILTIN_MODELS) == set(BUILTIN_PARAMS)


def test_a_misspelt_param_is_a_422_naming_it_with_did_you_mean() -> None:
    raw = {"dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp", "params": {"hiden_units": [8]}}}
    with pytest.raises(ValidationError) as refused:
        JobSpec.model_validate(raw)
    [detail] = describe_errors([dict(e) for e in refused.value.errors()])
    assert detail["field"] == "model.params.hiden_units"
    assert "did you mean 'hidden_units'?" in detail["reason"]


def test_a_job_stored_with_a_misspelt_param_fails_on_the_machine_in_the_same_words_before_training() -> None:
    raw = {"dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp", "params": {"hiden_units": [8]}}}
    spec = parse_stored(raw)  # accepted by a release that did not check params
    with pytest.raises(ModelError, match=r"model\.params\.hiden_units: .*did you mean 'hidden_units'\?"):
        _params("mlp", spec.model.params)


@pytest.mark.parametrize(("model", "shape", "refused"), [
    ("mlp", (4,), False),
    ("cnn", (8, 8), False),  # an image without channels: the builder gives it one
    ("cnn", (8, 8, 3), False),
    ("cnn", (4,), True),
    ("resnet", (2, 2, 2, 2), True),
    (KERAS_APPLICATIONS[0], (32, 32, 3), False),
    (KERAS_APPLICATIONS[0], (32, 32), True),  # keras.applications need channels
])
def test_which_features_each_model_takes(model: str, shape: tuple[int, ...], refused: bool) -> None:
    problem = features_problem(model, shape)
    assert (problem is not None) == refused
    if problem is not None:
        assert model in problem and str(list(shape)) in problem
