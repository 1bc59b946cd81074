"""spec of a sweep (issue 22): many jobs from one job spec, searched by Optuna in the worker.

    job: {...}                              a whole job spec (managed trainer or program)
    parameters:                             dotted paths into the job spec
      training.learning_rate: {type: float, low: 1e-4, high: 1e-1, log: true}
      training.global_batch_size: {type: int, low: 32, high: 256, step: 32}
      precision: {type: categorical, choices: [float32, mixed_bfloat16]}
    objective: {metric: val_accuracy, goal: maximize}
    algorithm: tpe | random | grid
    max_trials: 24
    parallel_trials: 4
    early_stopping: {type: median | hyperband, min_epochs: 2}
    limits: {max_cost_usd: 50}

Every trial's spec is checked at submit, at a cost bounded whatever the body holds (issue 36, 1: a
29 KB sweep checked by 2,048 whole-spec validations held the API 30-40 s). The job, and the job with
every parameter at its first value, are validated whole once each. Then each parameter's values (every value of an
int or stepped range up to MAX_CHECKED_VALUES of them, else its ends and middle; every choice) are put
into that validated spec one at a time and checked against the field they set and the rules above it
(trainjobs/spec/trial_check.py); the first refusal is a 422 naming `parameters.<path>` and the value.
Those checks re-validate at most CHECK_BUDGET_BYTES of fields in all: a parameter whose values land in a
large field (a big model.params or program.env) past that budget is checked at its ends and middle, or
at its first value only once the budget is spent; the engine checks every trial it draws as it submits it. Values that are fine alone but not together
(a batch that does not divide over the replicas another parameter sets) are caught by whole-spec
validations of the parameters crossed: every combination when there are at most MAX_CHECKED_CROSSINGS,
else every parameter at its middle, and at its last, value. In all, a submit makes at most 2 +
MAX_CHECKED_CROSSINGS + MAX_RECHECKS whole-spec validations.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from trainjobs.spec.job import JobSpec
from trainjobs.spec.labels import MAX_LABELS
from trainjobs.spec.strict import Int, Number, StrictModel, fail
from trainjobs.spec.task import HIGHER_IS_BETTER, epoch_names
from trainjobs.spec.trial_check import TrialCheck, set_at

MAX_PARAMETERS = 32
MAX_CHOICES = 64
MAX_GRID = 10_000  # a grid's combinations
MAX_CHECKED_VALUES = 64  # an int or stepped range's values checked one by one at submit
MAX_CHECKED_CROSSINGS = 8  # whole specs checked with the parameters' values crossed
# Bytes of fields validated again by one sweep's value checks, and what a check costs beyond its field's
# bytes (the sections above it run their rules again): some 20 ms of checks.
CHECK_BUDGET_BYTES = 1 << 20
CHECK_COST_BYTES = 256
# Validation context: a function shown (path, value, trial spec) of each trial checked, in the same pass
# (the API admits each as the deployment would: service/db/admission.py). What it raises, other than a
# ValueError, leaves the validation as it is.
ADMIT_TRIAL = "admit_trial"
MAX_RECHECKS = 4  # whole-spec validations of a value the quick check refused, to say why as the job would
TRIAL_LABELS = ("sweep", "trial")  # the labels the sweep engine sets on each trial's job (worker/sweeps.py)

Scalar = str | int | float | bool | None


class FloatParameter(StrictModel):
    type: Literal["float"]
    low: Number
    high: Number
    log: bool = False
    step: Number | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _range(self) -> FloatParameter:
        if self.low > self.high:
            raise fail("low", f"low ({self.low:g}) is above high ({self.high:g})")
        if self.log and self.low <= 0:
            raise fail("low", "a log range starts above 0")
        if self.log and self.step is not None:
            raise fail("step", "a log range has no step (Optuna samples it continuously)")
        return self

    def count(self) -> int | None:
        """How many values a stepped range has; None for a continuous one."""
        return None if self.step is None else int(math.floor((self.high - self.low) / self.step + 1e-9)) + 1

    def values(self) -> list[float] | None:
        """Every value, for a stepped range; None for a continuous one."""
        if (n := self.count()) is None or self.step is None:
            return None
        return [round(self.low + i * self.step, 12) for i in range(n)]

    def probes(self) -> list[float]:
        if (n := self.count()) is not None and n <= MAX_CHECKED_VALUES:
            return self.values() or []
        middle = math.sqrt(self.low * self.high) if self.log else (self.low + self.high) / 2
        return sorted({self.low, middle, self.high})


class IntParameter(StrictModel):
    type: Literal["int"]
    low: Int
    high: Int
    step: Int = Field(default=1, ge=1)
    log: bool = False

    @model_validator(mode="after")
    def _range(self) -> IntParameter:
        if self.low > self.high:
            raise fail("low", f"low ({self.low}) is above high ({self.high})")
        if self.log and (self.low <= 0 or self.step != 1):
            raise fail("log", "a log range of integers starts above 0 and has step 1")
        return self

    def count(self) -> int:
        return (self.high - self.low) // self.step + 1

    def values(self) -> list[int]:
        return list(range(self.low, self.high + 1, self.step))

    def probes(self) -> list[int]:
        count = (self.high - self.low) // self.step + 1
        if count <= MAX_CHECKED_VALUES:
            return self.values()
        return sorted({self.low, self.low + (count // 2) * self.step, self.low + (count - 1) * self.step})


class CategoricalParameter(StrictModel):
    type: Literal["categorical"]
    choices: list[Scalar] = Field(min_length=1, max_length=MAX_CHOICES)

    @field_validator("choices")
    @classmethod
    def _distinct(cls, v: list[Scalar]) -> list[Scalar]:
        if len({repr(c) for c in v}) != len(v):
            raise fail("choices", "a choice is listed twice")
        return v

    def count(self) -> int:
        return len(self.choices)

    def values(self) -> list[Scalar]:
        return list(self.choices)

    def probes(self) -> list[Scalar]:
        return list(self.choices)


Parameter = Annotated[FloatParameter | IntParameter | CategoricalParameter, Field(discriminator="type")]


class Objective(StrictModel):
    metric: str = Field(min_length=1, max_length=64, description="a metric the trials report each epoch (val_ for "
                        "the validation split's), as in the job's metrics")
    goal: Literal["maximize", "minimize"] | None = Field(default=None, description=(
        "default: maximize for accuracy, auc, precision, recall, f1 and r2 (and their val_), minimize for the rest"))

    @property
    def direction(self) -> str:
        if self.goal is not None:
            return self.goal
        return "maximize" if self.metric.removeprefix("val_") in HIGHER_IS_BETTER else "minimize"


class SweepEarlyStopping(StrictModel):
    type: Literal["median", "hyperband"]
    min_epochs: Int = Field(default=1, ge=0, le=10_000, description=(
        "epochs every trial trains before it may be stopped (median: Optuna's n_warmup_steps; hyperband: "
        "its min_resource)"))


class SweepLimits(StrictModel):
    max_cost_usd: Number | None = Field(default=None, gt=0, le=1_000_000, description=(
        "the sum over the sweep's trials: each trial is given at most what is left as its own max_cost_usd"))


class SweepSpec(StrictModel):
    name: str = Field(default="sweep", pattern=r"^[A-Za-z0-9][A-Za-z0-9._ -]{0,100}$")
    job: dict[str, Any] = Field(description="a whole job spec, which every trial starts from")
    parameters: dict[str, Parameter] = Field(min_length=1, max_length=MAX_PARAMETERS)
    objective: Objective
    algorithm: Literal["tpe", "random", "grid"] = "tpe"
    max_trials: Int | None = Field(default=None, ge=1, le=1000, description=(
        "default 24; a grid's combinations (at most that many run)"))
    parallel_trials: Int = Field(default=4, ge=1, le=64)
    early_stopping: SweepEarlyStopping | None = None
    limits: SweepLimits = SweepLimits()
    seed: Int = Field(default=0, ge=0, le=2**31 - 1, description="the sampler's seed")

    @field_validator("parameters")
    @classmethod
    def _paths(cls, v: dict[str, Any]) -> dict[str, Any]:
        for path in v:
            parts = path.split(".")
            if not all(parts) or len(parts) > 8 or len(path) > 200:
                raise fail(path, "a parameter is a dotted path into the job spec, like training.learning_rate")
            if parts[0] in ("name", "labels", "spec_version"):
                raise fail(path, f"{parts[0]} is the sweep's to set on each trial, not a parameter")
            # One inside another would be set or not by the order the paths are applied in, which a trial's
            # params read back from the database (JSONB orders keys by length) do not keep.
            if inner := next((p for p in v if p.startswith(f"{path}.")), None):
                raise fail(path, f"{inner} is inside it: a parameter sets a field, not one inside another parameter")
        return v

    @model_validator(mode="after")
    def _trials_valid(self, info: ValidationInfo) -> SweepSpec:
        base = _validated(self.job, "job")
        if len(base.labels.keys() - TRIAL_LABELS) + len(TRIAL_LABELS) > MAX_LABELS:  # else every trial is refused
            raise fail("job.labels", f"at most {MAX_LABELS - len(TRIAL_LABELS)} labels: each trial adds its own "
                       f"{' and '.join(TRIAL_LABELS)}")
        if self.algorithm == "grid":
            for path, p in self.parameters.items():
                if isinstance(p, FloatParameter) and p.step is None:
                    raise fail(f"parameters.{path}", "a grid needs every value: give a float range a step")
            if self.grid_size() > MAX_GRID:
                raise fail("parameters", f"the grid has {self.grid_size()} combinations, over the limit of {MAX_GRID}")
        admit = info.context.get(ADMIT_TRIAL) if isinstance(info.context, dict) else None
        for path, value, trial in self.probed_trials():  # a value that makes no valid job raises the 422
            if admit is not None:
                admit(path, value, trial)
        probes = [p.probes() for p in self.parameters.values()]
        if math.prod(len(values) for values in probes) <= MAX_CHECKED_CROSSINGS:
            crossings = list(itertools.product(*probes))
        else:
            crossings = [tuple(values[len(values) // 2] for values in probes), tuple(values[-1] for values in probes)]
        for combination in crossings:
            params = dict(zip(self.parameters, combination, strict=True))
            try:
                whole_check(trial_spec(self.job, params))
            except ValidationError as exc:
                raise fail("parameters", f"the trial {params} is not a valid job: {first_reason(exc)}") from None
        if base.model is not None and base.program is None:
            names = epoch_names(base.task, base.training.metrics)
            if self.objective.metric not in names:
                raise fail("objective.metric", f"{self.objective.metric!r} is not a metric the trials report: one of "
                           f"{', '.join(names)}")
        return self

    def probed_trials(self) -> Iterator[tuple[str, Scalar, JobSpec]]:
        """(path, value, the trial's spec) for each value checked at submit (the module's docstring says
        which): the job with every other parameter at its first value and this one at `value`. A value
        that makes no valid job raises the 422 naming `parameters.<path>`."""
        firsts = {path: p.probes()[0] for path, p in self.parameters.items()}
        first_path = next(iter(firsts))
        raw = trial_spec(self.job, firsts)
        check = TrialCheck(raw, _validated(raw, f"parameters.{first_path}", firsts[first_path]))
        yield first_path, firsts[first_path], check.spec
        budget, rechecks = CHECK_BUDGET_BYTES, 0
        for path, p in self.parameters.items():
            each, values = CHECK_COST_BYTES + check.field_bytes(path), p.probes()
            if len(values) * each > budget:  # its ends and middle, else only its first (checked above)
                values = [values[i] for i in sorted({0, len(values) // 2, len(values) - 1})] if 3 * each <= budget else []
            budget -= len(values) * each
            for value in values:
                try:
                    trial = check.with_value(path, value)
                except (ValidationError, ValueError) as exc:
                    rechecks += 1
                    if rechecks > MAX_RECHECKS:
                        reason = first_reason(exc) if isinstance(exc, ValidationError) else str(exc)
                        raise fail(f"parameters.{path}", f"a trial is not a valid job spec (at {value!r}): "
                                   f"{reason}") from None
                    # Said as a whole-spec validation says it, the field named as in the job; a value
                    # this check refused and the whole spec takes (none known) is taken.
                    trial = _validated(trial_spec(self.job, {**firsts, path: value}), f"parameters.{path}", value)
                yield path, value, trial

    def grid_size(self) -> int:
        return math.prod(p.count() or 0 for p in self.parameters.values())

    @property
    def trials(self) -> int:
        """How many trials the sweep runs at most."""
        if self.algorithm == "grid":
            return min(self.max_trials or self.grid_size(), self.grid_size())
        return self.max_trials or 24


def trial_spec(job: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The job spec with each parameter's value at its dotted path (missing sections made)."""
    spec: dict[str, Any] = copy.deepcopy(job)
    for path, value in params.items():
        set_at(spec, path.split("."), value)
    return spec


def whole_check(spec: dict[str, Any]) -> JobSpec:
    """The spec validated whole, as a submitted job is: what a sweep's submit does a few times at most."""
    return JobSpec.model_validate(spec)


def first_reason(exc: ValidationError) -> str:
    from trainjobs.spec.errors import describe_errors

    first = describe_errors([dict(e) for e in exc.errors(include_url=False)])[0]
    return f"{first['field']}: {first['reason']}"


def _validated(spec: dict[str, Any], field: str, value: Any = None) -> JobSpec:
    at = "" if value is None else f" (at {value!r})"
    try:
        return whole_check(spec)
    except ValidationError as exc:
        raise fail(field, f"{'the job' if value is None else 'a trial'} is not a valid job spec{at}: "
                   f"{first_reason(exc)}") from None
    except ValueError as exc:
        raise fail(field, f"{exc}{at}") from None
