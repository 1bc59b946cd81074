"""training.profile (issue 24): a TensorFlow profiler trace of a window of training steps.

The profiler starts before the window epoch's first train-function call and stops after the first
call that reaches the window's steps, so it traces whole executions: the same steps_per_execution
loop, under the same strategy, as the epochs around it. Between calls no step is in flight, so
starting and stopping there is safe under every strategy; only this host is traced, and only the
chief traces (a worker's trace would need a directory of its own, and the chief's steps wait on the
same collectives as every worker's). On a GPU or TPU VM TensorFlow's profiler also collects the
devices' activity (not exercised by the tests, which have neither).

`tf.profiler.experimental.start(logdir)` writes `<logdir>/plugins/profile/<run>/<host>.xplane.pb`,
where TensorBoard's profile plugin (tensorboard-plugin-profile, XProf) looks; the logdir is the
job's local TensorBoard directory, mirrored to its tensorboard/ in storage with the scalars. A
profiler that cannot start or stop (another session running, a build without it) leaves training
as it was, and the final metrics say why.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from agent.plan import RuntimePlan, TrainingPosition

log = logging.getLogger("trainjobs.agent")

PROFILE_DIR = "plugins/profile"  # under a TensorBoard logdir: where the profile plugin finds its runs


class TraceWindow:
    """The hooks EpochRecorder calls around each train-function call (its pause, not the epoch's steps),
    and the window's report for the final metrics."""

    def __init__(self, logdir: Path, epoch: int, steps: int, plan: RuntimePlan):
        self.logdir, self.epoch = logdir, epoch  # epoch counted from 1, as the spec has it
        self.steps = min(steps, plan.steps_per_epoch)
        self.asked_steps, self.steps_per_execution = steps, plan.steps_per_execution
        self.traced_steps = 0
        self.seconds = 0.0
        self.files: list[str] = []
        self.problem: str | None = None
        if (plan.initial_epoch, plan.initial_step) > (epoch - 1, 0):
            self.problem = f"not traced again: an earlier attempt trained past epoch {epoch}'s first steps"
        self._began: float | None = None
        self._done = False
        self._global_at_start = 0
        self._before: set[Path] = set()

    def before_call(self, at: TrainingPosition) -> None:
        if self.problem or self._done or self._began is not None or (at.epoch, at.step) != (self.epoch - 1, 0):
            return
        import tensorflow as tf

        self._before = set(self._trace_files())
        began = time.perf_counter()
        try:
            tf.profiler.experimental.start(str(self.logdir))
        except Exception as exc:  # noqa: BLE001 - any failure of the profiler leaves training alone
            self.problem = f"the profiler did not start: {type(exc).__name__}: {exc}"
            log.warning("training.profile: %s", self.problem)
            return
        self._began, self._global_at_start = began, at.global_step
        log.info("profiling epoch %d from its first step, for at least %d steps", self.epoch, self.steps)

    def after_call(self, at: TrainingPosition) -> None:
        if self._began is not None and at.global_step - self._global_at_start >= self.steps:
            self._stop(at.global_step - self._global_at_start)

    def close(self, at: TrainingPosition) -> None:
        """After training, whatever ended it: a window still open is closed with the steps it saw."""
        if self._began is not None:
            self._stop(at.global_step - self._global_at_start)

    def _stop(self, traced: int) -> None:
        import tensorflow as tf

        assert self._began is not None
        try:
            tf.profiler.experimental.stop()
        except Exception as exc:  # noqa: BLE001
            self.problem = f"the profiler did not stop: {type(exc).__name__}: {exc}"
            log.warning("training.profile: %s", self.problem)
        self.seconds = time.perf_counter() - self._began
        self._began, self._done = None, True
        self.traced_steps = traced
        self.files = sorted(p.relative_to(self.logdir).as_posix() for p in set(self._trace_files()) - self._before)
        log.info("profiled %d steps of epoch %d in %.3f s: %s", traced, self.epoch, self.seconds, self.files)

    def _trace_files(self) -> list[Path]:
        root = self.logdir / PROFILE_DIR
        return [p for p in root.rglob("*") if p.is_file()] if root.is_dir() else []

    def report(self, history: list[dict[str, Any]], attempt: int) -> dict[str, Any]:
        """The final metrics' `profile`: the window, its wall time and what it cost beyond the same steps
        untraced, and the trace's files relative to the job's tensorboard/ directory."""
        out: dict[str, Any] = {"epoch": self.epoch, "steps": self.traced_steps or self.asked_steps}
        if self.problem:
            return out | {"error": self.problem}
        if not self.traced_steps:
            return out | {"error": f"not traced: training ended before epoch {self.epoch}"}
        normal_ms = _normal_step_ms(history, attempt, self.epoch, self.traced_steps, self.seconds,
                                    self.steps_per_execution)
        overhead = None if normal_ms is None else round(self.seconds - self.traced_steps * normal_ms / 1000, 3)
        return out | {"seconds": round(self.seconds, 3), "overhead_seconds": overhead, "files": self.files}


def _normal_step_ms(history: list[dict[str, Any]], attempt: int, epoch: int, traced: int, window_s: float,
                    steps_per_execution: int) -> float | None:
    """An untraced step's time (ms), from the likest steps there are: this attempt's other epochs but
    its first (whose calls include tracing and compilation, and whose loop starts the input
    iterators); else the traced epoch's steps outside the window; else the first epoch's steps after
    its first call. None when no step ran outside the window but in the first call."""
    ours = [e for e in history if e["attempt"] == attempt]
    if not ours:
        return None
    steady = [e for e in ours[1:] if e["epoch"] != epoch]
    seconds, steps = sum(float(e["train_seconds"]) for e in steady), sum(int(e["steps"]) for e in steady)
    traced_epoch, first = next((e for e in ours if e["epoch"] == epoch), None), ours[0]
    if not steps and traced_epoch is not None and traced_epoch is not first:
        seconds, steps = max(0.0, float(traced_epoch["train_seconds"]) - window_s), int(traced_epoch["steps"]) - traced
    if steps <= 0 and first is not traced_epoch and "first_call_seconds" in first:
        seconds = max(0.0, float(first["train_seconds"]) - float(first["first_call_seconds"]))
        steps = int(first["steps"]) - min(steps_per_execution, int(first["steps"]))
    return 1000 * seconds / steps if steps > 0 else None
