"""The advisor's typed facts (trainjobs/advice.py JobFacts) from a job's row and its metrics.json.

Everything here but the spec and the machines' times was written by the agent's process, where the
job's own code runs: each number is type-checked and bounded, a field that is not a number in range is
absent, and an epoch entry without its throughput is left out. A job cannot make the advisor raise,
or put anything but a number or a known name into its evidence.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from trainjobs.advice import Epoch, JobFacts, MachineTime, Plan, StepSplit
from trainjobs.spec import JobSpec

# The newest epochs read of a history: a median over these says all the rules need.
MAX_EPOCHS = 1000
_BIG = 1e12  # above any real count, rate or duration here
_PRECISIONS = frozenset({"float32", "mixed_float16", "mixed_bfloat16"})
_HARDWARE = frozenset({"tpu", "gpu", "cpu"})


def number(value: Any, low: float = 0.0, high: float = _BIG) -> float | None:
    """`value` as a finite float in [low, high], else None (bools are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    x = float(value)
    return x if math.isfinite(x) and low <= x <= high else None


def whole(value: Any, low: int = 0, high: int = 10**12) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if low <= value <= high else None


def plan_facts(runtime: Any) -> Plan | None:
    if not isinstance(runtime, dict):
        return None
    hardware, precision = runtime.get("hardware"), runtime.get("precision")
    replicas, batch = whole(runtime.get("replicas"), 1, 1 << 20), whole(runtime.get("per_replica_batch_size"), 1, 1 << 20)
    steps, spe = whole(runtime.get("steps_per_epoch"), 1), whole(runtime.get("steps_per_execution"), 1, 1 << 20)
    if (hardware not in _HARDWARE or precision not in _PRECISIONS or replicas is None or batch is None or steps is None
            or spe is None):
        return None
    dataset = runtime.get("dataset")
    examples = whole(dataset.get("train_examples"), 1) if isinstance(dataset, dict) else None
    return Plan(hardware, replicas, precision, batch, steps, spe, examples)


def epoch_facts(history: Any) -> tuple[Epoch, ...]:
    if not isinstance(history, list):
        return ()
    out = []
    for e in history[-MAX_EPOCHS:]:
        if not isinstance(e, dict):
            continue
        epoch, attempt = whole(e.get("epoch"), 1, 1 << 20), whole(e.get("attempt"), 1, 1 << 20)
        rate, step_ms = number(e.get("examples_per_sec")), number(e.get("step_time_ms"))
        wait = number(e.get("input_wait_fraction"), 0.0, 1.0)
        if epoch is None or attempt is None or rate is None or step_ms is None or wait is None:
            continue
        out.append(Epoch(epoch, attempt, rate, step_ms, wait, number(e.get("train_seconds")),
                         number(e.get("epoch_seconds")), number(e.get("host_seconds"))))
    return tuple(out)


def step_split(metrics: Any) -> StepSplit | None:
    split = metrics.get("step_time_breakdown") if isinstance(metrics, dict) else None
    if not isinstance(split, dict):
        return None
    device, host = number(split.get("device_ms_per_step")), number(split.get("host_ms_per_step"))
    wait = number(split.get("input_wait_ms_per_step"))
    if device is None or host is None or wait is None:
        return None
    return StepSplit(device, host, wait)


def machine_times(machines: Any) -> tuple[MachineTime, ...]:
    """The machines the worker has deleted (jobs.machines; service/db/machines.py): one still held has no
    end yet, so what it costs is not known until it is gone."""
    out = []
    for m in machines if isinstance(machines, list) else []:
        if not isinstance(m, dict) or whole(m.get("attempt"), 1) is None:
            continue
        requested, deleted, first = (_at(m.get(k)) for k in ("requested_at", "deleted_at", "first_report_at"))
        if requested is None or deleted is None:
            continue
        startup = (first - requested).total_seconds() if first is not None else None
        out.append(MachineTime(m["attempt"], max(0.0, (deleted - requested).total_seconds()),
                               None if startup is None else max(0.0, startup)))
    return tuple(out)


def _at(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


def job_facts(spec: JobSpec, *, runtime: Any, history: Any, metrics: Any, machines: Any, attempts: int) -> JobFacts:
    """The facts of one job; `history` is metrics.json's list of epochs, or [the last epoch's entry] without it."""
    return JobFacts(spec, plan_facts(runtime), epoch_facts(history), step_split(metrics), machine_times(machines),
                    max(1, attempts))
