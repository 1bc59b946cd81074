"""A sweep's trials checked at submit at the cost of what each value sets (issue 36, 1): the quick check of
one value (trainjobs/spec/trial_check.py) says what a whole-spec validation says, and the review's hostile
sweep costs a bounded number of whole validations' work however many values it lists."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tests.support.sweep_shapes import hostile_sweep
from trainjobs.spec import JobSpec
from trainjobs.spec.sweep import SweepSpec, trial_spec
from trainjobs.spec.trial_check import TrialCheck

JOBS = {
    "cpu": {"dataset": {"source": "sklearn:iris"}, "model": {"name": "mlp"}, "accelerator": {"type": "cpu"},
            "strategy": "default", "training": {"epochs": 4}},
    "mirrored": {"dataset": {"source": "sklearn:iris"}, "model": {"name": "mlp"},
                 "accelerator": {"type": "cpu", "replicas": 2}, "strategy": "mirrored"},
    "tpu": {"dataset": {"source": "gs://data-bucket/d/x.csv"}, "model": {"name": "cnn"},
            "accelerator": {"type": "tpu", "tpu_type": "v4-8"}},
    "gpu module": {"dataset": {"source": "gs://data-bucket/d/x.csv"},
                   "model": {"module": "gs://data-bucket/m.py", "params": {"a": 1}},
                   "accelerator": {"type": "gpu", "gpu_type": "nvidia-tesla-t4", "count": 2}},
    "program": {"program": {"source": "gs://data-bucket/p.py", "env": {"A": "1"}, "requirements": ["six"]}},
}
# Values fine and not, into sections, dicts, unions (accelerator), missing sections and unknown fields.
VALUES: list[tuple[str, list[Any]]] = [
    ("training.learning_rate", [0.1, 0.0, 20.0, "x", True]),
    ("training.global_batch_size", [30, 31, 32, 0, 10**9]),
    ("accelerator.replicas", [1, 2, 3, 64, 0]),
    ("accelerator.type", ["cpu", "gpu", "tpu", "x"]),
    ("accelerator.tpu_type", ["v4-8", "v4-32", "v4-7"]),
    ("accelerator.count", [1, 2, 3]),
    ("strategy", ["default", "mirrored", "tpu", "auto", "multi_worker_mirrored"]),
    ("workers", [1, 2, 64, 65]),
    ("precision", ["float32", "mixed_float16", "mixed_bfloat16", "x"]),
    ("model.params.dropout", [0.1, 2.0, "x"]),
    ("model.name", ["cnn", "nope", None]),
    ("program.env.B", ["1", "x" * 5000]),
    ("program.env.TF_CONFIG", ["1"]),
    ("program.entrypoint", ["a.py", "../a.py"]),
    ("training.distillation.temperature", [2.0]),
    ("training.pruning.target_sparsity", [0.5, 2.0]),
    ("dataset.options.header", ["none", 2]),
    ("limits.max_runtime", ["2h", "bad", 60]),
    ("export.tflite.quantization", ["int8", "bad"]),
    ("training.learning_rat", [0.1]),
    ("training.epochs.x", [1]),
    ("steps_per_execution", [1, True, 0]),
    ("task", ["regression", "x"]),
    ("training.class_weight.a", [1.0]),
]


def _whole(job: dict[str, Any], path: str, value: Any) -> JobSpec | None:
    try:
        return JobSpec.model_validate(trial_spec(job, {path: value}))
    except (ValidationError, ValueError):
        return None


@pytest.mark.parametrize("job", list(JOBS), ids=list(JOBS))
def test_a_value_checked_alone_is_taken_exactly_when_the_whole_spec_takes_it(job: str) -> None:
    check = TrialCheck(JOBS[job], JobSpec.model_validate(JOBS[job]))
    for path, values in VALUES:
        for value in values:
            whole = _whole(JOBS[job], path, value)
            try:
                quick: JobSpec | None = check.with_value(path, value)
            except (ValidationError, ValueError):
                quick = None
            assert (quick is None) == (whole is None), (path, value, whole)
            if quick is not None and whole is not None:
                assert quick.model_dump(mode="json") == whole.model_dump(mode="json"), (path, value)


def test_the_hostile_sweep_costs_a_few_whole_validations_not_one_per_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """32 parameters x 64 choices over a job with 64 requirements: each requirement is parsed a few times
    (the job's own validations), not once per value (2,048 times before)."""
    import packaging.requirements

    parsed = [0]

    class Counted(packaging.requirements.Requirement):
        def __init__(self, text: str) -> None:
            parsed[0] += 1
            super().__init__(text)

    monkeypatch.setattr(packaging.requirements, "Requirement", Counted)
    sweep = hostile_sweep()
    JobSpec.model_validate(sweep["job"])
    per_job, parsed[0] = parsed[0], 0
    assert per_job >= 64
    SweepSpec.model_validate(sweep)
    assert parsed[0] <= 8 * per_job, f"{parsed[0] / per_job:.0f} whole validations' requirement parsing"


def test_a_value_refused_is_named_with_its_parameter_and_the_field_inside_the_job() -> None:
    sweep = hostile_sweep(parameters=2, choices=3)
    sweep["parameters"]["program.env.SWEPT_1"]["choices"][2] = "x" * 5000
    with pytest.raises(ValidationError) as refused:
        SweepSpec.model_validate(sweep)
    error = refused.value.errors()[0]
    assert error["ctx"]["field"] == "parameters.program.env.SWEPT_1"
    assert "(at 'xxxx" in error["msg"] and "program.env.SWEPT_1: a value of 5000 characters" in error["msg"]


def test_values_fine_alone_but_not_together_are_caught_by_a_crossing() -> None:
    """Batch 34 divides over 1 replica and batch 32 over 4; 34 over 4 does not (the last of each, together)."""
    sweep = {"job": {**JOBS["cpu"], "strategy": "auto"}, "objective": {"metric": "val_accuracy"}, "parameters": {
        "accelerator.replicas": {"type": "categorical", "choices": [1, 2, 3, 4]},
        "training.global_batch_size": {"type": "categorical", "choices": [12, 24, 36, 48, 60, 34]}}}
    with pytest.raises(ValidationError, match="the trial .* is not a valid job"):
        SweepSpec.model_validate(sweep)
