"""spec.training: epochs, the batch, the optimizer and its learning rate, checkpoints. What follows from
them over the replicas a job gets (the global batch, the scaled learning rate) is derived in
trainjobs/spec/derived.py."""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from pydantic import Field, JsonValue, field_validator, model_validator
from pydantic.json_schema import JsonDict

from trainjobs.spec.strict import Int, Number, StrictModel, fail

MAX_GLOBAL_BATCH = 1_048_576


class EarlyStopping(StrictModel):
    monitor: str = Field(default="val_loss", max_length=64, description=(
        "the epoch metric watched: loss or one of the task's metrics, val_ for the validation split's"))
    patience: Int = Field(default=3, ge=0, le=10_000, description="epochs without improvement before stopping")
    min_delta: Number = Field(default=0.0, ge=0.0, le=1e9, description="the least change that counts as improvement")
    restore_best: bool = Field(default=True, description="end with the weights of the best epoch, not the last")


class Pruning(StrictModel):
    """Gradual magnitude pruning (issue 23): each prunable kernel's smallest weights held at zero by a
    mask, the masked share rising from 0 at begin_epoch to target_sparsity at end_epoch (agent/pruning.py)."""

    target_sparsity: Number = Field(gt=0.0, lt=1.0, description="the share of each pruned kernel that is zero at the end")
    begin_epoch: Int = Field(default=0, ge=0, le=10_000, description="epochs trained dense first (0: prune from the start)")
    end_epoch: Int | None = Field(default=None, ge=1, le=10_000, description=(
        "the epoch whose end reaches target_sparsity (default: two thirds of the way through training), "
        "after which the masks are fixed and the rest of training recovers"))
    schedule: Literal["polynomial", "constant"] = Field(default="polynomial", description=(
        "polynomial: the sparsity rises as 1 - (1 - t)^3 over [begin, end] (fast at first); constant: the "
        "target from begin_epoch on"))
    layers: Literal["dense", "conv", "all"] = Field(default="all", description=(
        "which kernels are pruned: Dense, convolutions, or both; the output layer never"))
    frequency_steps: Int = Field(default=100, ge=1, le=1_000_000, description="steps between updates of the masks")

    @model_validator(mode="after")
    def _window(self) -> Pruning:
        if self.end_epoch is not None and self.end_epoch <= self.begin_epoch:
            raise fail("end_epoch", f"end_epoch ({self.end_epoch}) must come after begin_epoch ({self.begin_epoch})")
        return self


class Distillation(StrictModel):
    """Knowledge distillation (issue 23): the student (this job's model) learns from an earlier job's
    exported model as well as from the labels (agent/distillation.py). The loss is
    alpha x the task's loss on the labels + (1 - alpha) x T^2 x KL(teacher || student), both
    distributions softened by the temperature T, as in Hinton et al. (2015) and keras.io's
    "Knowledge Distillation" example, whose alpha weighs the labels too."""

    teacher_job: str = Field(pattern=r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
                             description="the id of an earlier SUCCEEDED job of this project, trained by the managed "
                                         "trainer on the same task and classes: its SavedModel is the teacher")
    temperature: Number = Field(default=3.0, gt=0.0, le=100.0, description=(
        "softens both models' outputs before they are compared (1: as they are)"))
    alpha: Number = Field(default=0.5, ge=0.0, le=1.0, description=(
        "the weight of the labels' loss; the teacher's gets 1 - alpha (0: learn from the teacher alone)"))

    @field_validator("teacher_job")
    @classmethod
    def _canonical(cls, v: str) -> str:
        return v.lower()  # one spelling of a job id: the storage path and the row lookup agree


class ProfileWindow(StrictModel):
    """training.profile (issue 24): the steps a TensorFlow profiler trace covers (agent/profiling.py)."""

    epoch: Int | None = Field(default=None, ge=1, le=10_000, description=(
        "the epoch whose first steps are traced (default: the second, or the first when there is one)"))
    steps: Int = Field(default=20, ge=1, le=1000, description=(
        "steps traced, at least (whole executions of steps_per_execution), at most the epoch's"))


def _true_or_false_too(schema: JsonDict) -> None:
    """The API's schema shows what _profile_switch takes besides the window: true or false."""
    schema["anyOf"] = [{"type": "boolean"}, *cast(list[JsonValue], schema["anyOf"])]


class TrainingSpec(StrictModel):
    epochs: Int = Field(default=10, ge=1, le=10_000)
    per_replica_batch_size: Int | None = Field(default=None, ge=1, le=65_536)
    global_batch_size: Int | None = Field(default=None, ge=1, le=MAX_GLOBAL_BATCH)
    optimizer: Literal["adam", "adamw", "sgd", "rmsprop"] = "adam"
    learning_rate: Annotated[Number, Field(gt=0.0, le=10.0)] | Literal["auto"] = Field(default="auto", description=(
        "auto (the default): 0.001, or 0.003 on a small table (a training split of at most 10,000 rows of plain "
        "features), as runtime.notes says; lr_scaling scales either"))
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
    cache_dataset: bool | Literal["auto"] = Field(default="auto", description=(
        "auto: a training split whose parsed examples fit comfortably in memory is parsed once and held there, "
        "a larger one streamed from its shards every epoch; true: cached whatever its size; false: always streamed"))
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
    pruning: Pruning | None = Field(default=None, description=(
        "Gradual magnitude pruning: the exported models are the pruned ones (README, Smaller models)"))
    distillation: Distillation | None = Field(default=None, description=(
        "Learn from an earlier job's model as well as the labels (README, Smaller models)"))
    early_stopping: EarlyStopping | Literal["auto"] | None = Field(default="auto", description=(
        "Stop when the monitored metric has not improved for `patience` epochs; the job records the epoch and why. "
        "auto (the default): on a small table (a training split of at most 10,000 rows of plain features) with a "
        "validation split, val_loss with the best epoch's weights kept, as runtime.notes says; elsewhere none. "
        "true: the defaults below; false or null: never."))
    profile: ProfileWindow | None = Field(default=None, description=(
        "A TensorFlow profiler trace of a window of steps, in the job's TensorBoard directory: true for the "
        "default window (20 steps of the second epoch) or {epoch, steps}; false or absent: none (README, Profiling)"),
        json_schema_extra=_true_or_false_too)

    @field_validator("profile", mode="before")
    @classmethod
    def _profile_switch(cls, v: Any) -> Any:
        # true/false are the short forms; anything else but the window's object gets one reason.
        if v is True:
            return {}
        if v is False or v is None:
            return None
        if not isinstance(v, dict):
            raise fail("profile", "profile is true, false or {epoch, steps}")
        return v

    @field_validator("learning_rate", mode="before")
    @classmethod
    def _learning_rate(cls, v: Any) -> Any:
        # Before the number | 'auto' union, so a bad value gets one reason, not one per member.
        if v == "auto" or (isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= 10):
            return v
        raise fail("learning_rate", f"learning_rate is a number greater than 0 and at most 10, or 'auto', not {str(v)[:40]!r}")

    @field_validator("early_stopping", mode="before")
    @classmethod
    def _early_stopping_switch(cls, v: Any) -> Any:
        # true/false are the short forms; a stored spec from before `auto` holds null (none), and keeps it.
        if v is True:
            return {}
        if v is False or v is None:
            return None
        if v != "auto" and not isinstance(v, dict):
            raise fail("early_stopping", "early_stopping is 'auto', true, false or {monitor, patience, min_delta, "
                       "restore_best}")
        return v

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
        if self.pruning is not None:
            end = self.pruning.end_epoch
            if end is not None and end > self.epochs:
                raise fail("pruning.end_epoch", f"end_epoch {end} is after the last epoch ({self.epochs})")
            if self.pruning.begin_epoch >= self.epochs:
                raise fail("pruning.begin_epoch", f"begin_epoch {self.pruning.begin_epoch} leaves no epoch to prune "
                           f"in (training has {self.epochs})")
        if self.profile is not None and self.profile.epoch is not None and self.profile.epoch > self.epochs:
            raise fail("profile.epoch", f"epoch {self.profile.epoch} is after the last epoch ({self.epochs})")
        return self

    def profile_window(self) -> tuple[int, int] | None:
        """(epoch counted from 1, steps) of the profiler trace, or None; the agent caps the steps at the epoch's."""
        if self.profile is None:
            return None
        return self.profile.epoch or min(2, self.epochs), self.profile.steps

    def pruning_window(self) -> tuple[int, int]:
        """(begin, end) epochs of the pruning schedule: end defaults to two thirds of training."""
        assert self.pruning is not None
        begin = self.pruning.begin_epoch
        end = self.pruning.end_epoch or max(begin + 1, round(self.epochs * 2 / 3))
        return begin, min(end, self.epochs)


# The built-in models' kernels by kind (agent/builtin_models.py): what training.pruning.layers can find.
_BUILTIN_KERNELS = {"mlp": ("dense",), "cnn": ("conv", "dense"), "resnet": ("conv", "dense")}


def pruning_problem(training: TrainingSpec, model_name: str | None, program: bool) -> tuple[str, str] | None:
    """(field, reason) for pruning the job cannot do, as far as the spec shows; a user's own model is
    checked when the agent builds it, before training."""
    if training.pruning is None:
        return None
    if program:
        return "training.pruning", "a program prunes its own model: training.pruning is the managed trainer's"
    layers = training.pruning.layers
    kinds = _BUILTIN_KERNELS.get(model_name or "", ("conv", "dense"))  # keras.applications: convolutions
    if layers != "all" and layers not in kinds:
        return ("training.pruning.layers", f"model {model_name} has no {layers} layers to prune (it has "
                f"{' and '.join(kinds)}; the output layer is never pruned)")
    return None


def profile_problem(training: TrainingSpec, program: bool) -> tuple[str, str] | None:
    """(field, reason) for a profile the job cannot take: the managed trainer's loop opens the window."""
    if training.profile is not None and program:
        return "training.profile", ("a program runs its own loop: call tf.profiler.experimental.start/stop in "
                                    "it; training.profile is the managed trainer's")
    return None


# Tasks whose outputs are probabilities a temperature can soften: a softmax, or a sigmoid per label.
DISTILLED_TASKS = ("classification", "binary", "multilabel")


def distillation_problem(training: TrainingSpec, task: str, program: bool) -> tuple[str, str] | None:
    """(field, reason) for distillation the job cannot do, as far as the spec shows; the teacher job itself
    is checked against the project's jobs at submit and again at staging (service/db/teachers.py)."""
    if training.distillation is None:
        return None
    if program:
        return "training.distillation", "a program trains its own way: training.distillation is the managed trainer's"
    if task not in DISTILLED_TASKS:
        return ("training.distillation", f"distillation softens class probabilities, which task {task} has none "
                f"of (it is for {', '.join(DISTILLED_TASKS)})")
    if training.class_weight is not None:
        return ("training.class_weight", "class_weight weighs the labels' loss alone, not the teacher's: with "
                "distillation, weigh the labels with alpha instead")
    return None
