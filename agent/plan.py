"""The runtime plan: what the spec asked for, resolved against the machine the agent landed on.

Pure: imports neither TensorFlow nor Keras, so the rules are tested without starting either. The
strategy object itself is built in `devices.py`; this module decides its name and everything that
follows from the replica count it reports. The rules themselves (the default batch, its split over the
replicas, the batch against the data, learning-rate scaling, `precision: auto`) are the ones the API,
staging and the dry run apply to the replicas the spec asks for: trainjobs/spec/derived.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from trainjobs.spec import JobSpec, TpuAccelerator
from trainjobs.spec.derived import (
    AUTO_STEPS_PER_EXECUTION, DEFAULT_LEARNING_RATE, batch_fits_problem, batch_split_problem, global_batch_size, resolve_precision,
    scaled_learning_rate,
)
from agent.small_tables import TableDefaults

HardwareKind = Literal["tpu", "gpu", "cpu"]

# `steps_per_execution: auto` per hardware kind: trainjobs/spec/derived.py, which the advisor reads too.


class PlanError(Exception):
    """The spec cannot run on this machine as asked; the message says why."""


@dataclass(frozen=True)
class Hardware:
    """What the agent trains on. A local stand-in reports the requested kind over logical CPUs."""

    kind: HardwareKind
    devices: int  # accelerators on this host (logical CPU devices on a stand-in)
    gpu_compute_capability: float | None = None
    local_devices: int | None = None  # TRAINJOBS_LOCAL_DEVICES, when this machine only stands in
    cpu_bfloat16: str | None = None  # a CPU's bfloat16 instructions (devices.cpu_bfloat16), if it has them


@dataclass(frozen=True)
class TrainingPosition:
    """Where training stands: `epoch` epochs done, then `step` steps into the next one."""

    epoch: int = 0
    step: int = 0
    # Training steps since the job began, over every attempt: the optimizer's iterations, except
    # that a step float16 loss scaling skips (non-finite gradients) counts here and not there.
    global_step: int = 0


@dataclass(frozen=True)
class RuntimePlan:
    strategy: str  # the tf.distribute strategy actually built
    requested_strategy: str  # spec.resolved_strategy
    hardware: str
    local_devices: int | None
    workers: int
    replicas: int
    precision: str
    global_batch_size: int
    per_replica_batch_size: int
    steps_per_epoch: int
    steps_per_execution: int
    learning_rate: float  # after scaling, the rate reached at the end of warmup
    warmup_steps: int
    epochs: int
    initial_epoch: int = 0  # epochs a checkpoint already holds
    initial_step: int = 0  # steps of the next epoch it holds too (a mid-epoch checkpoint)
    initial_global_step: int = 0
    static_shapes: bool = False  # TPU: every batch must have the same shape, eval included
    jit_compile: bool | None = None  # what Keras resolved at compile time
    loss_scaling: bool | None = None  # whether Keras wrapped the optimizer in a LossScaleOptimizer
    notes: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        return d

    @property
    def start(self) -> TrainingPosition:
        return TrainingPosition(self.initial_epoch, self.initial_step, self.initial_global_step)


def requested_kind(spec: JobSpec) -> HardwareKind:
    return spec.accelerator.type


def strategy_to_build(spec: JobSpec, hardware: Hardware) -> str:
    """The strategy name to construct. A stand-in has no TPU, so a TPU job mirrors over its devices."""
    wanted = spec.resolved_strategy
    if hardware.local_devices is not None and wanted == "tpu":
        return "mirrored"
    return wanted


def resolve_plan(spec: JobSpec, hardware: Hardware, strategy: str, replicas: int, train_examples: int,
                 initial_epoch: int = 0, table: TableDefaults = TableDefaults()) -> RuntimePlan:
    """Everything that depends on the replica count the built strategy reports. `table`: what a small
    table gets where the spec leaves it unset, and the notes that say so (agent/small_tables.py)."""
    t = spec.training
    notes: list[str] = list(table.notes)
    if hardware.local_devices is not None and strategy != spec.resolved_strategy:
        notes.append(f"local stand-in: {spec.resolved_strategy} trains as {strategy} over "
                     f"{hardware.local_devices} logical CPU devices")
    if replicas != spec.num_replicas:
        notes.append(f"{spec.num_replicas} replicas asked for, {replicas} on this machine")

    per_replica = table.per_replica_batch_size
    global_batch = per_replica * replicas if per_replica is not None else global_batch_size(t, replicas)
    if problem := batch_split_problem(global_batch, replicas):
        raise PlanError(f"{problem} (the replicas this machine has)")
    if problem := batch_fits_problem(global_batch, train_examples):
        raise PlanError(problem)
    steps = train_examples // global_batch

    # One call cannot cross an epoch boundary (callbacks, validation and checkpoints run there).
    if spec.steps_per_execution == "auto":
        spe = min(steps, AUTO_STEPS_PER_EXECUTION[hardware.kind])
    else:
        spe = min(steps, spec.steps_per_execution)
        if spe < spec.steps_per_execution:
            notes.append(f"steps_per_execution {spec.steps_per_execution} -> {spe}: an epoch of this dataset "
                         f"at global batch {global_batch} has only {steps} steps")
    # An epoch that is not a whole number of executions ends with a shorter call
    # (step_functions.CountingTrainFunction): every epoch runs all of its steps.

    return RuntimePlan(
        strategy=strategy,
        requested_strategy=spec.resolved_strategy,
        hardware=hardware.kind,
        local_devices=hardware.local_devices,
        workers=spec.workers,
        replicas=replicas,
        precision=resolve_precision(spec.precision, hardware.kind, hardware.gpu_compute_capability),
        global_batch_size=global_batch,
        per_replica_batch_size=global_batch // replicas,
        steps_per_epoch=steps,
        steps_per_execution=spe,
        learning_rate=scaled_learning_rate(t, global_batch, table.learning_rate or DEFAULT_LEARNING_RATE),
        warmup_steps=round(t.warmup_epochs * steps),
        epochs=t.epochs,
        initial_epoch=initial_epoch,
        static_shapes=isinstance(spec.accelerator, TpuAccelerator) and hardware.local_devices is None,
        notes=tuple(notes),
    )


def resume_from(plan: RuntimePlan, saved: TrainingPosition) -> RuntimePlan:
    """The plan continued from a checkpoint taken at `saved`.

    A mid-epoch checkpoint resumes mid-epoch: training first runs the rest of that epoch, so the
    job still trains `epochs` epochs of `steps_per_epoch` steps. A checkpoint saved under a plan
    with longer epochs (another replica count) can lie past this plan's last step; it resumes at
    that last step, so at least one step of the epoch is left to run.
    """
    if saved.epoch >= plan.epochs:
        return replace(plan, initial_epoch=plan.epochs, initial_global_step=saved.global_step)
    step = min(saved.step, plan.steps_per_epoch - 1)
    notes = plan.notes
    if step != saved.step:
        notes += (f"checkpoint at step {saved.step} of epoch {saved.epoch + 1} resumes at step {step}: "
                  f"this plan's epochs have {plan.steps_per_epoch} steps",)
    return replace(plan, initial_epoch=saved.epoch, initial_step=step, initial_global_step=saved.global_step,
                   notes=notes)
