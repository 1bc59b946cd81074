"""The final metrics' step_time_breakdown (agent/step_time.py) from history entries as EpochRecorder writes
them; from a real run's: tests/e2e/test_agent.py and test_epoch_steps.py."""

from __future__ import annotations

from typing import Any

import pytest

from agent.step_time import step_time_breakdown


def _entry(epoch: int, attempt: int, train: float, host: float, wait: float, steps: int = 10,
           first_call: float | None = None) -> dict[str, Any]:
    entry = {"epoch": epoch, "attempt": attempt, "steps": steps, "train_seconds": train, "host_seconds": host,
             "input_wait_fraction": wait / train, "pause_seconds": 0.5, "validation_seconds": 1.0}
    return entry | ({"first_call_seconds": first_call} if first_call is not None else {})


def test_the_first_calls_excess_over_a_steady_call_is_compile_time() -> None:
    # Steady epochs: 2 s inside calls for 10 steps, 0.2 s/step; the first call (5 steps) took 6 s: 5 s excess.
    history = [_entry(1, 1, train=9.0, host=1.0, wait=0.5, first_call=6.0), _entry(2, 1, 2.5, 0.5, 0.2),
               _entry(3, 1, 2.5, 0.5, 0.2)]
    b = step_time_breakdown(history, 1, steps_per_execution=5)
    assert b["compile_seconds"] == pytest.approx(5.0)
    assert (b["host_seconds"], b["input_wait_seconds"], b["train_seconds"]) == (2.0, 0.9, 14.0)
    assert b["device_seconds"] == pytest.approx(14.0 - 2.0 - 0.9 - 5.0)
    assert (b["pause_seconds"], b["validation_seconds"]) == (1.5, 3.0)
    assert b["host_ms_per_step"] == pytest.approx(2000 / 30, abs=0.001)


def test_only_this_attempts_epochs_count() -> None:
    earlier = [_entry(1, 1, 50.0, 10.0, 1.0, first_call=30.0), {"epoch": 2, "attempt": 1, "steps": 10}]
    b = step_time_breakdown([*earlier, _entry(3, 2, 4.0, 1.0, 0.0, first_call=2.0), _entry(4, 2, 2.0, 1.0, 0.0)], 2, 5)
    assert b["train_seconds"] == 6.0 and b["compile_seconds"] == pytest.approx(1.5)


def test_one_call_with_nothing_to_compare_counts_as_device_time_and_says_compile_is_unknown() -> None:
    b = step_time_breakdown([_entry(1, 1, 3.0, 0.5, 0.5, first_call=2.5)], 1, steps_per_execution=10)
    assert b["compile_seconds"] is None and b["device_seconds"] == pytest.approx(2.0)


def test_a_history_without_the_breakdown_fields_gives_none() -> None:
    assert step_time_breakdown([{"epoch": 1, "attempt": 1, "steps": 10, "train_seconds": 1.0}], 1, 4) == {}
