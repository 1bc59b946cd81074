"""training.profile's window (agent/profiling.py) where no trace is taken: what the final metrics say.
A trace taken under each strategy: tests/e2e/test_epoch_steps.py, test_agent.py, test_agent_runs.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agent.plan import Hardware, TrainingPosition, resolve_plan
from agent.profiling import TraceWindow
from trainjobs.spec import JobSpec


def _window(tmp_path: Path, epoch: int, resumed_at: tuple[int, int] = (0, 0)) -> TraceWindow:
    job = JobSpec.model_validate({"dataset": {"source": "sklearn:iris"}, "model": {"name": "mlp"},
                                  "training": {"epochs": 4, "global_batch_size": 4}})
    plan = resolve_plan(job, Hardware("cpu", 1, local_devices=1), "default", 1, train_examples=40)
    plan = dataclasses.replace(plan, initial_epoch=resumed_at[0], initial_step=resumed_at[1])
    return TraceWindow(tmp_path, epoch, 5, plan)


def test_a_window_training_never_reached_says_so(tmp_path: Path) -> None:
    """early_stopping ended training first: the profiler was never started."""
    window = _window(tmp_path, epoch=3)
    window.before_call(TrainingPosition(1, 0, 10))  # epoch 2's first call: not the window's
    window.close(TrainingPosition(2, 0, 20))
    assert window.report([], 1) == {"epoch": 3, "steps": 5, "error": "not traced: training ended before epoch 3"}


@pytest.mark.parametrize("resumed_at", [(2, 3), (3, 0)], ids=["inside the window's epoch", "after it"])
def test_an_attempt_resumed_past_the_windows_start_does_not_trace_it_again(tmp_path: Path,
                                                                          resumed_at: tuple[int, int]) -> None:
    window = _window(tmp_path, epoch=3, resumed_at=resumed_at)
    window.before_call(TrainingPosition(*resumed_at, 10 * resumed_at[0] + resumed_at[1]))
    assert "not traced again" in window.report([], 2)["error"]
    assert not (tmp_path / "plugins").exists()
