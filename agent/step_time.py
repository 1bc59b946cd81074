"""The final metrics' `step_time_breakdown` (issue 24): where this attempt's training time went, summed
over its epochs' history entries (agent/train.py, EpochRecorder).

The training part of each epoch is split exactly: host (Keras' loop and callbacks, outside the train
function) + the time inside train-function calls, which is input wait (timed at each fetch inside
the train function, agent/input_wait.py) + compile (the first call's excess over a steady call of as many steps) +
device (the rest). "Device" is what the steps' compiled function took, whatever ran it: the TPU or
GPUs, or on a CPU this host's own cores. Pauses (checkpoints, status, uploads, the profiler's start
and stop) and validation come on top of the training part.
"""

from __future__ import annotations

from typing import Any


def step_time_breakdown(history: list[dict[str, Any]], attempt: int, steps_per_execution: int) -> dict[str, Any]:
    ours = [e for e in history if e.get("attempt") == attempt and "host_seconds" in e]
    steps = int(sum(e["steps"] for e in ours))
    if not ours or not steps:
        return {}
    train = sum(e["train_seconds"] for e in ours)
    host = sum(e["host_seconds"] for e in ours)
    inside = train - host
    # The wait is timed inside the calls; a record written before it was (in tf.data, where a distributed
    # iterator's prefetch thread also waited between calls) may hold more: only what fits in the calls
    # is counted in them.
    waited = sum(min(e["input_wait_fraction"] * e["train_seconds"], e["train_seconds"] - e["host_seconds"])
                 for e in ours)
    compile_s = _compile_seconds(ours, steps_per_execution)
    # The excess is estimated from other calls: never more than the calls' time the wait leaves.
    compile_part = min(compile_s or 0.0, max(0.0, inside - waited))
    device = inside - waited - compile_part

    def ms(seconds: float) -> float:
        return round(1000.0 * seconds / steps, 3)

    return {
        "compile_seconds": None if compile_s is None else round(compile_part, 3),
        "input_wait_seconds": round(waited, 3),
        "host_seconds": round(host, 3),
        "device_seconds": round(device, 3),
        "pause_seconds": round(sum(e["pause_seconds"] for e in ours), 3),
        "validation_seconds": round(sum(e["validation_seconds"] for e in ours), 3),
        "train_seconds": round(train, 3),
        "device_ms_per_step": ms(device),
        "host_ms_per_step": ms(host),
        "input_wait_ms_per_step": ms(waited),
    }


def _compile_seconds(ours: list[dict[str, Any]], steps_per_execution: int) -> float | None:
    """The first call's time beyond what its steps take in a steady call (time inside calls per step,
    from the attempt's later epochs, else from the first epoch's other calls); None with nothing to
    compare it to (one epoch of one call), when it counts as device time."""
    first = ours[0]
    if "first_call_seconds" not in first:
        return None
    first_steps = min(steps_per_execution, int(first["steps"]))
    per_step: float
    later = ours[1:]
    if later:
        per_step = sum(e["train_seconds"] - e["host_seconds"] for e in later) / sum(e["steps"] for e in later)
    elif first["steps"] > first_steps:
        rest = first["train_seconds"] - first["host_seconds"] - first["first_call_seconds"]
        per_step = max(0.0, rest) / (first["steps"] - first_steps)
    else:
        return None
    return max(0.0, float(first["first_call_seconds"]) - first_steps * per_step)
