"""`status`'s view of where a job's training time went: the final metrics' step_time_breakdown and
its profiler trace (agent/step_time.py, agent/profiling.py; README, Profiling)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

BREAKDOWN, PROFILE = "step_time_breakdown", "profile"  # their keys in the job's metrics
# (label, seconds key, ms-per-step key): the training part's four parts, then what comes on top of it.
_PARTS = (("compile", "compile_seconds", None), ("input wait", "input_wait_seconds", "input_wait_ms_per_step"),
          ("host", "host_seconds", "host_ms_per_step"), ("device", "device_seconds", "device_ms_per_step"))
_ON_TOP = (("pause", "pause_seconds"), ("validation", "validation_seconds"))


def breakdown_table(b: dict[str, Any]) -> Table:
    """The training part's four parts with their share of it, then the pauses and validation."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("PART", no_wrap=True)
    for title in ("SECONDS", "MS/STEP", "SHARE"):
        table.add_column(title, justify="right", no_wrap=True)
    train = b.get("train_seconds")
    for label, key, per_step in _PARTS:
        seconds = b.get(key)
        share = f"{seconds / train:.0%}" if isinstance(seconds, int | float) and train else "-"
        table.add_row(label, _seconds(seconds), _number(b.get(per_step) if per_step else None), share)
    table.add_row("= training", _seconds(train), "", "")
    for label, key in _ON_TOP:
        table.add_row(f"+ {label}", _seconds(b.get(key)), "", "")
    return table


def profile_line(p: dict[str, Any]) -> str:
    """The trace's window, wall time and cost, and its files under the job's tensorboard/."""
    window = f"epoch {p.get('epoch')}, {p.get('steps')} steps"
    if p.get("error"):
        return f"{window}: {p['error']}"
    overhead = p.get("overhead_seconds")
    cost = f" (overhead {overhead:.3g} s)" if isinstance(overhead, int | float) else ""
    files = ", ".join(f"tensorboard/{f}" for f in p.get("files") or []) or "no files"
    return f"{window} in {_seconds(p.get('seconds'))} s{cost}: {files}"


def _seconds(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, int | float) else "-"


def _number(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, int | float) else "-"
