"""spec.training: epochs, the batch, the optimizer and its learning rate, checkpoints. What follows from
them over the replicas a job gets (the global batch, the scaled learning rate) is derived in
trainjobs/spec/derived.py."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from trainjobs.spec.strict import Int, Number, StrictModel, fail

MAX_GLOBAL_BATCH = 1_048_576


class EarlyStopping(StrictModel):
    monitor: str = Field(default="val_loss", max_length=64, description=(
        "the epoch metric watched: loss or one of the task's metrics, val_ for the validation split's"))
    patience: Int = Field(default=3, ge=0, le=10_000, description="epochs without improvement before stopping")
    min_delta: Number = Field(default=0.0, ge=0.0, le=1e9, description="the least change that counts as improvement")
    restore_best: bool = Field(default=True, description="end with the weights of the best epoch, not the last")


class TrainingSpec(StrictModel):
    epochs: Int = Field(default=10, ge=1, le=10_000)
    per_replica_batch_size: Int | None = Field(default=None, ge=1, le=65_536)
    global_batch_size: Int | None = Field(default=None, ge=1, le=MAX_GLOBAL_BATCH)
    optimizer: Literal["adam", "adamw", "sgd", "rmsprop"] = "adam"
    learning_rate: Number = Field(default=1e-3, gt=0.0, le=10.0)
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"
    lr_base_batch_size: Int = Field(default=256, ge=1, le=MAX_GLOBAL_BATCH, description="batch the learning rate was tuned for")
    warmup_epochs: Number = Field(default=0.0, ge=0.0, le=1000.0)
    seed: Int = Field(default=0, ge=0, le=2**31 - 1)
    checkpoint_every_epochs: Int = Field(default=1, ge=1, le=10_000)
    checkpoint_every_steps: Int | None = Field(
        default=None, ge=1, le=100_000_000,
        description="Also checkpoint every this many optimizer steps, counted over the whole job, so a restarted "
        "job resumes mid-epoch. A save happens between calls of the train function: with steps_per_execution > 1, "
        "at the end of the first call that reaches each multiple. Combines with checkpoint_every_epochs.",
    )
    cache_dataset: bool = False
    loss: str | None = Field(default=None, max_length=64, description=(
        "The Keras loss, by name, among those of the job's task (README, Tasks); default the task's first"))
    metrics: list[Annotated[str, Field(min_length=1, max_length=64)]] | None = Field(
        default=None, min_length=1, max_length=8, description=(
            "The metrics each epoch reports (and val_ on the validation split), by name, among those of the "
            "job's task (README, Tasks); default the task's own set"))
    class_weight: str | dict[str, float] | None = Field(
        default=None, description=("Weigh each class's examples in the loss: 'balanced' (n / (classes x the "
                                   "class's count) over the training split) or {label: weight} by the labels' "
                                   "names in labels.json (unnamed labels weigh 1)."))
    early_stopping: EarlyStopping | None = Field(default=None, description=(
        "Stop when the monitored metric has not improved for `patience` epochs; the job records the epoch and why."))

    # Checked before the union is tried, so a bad value gets one reason, not one per union member.
    @field_validator("class_weight", mode="before")
    @classmethod
    def _class_weight(cls, v: Any) -> Any:
        if v is None or v == "balanced":
            return v
        if not isinstance(v, dict):
            raise fail("class_weight", "class_weight is 'balanced' or {label: weight}")
        for name, weight in v.items():
            if not isinstance(name, str) or not 1 <= len(name) <= 256:
                raise fail("class_weight", "a class_weight key is a label's name as labels.json has it (1 to 256 characters)")
            if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight <= 1e6:
                raise fail("class_weight", f"the weight of {name[:40]!r} must be a number greater than 0 (at most 1e6)")
        return v

    @field_validator("metrics")
    @classmethod
    def _distinct_metrics(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and len(set(v)) != len(v):
            raise fail("metrics", "a metric is named twice")
        return v

    @model_validator(mode="after")
    def _one_batch(self) -> TrainingSpec:
        if self.per_replica_batch_size is not None and self.global_batch_size is not None:
            raise fail("global_batch_size", "give per_replica_batch_size or global_batch_size, not both")
        if self.warmup_epochs > self.epochs:
            raise fail("warmup_epochs", f"warmup of {self.warmup_epochs} epochs is longer than training ({self.epochs})")
        return self
