"""The advisor (issue 24): what a job's own numbers say would make it faster or cheaper.

Each rule reads typed facts about one job (its spec, the plan the agent resolved, its epochs, its
machines' time: trainjobs/advice_facts.py builds them from the row) and gives at most one `Advice`:
the numbers that triggered it, the spec field to change and to what, and a gain bounded by those
numbers, with its basis. A rule without its numbers stays silent. Thresholds are the named constants
below; the hardware facts and prices are the catalogue's (trainjobs/catalogue.py, spec/derived.py).

Pure: no I/O, no clock. The worker computes advice as a job progresses and when it ends
(worker/advising.py); the API, `trainjobs status` and the dashboard show what it stored.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trainjobs.catalogue import GPU_TYPES, TPU_GENERATIONS
from trainjobs.spec import CpuAccelerator, GpuAccelerator, JobSpec, TpuAccelerator
from trainjobs.spec.derived import AUTO_STEPS_PER_EXECUTION, hourly_price_usd, resolve_precision, spot_hourly_price_usd

Number = int | float

# --- thresholds -----------------------------------------------------------------------------------------

# input_bound: the median share of step time spent waiting on the input pipeline, from which the
# accelerator is waiting more than a quarter of the time.
INPUT_BOUND_WAIT_FRACTION = 0.25
# The shards agent/data.py reads at once (its interleave's cycle_length): fewer shards, fewer parallel reads.
PARALLEL_READS = 8

# dispatch_bound: with the agent's step-time split, the host's share of a step (Keras' loop, callbacks,
# one dispatch per call) from which raising steps_per_execution pays; without it, a step this short
# at one step per call is taken as mostly dispatch (the fallback says so in its evidence).
DISPATCH_HOST_SHARE = 0.3
DISPATCH_SMALL_STEP_MS = 20.0
# What dispatch_bound suggests: the TPU `auto` value, the most any hardware kind gets by default.
DISPATCH_STEPS_PER_EXECUTION = AUTO_STEPS_PER_EXECUTION["tpu"]

# small_batch: the per-replica batch below which an accelerator's matrix units are mostly idle: a TPU
# core's MXU is 128x128 (Cloud TPU performance guide: per-core batches in multiples of 128), a GPU's
# tensor cores want a few dozen rows at least. The suggestion keeps an epoch at SMALL_BATCH_MIN_STEPS
# steps or more.
SMALL_BATCH_PER_REPLICA = {"tpu": 128, "gpu": 64}
SMALL_BATCH_MIN_STEPS = 16

# steps_per_execution_capped: the share of an epoch's time outside its training steps (validation,
# checkpoints, callbacks) from which short epochs are worth a suggestion.
CAPPED_OVERHEAD_SHARE = 0.3
CAPPED_CHECKPOINT_EVERY_FACTOR = 5  # what it suggests: checkpoints this many times rarer, within the epochs

# oversized_machine: an epoch this short (steps over every replica) says the data is spread too thin:
# fewer replicas would run the same epoch in more, fuller steps on a cheaper machine.
OVERSIZED_STEPS_PER_EPOCH = 16


# --- what goes in and what comes out ---------------------------------------------------------------------


@dataclass(frozen=True)
class Advice:
    rule: str
    evidence: dict[str, Number | str]  # the numbers that triggered it
    suggestion: str  # the spec field to change and to what
    expected_gain: str  # a bound computed from the evidence, with its basis

    def as_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "evidence": dict(self.evidence), "suggestion": self.suggestion,
                "expected_gain": self.expected_gain}


@dataclass(frozen=True)
class Epoch:
    """One history entry (agent/train.py EpochRecorder); the optional fields only from agents that report them."""

    epoch: int
    attempt: int
    examples_per_sec: float
    step_time_ms: float
    input_wait_fraction: float
    train_seconds: float | None = None
    epoch_seconds: float | None = None
    host_seconds: float | None = None


@dataclass(frozen=True)
class Plan:
    """The runtime the agent resolved (agent/plan.py RuntimePlan) and its dataset summary."""

    hardware: str  # tpu | gpu | cpu
    replicas: int
    precision: str
    per_replica_batch_size: int
    steps_per_epoch: int
    steps_per_execution: int
    train_examples: int | None = None


@dataclass(frozen=True)
class StepSplit:
    """The final metrics' step_time_breakdown, per step."""

    device_ms: float
    host_ms: float
    input_wait_ms: float

    @property
    def total_ms(self) -> float:
        return self.device_ms + self.host_ms + self.input_wait_ms


@dataclass(frozen=True)
class MachineTime:
    """One machine of one attempt that has been deleted: how long it was held."""

    attempt: int
    seconds: float  # requested -> deleted
    startup_seconds: float | None  # requested -> its agent's first report


@dataclass(frozen=True)
class JobFacts:
    spec: JobSpec
    plan: Plan | None
    epochs: tuple[Epoch, ...] = ()
    step_split: StepSplit | None = None
    machines: tuple[MachineTime, ...] = ()
    attempts: int = 1


# --- helpers ----------------------------------------------------------------------------------------------


def steady_epochs(epochs: Sequence[Epoch]) -> list[Epoch]:
    """The epochs whose throughput means something: each attempt's first traces and compiles the model."""
    firsts = {min(e.epoch for e in epochs if e.attempt == a) for a in {e.attempt for e in epochs}}
    return [e for e in epochs if e.epoch not in firsts]


def _epoch_range(epochs: Sequence[Epoch]) -> str:
    """The epochs read, as runs: "2-5", or "2, 4-5" where a resumed attempt's first epoch was left out."""
    runs: list[list[int]] = []
    for n in sorted({e.epoch for e in epochs}):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _median(epochs: Sequence[Epoch], field: str) -> float | None:
    values = [getattr(e, field) for e in epochs if getattr(e, field) is not None]
    return statistics.median(values) if values else None


def _speedup(removed_share: float) -> str:
    return "unbounded" if removed_share >= 1 else f"{1 / (1 - removed_share):.2g}x"


def _r(x: float, digits: int = 4) -> float:
    return round(x, digits)


# --- the rules ---------------------------------------------------------------------------------------------


def input_bound(facts: JobFacts) -> Advice | None:
    steady = steady_epochs(facts.epochs)
    wait = _median(steady, "input_wait_fraction")
    if wait is None or wait < INPUT_BOUND_WAIT_FRACTION:
        return None
    evidence: dict[str, Number | str] = {"input_wait_fraction": _r(wait), "epochs": _epoch_range(steady),
                                         "threshold": INPUT_BOUND_WAIT_FRACTION}
    spec = facts.spec
    if spec.program is not None:  # its own tf.data pipeline, which no spec field reaches
        suggestion = ("in the program's input pipeline: dataset.cache() after parsing, interleave the files with "
                      "num_parallel_calls=tf.data.AUTOTUNE, and .prefetch(tf.data.AUTOTUNE) last")
    elif spec.dataset is not None and spec.training.cache_dataset is not True:
        # auto holds the parsed split in memory only where it is small (agent/input_choice.py); true caches any size.
        suggestion = "training.cache_dataset: true (keep the examples in memory after the first epoch, whatever their size)"
    elif (spec.dataset is not None and facts.plan is not None and facts.plan.train_examples is not None
          and facts.plan.train_examples / spec.dataset.options.shard_examples < PARALLEL_READS):
        shards = math.ceil(facts.plan.train_examples / spec.dataset.options.shard_examples)
        evidence.update(train_shards=shards, parallel_reads=PARALLEL_READS)
        per_shard = max(64, math.ceil(facts.plan.train_examples / PARALLEL_READS))
        suggestion = (f"dataset.options.shard_examples: {per_shard} (the training split is {shards} shard(s); the input "
                      f"pipeline reads up to {PARALLEL_READS} at once)")
    else:
        suggestion = ("the pipeline already caches, reads shards in parallel and prefetches: give the input more "
                      "CPU (accelerator.machine_type with more vCPUs) or smaller examples")
    return Advice("input_bound", evidence, suggestion,
                  f"up to {_speedup(wait)}: the {wait:.0%} of step time spent waiting on input")


def dispatch_bound(facts: JobFacts) -> Advice | None:
    plan = facts.plan
    steady = steady_epochs(facts.epochs)
    step_ms = _median(steady, "step_time_ms")
    if plan is None or step_ms is None:
        return None
    suggested = min(plan.steps_per_epoch, DISPATCH_STEPS_PER_EXECUTION)
    if suggested <= plan.steps_per_execution:
        return None
    evidence: dict[str, Number | str] = {"steps_per_execution": plan.steps_per_execution, "step_time_ms": _r(step_ms, 3),
                                         "epochs": _epoch_range(steady)}
    share = _host_share(facts, steady)
    if share is not None:
        if share < DISPATCH_HOST_SHARE:
            return None
        evidence.update(host_share=_r(share), threshold=DISPATCH_HOST_SHARE)
        gain = f"up to {_speedup(share)}: the {share:.0%} of step time spent on the host between calls"
    else:
        if plan.steps_per_execution != 1 or step_ms >= DISPATCH_SMALL_STEP_MS:
            return None
        evidence.update(threshold_ms=DISPATCH_SMALL_STEP_MS,
                        basis="no host/device split reported: one call per step of a step this short")
        gain = (f"not measured (no host/device split reported): the per-call overhead is paid once per {suggested} "
                "steps instead of every step")
    return Advice("dispatch_bound", evidence, f"steps_per_execution: {suggested}", gain)


def _host_share(facts: JobFacts, steady: Sequence[Epoch]) -> float | None:
    """The host's share of step time: the final metrics' step split, else the epochs' host_seconds over
    their train_seconds (from agents that report them), else None."""
    if (split := facts.step_split) is not None and split.total_ms > 0:
        return split.host_ms / split.total_ms
    shares = [e.host_seconds / e.train_seconds for e in steady
              if e.host_seconds is not None and e.train_seconds and e.host_seconds <= e.train_seconds]
    return statistics.median(shares) if shares else None


def mixed_precision(facts: JobFacts) -> Advice | None:
    plan, acc = facts.plan, facts.spec.accelerator
    if plan is None or plan.precision != "float32" or isinstance(acc, CpuAccelerator):
        return None
    kind, cc = ("tpu", None) if isinstance(acc, TpuAccelerator) else ("gpu", acc.compute_capability)
    faster = resolve_precision("auto", kind, cc)  # what the hardware's fast precision is, if it has one
    # A precision the spec asked for other than float32 resolves to itself; only float32 by choice, or
    # `auto` on hardware without fast low precision, trains in float32 on purpose.
    if faster == "float32" or resolve_precision(facts.spec.precision, kind, cc) != "float32":
        return None
    evidence: dict[str, Number | str] = {"precision": plan.precision,
                                         "hardware": acc.tpu_type if isinstance(acc, TpuAccelerator) else acc.gpu_type}
    if cc is not None:
        evidence["compute_capability"] = cc
    if (split := facts.step_split) is not None and split.total_ms > 0:
        share = split.device_ms / split.total_ms
        evidence.update(device_ms_per_step=_r(split.device_ms, 3), device_share=_r(share))
        gain = f"at most {_speedup(share)}: lower precision speeds only the device's {share:.0%} of step time"
    else:
        gain = ("not bounded from these numbers (no device time reported): lower precision speeds only the device's "
                "part of each step, and halves the memory of activations")
    return Advice("mixed_precision", evidence, f"precision: {faster}", gain)


def small_batch(facts: JobFacts) -> Advice | None:
    plan, spec = facts.plan, facts.spec
    floor = SMALL_BATCH_PER_REPLICA.get(spec.accelerator.type)
    steady = steady_epochs(facts.epochs)
    step_ms, rate = _median(steady, "step_time_ms"), _median(steady, "examples_per_sec")
    if plan is None or floor is None or plan.per_replica_batch_size >= floor or step_ms is None or rate is None:
        return None
    if plan.train_examples is None or plan.train_examples // (floor * plan.replicas) < SMALL_BATCH_MIN_STEPS:
        return None  # the data has too few examples for fuller steps
    ratio = floor / plan.per_replica_batch_size
    scaling = "" if spec.training.lr_scaling != "none" else " with training.lr_scaling: sqrt"
    return Advice("small_batch", {
        "per_replica_batch_size": plan.per_replica_batch_size, "threshold": floor, "step_time_ms": _r(step_ms, 3),
        "examples_per_sec": _r(rate, 2), "train_examples": plan.train_examples, "epochs": _epoch_range(steady)},
        f"training.per_replica_batch_size: {floor}{scaling}",
        f"at most {ratio:.3g}x examples/s (the batch ratio), reached while a step stays near {step_ms:.3g} ms")


def steps_per_execution_capped(facts: JobFacts) -> Advice | None:
    plan, spec = facts.plan, facts.spec
    if plan is None:
        return None
    asked = AUTO_STEPS_PER_EXECUTION[plan.hardware] if spec.steps_per_execution == "auto" else spec.steps_per_execution
    if asked <= plan.steps_per_epoch:
        return None
    steady = steady_epochs(facts.epochs)
    train_s, epoch_s = _median(steady, "train_seconds"), _median(steady, "epoch_seconds")
    evidence: dict[str, Number | str] = {"steps_per_execution_asked": asked, "steps_per_epoch": plan.steps_per_epoch,
                                         "steps_per_execution": plan.steps_per_execution}
    if train_s is None or epoch_s is None or epoch_s <= 0:
        return None
    overhead = max(0.0, 1 - train_s / epoch_s)
    if overhead < CAPPED_OVERHEAD_SHARE:
        return None
    evidence.update(epoch_seconds=_r(epoch_s, 3), train_seconds=_r(train_s, 3), outside_training_share=_r(overhead),
                    epochs=_epoch_range(steady))
    every = min(spec.training.epochs, CAPPED_CHECKPOINT_EVERY_FACTOR * spec.training.checkpoint_every_epochs)
    if every <= spec.training.checkpoint_every_epochs:
        return None  # checkpoints are already as rare as the spec allows: nothing in it shortens an epoch's end
    suggestion = (f"training.checkpoint_every_epochs: {every} (an epoch is only {plan.steps_per_epoch} steps, one "
                  "call, so steps_per_execution cannot rise and per-epoch work dominates)")
    return Advice("steps_per_execution_capped", evidence, suggestion,
                  f"up to {_speedup(overhead)} in wall time: the {overhead:.0%} of each epoch spent outside training steps "
                  "(validation, checkpoints, callbacks), of which checkpoints are a part")


def spot_cost(facts: JobFacts) -> Advice | None:
    acc = facts.spec.accelerator
    ended = [m for m in facts.machines if m.seconds > 0]
    if isinstance(acc, CpuAccelerator) or not acc.spot or facts.attempts < 2 or not ended:
        return None
    held_h = sum(m.seconds for m in ended) / 3600
    # A restart's start-up (machine requested -> agent's first report) is what an on-demand run would not
    # have paid again; the training redone since the last checkpoint is not known, so on-demand's figure
    # is an upper bound.
    restarts_h = sum(m.startup_seconds or 0.0 for m in ended if m.attempt > 1) / 3600
    spot_usd = held_h * spot_hourly_price_usd(facts.spec)
    on_demand_usd = (held_h - restarts_h) * hourly_price_usd(facts.spec)
    if on_demand_usd <= 0:
        return None
    evidence: dict[str, Number | str] = {
        "attempts": facts.attempts, "machine_hours": _r(held_h), "restart_hours": _r(restarts_h),
        "spot_usd_at_most": _r(spot_usd), "on_demand_usd_at_most": _r(on_demand_usd),
        "on_demand_usd_per_hour": _r(hourly_price_usd(facts.spec)),
        "spot_usd_per_hour_at_most": _r(spot_hourly_price_usd(facts.spec))}
    if spot_usd > on_demand_usd:
        return Advice("spot_cost", evidence, "accelerator.spot: false",
                      f"up to {spot_usd - on_demand_usd:.4g} USD ({1 - on_demand_usd / spot_usd:.0%}) on a run like this "
                      f"one: at spot's dearest rate its {held_h:.3g} machine-hours cost more than on-demand for the "
                      "same hours less the restarts' start-up")
    every = facts.spec.training.checkpoint_every_steps
    suggestion = ("keep accelerator.spot: true; lose less to each preemption with training.checkpoint_every_steps"
                  + (f" below {every}" if every else " (a mid-epoch checkpoint)"))
    return Advice("spot_cost", evidence, suggestion,
                  f"spot cost at most {spot_usd:.4g} USD against {on_demand_usd:.4g} USD on-demand for the same hours "
                  f"less the restarts' start-up, even with {facts.attempts - 1} restart(s) of "
                  f"{restarts_h / (facts.attempts - 1) * 3600:.0f} s each on average")


def oversized_machine(facts: JobFacts) -> Advice | None:
    plan, spec = facts.plan, facts.spec
    if plan is None or plan.replicas < 2 or plan.steps_per_epoch >= OVERSIZED_STEPS_PER_EPOCH:
        return None
    fewer = _fewer_replicas(spec, plan)
    if fewer is None:
        return None
    field, value, replicas, price = fewer
    now = hourly_price_usd(spec)
    evidence: dict[str, Number | str] = {"replicas": plan.replicas, "steps_per_epoch": plan.steps_per_epoch,
                                         "threshold": OVERSIZED_STEPS_PER_EPOCH, "usd_per_hour": _r(now)}
    if plan.train_examples is not None:
        evidence["train_examples"] = plan.train_examples
    gain = (f"{now / price:.3g}x lower price per hour ({now:.4g} -> {price:.4g} USD); an epoch becomes "
            f"{plan.steps_per_epoch * plan.replicas // replicas} steps, at most {plan.replicas // replicas}x its "
            "train time" if price > 0 else f"{plan.replicas // replicas}x fewer replicas for the same data")
    return Advice("oversized_machine", evidence, f"{field}: {value}", gain)


def _fewer_replicas(spec: JobSpec, plan: Plan) -> tuple[str, str | int, int, float] | None:
    """The smallest size of the same hardware that still gives OVERSIZED_STEPS_PER_EPOCH steps an epoch:
    (spec field, its value, replicas it gives, its price per hour), or None when the job is already smallest."""
    need = plan.steps_per_epoch * plan.replicas  # the epoch's steps on one replica

    def fits(replicas: int) -> bool:
        return need // replicas >= OVERSIZED_STEPS_PER_EPOCH or replicas == 1

    acc = spec.accelerator
    if isinstance(acc, GpuAccelerator):
        counts = [c for c in GPU_TYPES[acc.gpu_type].counts if c < acc.count and fits(c * spec.workers)]
        if not counts:
            return None
        best = max(counts)
        trial = spec.model_copy(update={"accelerator": acc.model_copy(update={"count": best, "machine_type": None})})
        return "accelerator.count", best, best * spec.workers, hourly_price_usd(trial)
    if isinstance(acc, TpuAccelerator):
        gen_name, size = acc.tpu_type.rsplit("-", 1)
        gen = TPU_GENERATIONS[gen_name]
        sizes = [s for s in (2**i for i in range(12)) if gen.units_per_replica <= s < int(size)
                 and s // gen.units_per_replica <= gen.replicas_per_host and fits(s // gen.units_per_replica)]
        if not sizes:
            return None
        best = max(sizes)
        trial = spec.model_copy(update={"accelerator": acc.model_copy(update={"tpu_type": f"{gen_name}-{best}"})})
        return "accelerator.tpu_type", f"{gen_name}-{best}", best // gen.units_per_replica, hourly_price_usd(trial)
    options = [r for r in range(acc.replicas - 1, 0, -1) if fits(r * spec.workers)]
    if not options:
        return None
    trial = spec.model_copy(update={"accelerator": acc.model_copy(update={"replicas": options[0]})})
    return "accelerator.replicas", options[0], options[0] * spec.workers, hourly_price_usd(trial)


RULES: tuple[Callable[[JobFacts], Advice | None], ...] = (
    input_bound, dispatch_bound, mixed_precision, small_batch, steps_per_execution_capped, spot_cost, oversized_machine,
)


def advise(facts: JobFacts) -> list[Advice]:
    """Every rule's advice for the job, in RULES' order."""
    return [a for rule in RULES if (a := rule(facts)) is not None]
