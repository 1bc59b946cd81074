"""The job's plan checked against its staged data, before a machine is paid for.

Staging is the first moment the example count, the feature shape and each split's classes are
known; everything here would otherwise fail on the accelerator machine, after provisioning (40 s
locally, paid minutes on a cloud VM). Each failure is a DatasetError, so the job ends FAILED at
STAGING with the reason. Messages name class ids, never class names: those are the data's bytes.
"""

from __future__ import annotations

from typing import Any

from trainjobs.model_params import features_problem
from trainjobs.spec import JobSpec
from trainjobs.spec.derived import batch_fits_problem
from worker.staging.errors import DatasetError

# Fewer representative examples than this give int8 ranges from noise.
MIN_CALIBRATION_EXAMPLES = 16


def check_plan(spec: JobSpec, manifest: dict[str, Any]) -> None:
    problems = plan_problems(spec, manifest)
    if problems:
        raise DatasetError("the job does not fit its data: " + "; ".join(problems))


def plan_problems(spec: JobSpec, manifest: dict[str, Any]) -> list[str]:
    splits = manifest["splits"]
    train = int(splits["train"]["examples"])
    validation = splits.get("validation") or {"examples": 0}
    shape = [int(d) for d in manifest["feature"]["shape"]]
    problems = []

    if problem := batch_fits_problem(spec.global_batch_size, train):
        problems.append(problem)
    if spec.model is not None and spec.model.name is not None and (problem := features_problem(spec.model.name, shape)):
        problems.append(problem)

    # export.tflite's int8 conversion, else the tflite_int8 variant's (export.variants): both calibrate.
    tflite = spec.export.int8_calibration
    if tflite is not None:
        asked = tflite.calibration_examples
        if asked is not None and asked > train:
            problems.append(f"int8 calibration asks for {asked} examples, the training split has {train}; "
                            f"set export.tflite.calibration_examples to at most {train}")
        elif train < MIN_CALIBRATION_EXAMPLES:
            problems.append(f"int8 calibration needs at least {MIN_CALIBRATION_EXAMPLES} training examples, "
                            f"the training split has {train}")

    problems += _class_coverage(splits["train"].get("class_counts"), validation.get("class_counts"),
                                int(validation["examples"]))
    weights = spec.training.class_weight
    if isinstance(weights, dict):
        names = set(manifest.get("class_names") or [str(i) for i in range(int(manifest.get("num_classes", 0)))])
        # The names are the user's own spec text; which of them the data lacks is all that is said.
        if unknown := sorted(set(weights) - names):
            problems.append(f"training.class_weight names {len(unknown)} label(s) the data does not have "
                            f"(first: {unknown[0][:40]!r}); labels.json lists the {len(names)} it has")
    return problems


def _class_coverage(train: list[int] | None, validation: list[int] | None, validation_examples: int) -> list[str]:
    """A class the training split lacks cannot be learnt; one the validation split lacks is never scored."""
    if train is None:
        return []  # staged before splits counted their classes
    problems = []
    seen = [k for k, n in enumerate(train) if n] + [k for k, n in enumerate(validation or []) if n]
    if untrained := sorted({k for k in seen if not train[k]}):
        problems.append(f"class ids {_ids(untrained)} have no example in the training split")
    if validation is not None and validation_examples:
        if unscored := [k for k, n in enumerate(train) if n and not validation[k]]:
            problems.append(f"the validation split leaves out class ids {_ids(unscored)} (of {len(train)}); raise "
                            "dataset.options.validation_split, or set it to 0 to train without one")
    return problems


def _ids(ids: list[int], shown: int = 10) -> str:
    text = ", ".join(str(k) for k in ids[:shown])
    return text + (f" and {len(ids) - shown} more" if len(ids) > shown else "")
