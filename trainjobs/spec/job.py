"""The job spec as a whole: its sections, the rules that read several of them, its version, and how a
stored spec is read back.

At submit (the API, the CLI's dry run) every rule applies and the spec is stamped with `SPEC_VERSION`,
the rules it was accepted under. A stored spec (the worker's driver, the agent's spec.json) is read with
`parse_stored`, without the submit-only rules (trainjobs/spec/strict.py says why).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from trainjobs.spec.accelerator import Accelerator, CpuAccelerator
from trainjobs.spec.dataset import DatasetSpec
from trainjobs.spec.derived import global_batch_size, num_replicas, replicas_per_worker, resolve_strategy
from trainjobs.spec.distribution import Precision, Strategy, check_consistency
from trainjobs.spec.export import ExportSpec, variants_problem
from trainjobs.spec.labels import labels_problem
from trainjobs.spec.limits import LimitsSpec
from trainjobs.spec.model import ModelSpec
from trainjobs.spec.program import ProgramSpec
from trainjobs.spec.strict import STORED, Int, StrictModel, fail, submitting
from trainjobs.spec.task import Task, task_problem
from trainjobs.spec.training import TrainingSpec, distillation_problem, profile_problem, pruning_problem

# The spec rules a stored job was accepted under. 1: every job stored before versions were written;
# 2: built-in models' params checked at submit; 3: `program` jobs (the user's own code), `model` and
# `dataset` optional beside it.
SPEC_VERSION = 3


class JobSpec(StrictModel):
    name: str = Field(default="job", pattern=r"^[A-Za-z0-9][A-Za-z0-9._ -]{0,127}$")
    accelerator: Accelerator = CpuAccelerator(type="cpu")
    workers: Int = Field(default=1, ge=1, le=64, description="hosts training together")
    strategy: Strategy = "auto"
    precision: Precision = "auto"
    steps_per_execution: Int | Literal["auto"] = "auto"
    jit_compile: bool | Literal["auto"] = Field(default="auto", description=(
        "XLA for the training and validation steps: true, false, or auto (tried on a GPU on the first steps of the "
        "first epoch where the model compiles under it, and kept if faster; off on a CPU, where it was slower)"))
    task: Task = Field(default="classification", description=(
        "What the labels are: classification (one class per example), binary (two label values: one "
        "sigmoid output) or regression (a numeric target)."))
    dataset: DatasetSpec | None = Field(default=None, description="The data: required with `model`; with "
                                        "`program`, staged and handed to it if given.")
    model: ModelSpec | None = Field(default=None, description="Our trainer's model; or give `program`.")
    program: ProgramSpec | None = Field(default=None, description="Your own training program; or give `model`.")
    training: TrainingSpec = TrainingSpec()
    export: ExportSpec = ExportSpec()
    limits: LimitsSpec = LimitsSpec()
    labels: dict[str, str] = Field(default_factory=dict)
    spec_version: Int = Field(default=SPEC_VERSION, ge=1, le=SPEC_VERSION,
                              description="The spec rules the job was accepted under; the API writes it at submit.")

    @model_validator(mode="before")
    @classmethod
    def _stamp_version(cls, data: Any, info: ValidationInfo) -> Any:
        """A submitted spec is checked by today's rules, so it says so, whatever version it was copied from."""
        if submitting(info) and isinstance(data, dict) and "spec_version" in data:
            return {**data, "spec_version": SPEC_VERSION}
        return data

    @field_validator("steps_per_execution", mode="before")
    @classmethod
    def _spe_not_bool(cls, v: Any) -> Any:
        # Python counts True as the integer 1, and the int | 'auto' union would take it as one.
        if isinstance(v, bool):
            raise fail("steps_per_execution", "steps_per_execution is an integer or 'auto', not true/false")
        return v

    @field_validator("jit_compile", mode="before")
    @classmethod
    def _jit_choice(cls, v: Any) -> Any:
        # Before the bool | 'auto' union, which would take "yes" or 1 as true and name its members in the error.
        if not isinstance(v, bool) and v != "auto":
            raise fail("jit_compile", f"jit_compile is true, false or 'auto', not {v!r}")
        return v

    @field_validator("steps_per_execution")
    @classmethod
    def _spe_range(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 10_000:
            raise fail("steps_per_execution", "steps_per_execution must be between 1 and 10000, or 'auto'")
        return v

    @field_validator("labels")
    @classmethod
    def _gcp_labels(cls, v: dict[str, str]) -> dict[str, str]:
        if problem := labels_problem(v):
            raise fail("labels", problem)
        return v

    @model_validator(mode="after")
    def _one_kind_of_work(self) -> JobSpec:
        if self.model is not None and self.program is not None:
            raise fail("program", "give model (the managed trainer) or program (your own code), not both")
        if self.model is None and self.program is None:
            raise fail("model", "give model (the managed trainer: a built-in, keras.applications or your "
                                "build_model module) or program (your own training script)")
        if self.model is not None and self.dataset is None:
            raise fail("dataset", "the managed trainer (model) trains on a dataset: give dataset.source")
        return self

    @property
    def is_program(self) -> bool:
        return self.program is not None

    @property
    def code(self) -> tuple[str, str] | None:
        """(field, URI) of the user's code the job runs, if it runs any: model.module or program.source."""
        if self.program is not None:
            return "program.source", self.program.source
        if self.model is not None and self.model.module is not None:
            return "model.module", self.model.module
        return None

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        check_consistency(self)
        if problem := task_problem(self):
            raise fail(*problem)
        if problem := pruning_problem(self.training, self.model.name if self.model else None, self.program is not None):
            raise fail(*problem)
        if problem := distillation_problem(self.training, self.task, self.program is not None):
            raise fail(*problem)
        if problem := profile_problem(self.training, self.program is not None):
            raise fail(*problem)
        if problem := variants_problem(self):
            raise fail(*problem)
        return self

    # Shortcuts to the facts trainjobs/spec/derived.py computes, for the spec's readers.

    @property
    def resolved_strategy(self) -> str:
        return resolve_strategy(self)

    @property
    def replicas_per_worker(self) -> int:
        return replicas_per_worker(self)

    @property
    def num_replicas(self) -> int:
        return num_replicas(self)

    @property
    def global_batch_size(self) -> int:
        """The global batch over the replicas the spec asks for (the agent's may differ: agent/plan.py)."""
        return global_batch_size(self.training, self.num_replicas)


def parse_stored(raw: dict[str, Any]) -> JobSpec:
    """A spec as stored by any release: without today's submit-only rules, and a spec stored before versions
    were written is version 1."""
    return JobSpec.model_validate({"spec_version": 1, **raw}, context=STORED)
