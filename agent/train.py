"""model.fit with the bookkeeping around each call and epoch: metrics, checkpoints, status, TensorBoard."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import keras

from agent.input_wait import InputWaitMeter
from agent.plan import RuntimePlan, TrainingPosition
from agent.step_functions import CountingTrainFunction
from agent.tuning import TrialResult

log = logging.getLogger("trainjobs.agent")

KERAS_METRICS = ("loss", "accuracy", "val_loss", "val_accuracy")


class EpochRecorder(keras.callbacks.Callback):
    """Tracks the training position, handing it to `on_call` after every train-function call, and
    times the training part of each epoch (validation and mid-epoch checkpoints excluded) to hand
    a finished history entry and the position to `on_epoch`. Keras calls on_test_begin when
    validation starts, which ends the clock. Each entry also says how many train-function calls
    the epoch took and how many steps they ran; the entry of an epoch resumed from a mid-epoch
    checkpoint covers only the steps after `resumed_at_step`. `trial`: the steps steps_per_execution's
    trial trained before fit (agent/tuning.py), where the plan's first epoch starts; they count in that
    epoch's entry (steps, calls, time, input wait) as steps of its own.

    The entry splits the epoch's time (issue 24; the names are read by the job's advice): the training
    part is `host_seconds` (Keras' loop and the callbacks, outside the train function) plus the time
    inside train-function calls; `pause_seconds` (what `before_call` and `on_call` do between calls:
    checkpoints, status, the profiler's start and stop) is left out of the training part, and
    `validation_seconds` follows it. The attempt's first trained epoch also gives `first_call_seconds`,
    the first call's wall time (the trial's first, where one ran): tracing and compilation as well as
    its steps."""

    def __init__(self, plan: RuntimePlan, attempt: int, meter: InputWaitMeter, train_function: CountingTrainFunction,
                 on_epoch: Callable[[dict[str, Any], TrainingPosition], None],
                 on_call: Callable[[TrainingPosition], None], on_progress: Callable[[float], None],
                 names: tuple[str, ...] = KERAS_METRICS, before_call: Callable[[TrainingPosition], None] | None = None,
                 trial: TrialResult | None = None):
        super().__init__()
        self.trial = trial
        self.names = names  # what each entry records of Keras' logs (agent/tasks.py: epoch_names)
        self.plan, self.attempt, self.meter, self.train_function = plan, attempt, meter, train_function
        self.on_epoch, self.on_call, self.on_progress, self.before_call = on_epoch, on_call, on_progress, before_call
        self.position = plan.start
        self._epoch = self._first_step = self._global_at_begin = 0
        self._began = self._train_ended = 0.0
        self._waited = self._paused = self._inside_before = 0.0
        self._calls_before = self._steps_before = self._called_before = 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch
        # Only the epoch a mid-epoch checkpoint was taken in starts part-way (fit's batch indices
        # then count from the resumed step).
        self._first_step = self.plan.initial_step if epoch == self.plan.initial_epoch else 0
        self._global_at_begin = self.position.global_step
        self._train_ended = self._paused = 0.0
        self.meter.reset()
        self._calls_before, self._steps_before = self.train_function.calls, self.train_function.steps_run
        self._called_before = self.train_function.steps_called
        self._inside_before = self.train_function.seconds
        self._began = time.perf_counter()

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.before_call is not None:
            began = time.perf_counter()
            self.before_call(self.position)
            self._paused += time.perf_counter() - began

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # The steps this epoch's calls ran, as the train function counts them. Not from `batch`: it is
        # the index of the call's first step in older Keras (3.4, 3.6: the TF 2.17 and 2.18 images) and
        # of its last in newer (3.15), and Keras counts whole executions, where an epoch's last call
        # may be shorter.
        done = self.train_function.steps_called - self._called_before
        step = self._first_step + done
        self.position = TrainingPosition(self._epoch, step, self._global_at_begin + done)
        self.on_progress(self._epoch + step / self.plan.steps_per_epoch)
        began = time.perf_counter()
        self.on_call(self.position)
        self._paused += time.perf_counter() - began

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._stop_clock()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._stop_clock()
        ended = time.perf_counter()
        logs = logs or {}
        train_s = self._train_ended - self._began - self._paused
        inside_s = self.train_function.seconds - self._inside_before
        waited, first_step = self._waited, self._first_step
        head = self.trial if epoch == self.plan.initial_epoch else None
        if head is not None:
            train_s, waited, first_step = train_s + head.seconds, waited + head.waited_s, first_step - head.steps
            inside_s += head.inside_seconds
        steps = self.plan.steps_per_epoch - first_step
        examples = steps * self.plan.global_batch_size
        entry: dict[str, Any] = {"epoch": epoch + 1, "attempt": self.attempt}
        if first_step:
            entry["resumed_at_step"] = first_step
        entry.update({k: float(logs[k]) if k in logs else None for k in self.names})
        entry.update({
            "learning_rate": float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)),
            "examples_per_sec": round(examples / train_s, 2),
            "step_time_ms": round(1000 * train_s / steps, 3),
            "input_wait_fraction": round(min(1.0, waited / train_s), 4),
            "train_seconds": round(train_s, 3),
            "epoch_seconds": round(ended - self._began + (head.seconds if head else 0), 3),
            "executions": self.train_function.calls - self._calls_before + (head.executions if head else 0),
            "steps": self.train_function.steps_run - self._steps_before + (head.steps if head else 0),
            "host_seconds": round(train_s - inside_s, 3),
            "pause_seconds": round(self._paused, 3),
            "validation_seconds": round(ended - self._train_ended, 3),
        })
        if head is not None:  # the trial made this attempt's first call
            entry["first_call_seconds"] = round(head.first_call_seconds, 3)
        elif self._calls_before == 0:  # this attempt's first call was this epoch's
            entry["first_call_seconds"] = round(self.train_function.first_call_seconds, 3)
        self.position = TrainingPosition(epoch + 1, 0, self.position.global_step)
        self.on_epoch(entry, self.position)

    def _stop_clock(self) -> None:
        if not self._train_ended:
            self._train_ended = time.perf_counter()
            self._waited = self.meter.waited_s


class StopEarly(keras.callbacks.EarlyStopping):
    """training.early_stopping (issue 21): Keras' EarlyStopping, its direction from the metric (Keras'
    `auto` would minimise R²), and what the job records of it."""

    def __init__(self, spec: Any):
        from trainjobs.spec.task import HIGHER_IS_BETTER

        higher = spec.monitor.removeprefix("val_") in HIGHER_IS_BETTER
        super().__init__(monitor=spec.monitor, patience=spec.patience, min_delta=spec.min_delta,
                         mode="max" if higher else "min", restore_best_weights=spec.restore_best)
        self.spec = spec

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        super().on_train_end(logs)
        # The best weights also when patience never ran out (the last epochs worse than an earlier one):
        # Keras 3.15 restores them then too, the images' older Keras (3.4, 3.6) only when it stopped.
        if self.restore_best_weights and self.best_weights is not None:
            self.model.set_weights(self.best_weights)

    def outcome(self) -> dict[str, Any]:
        """For the job's final metrics: where training stopped, and why; which epoch's weights were kept."""
        best = self.best
        if not self.stopped_epoch:
            if not self.spec.restore_best or best is None or not math.isfinite(float(best)):
                return {"early_stopping": "not triggered"}
            return {"early_stopping": f"not triggered; best {self.spec.monitor} {float(best):.6g} at epoch "
                                      f"{self.best_epoch + 1}, whose weights were kept", "best_epoch": int(self.best_epoch) + 1}
        why = (f"{self.spec.monitor} did not improve by more than {self.spec.min_delta:g} for {self.spec.patience} "
               f"epochs; best {float(best):.6g} at epoch {self.best_epoch + 1}")
        if self.spec.restore_best:
            why += ", whose weights were kept"
        return {"early_stopping": why, "stopped_at_epoch": int(self.stopped_epoch) + 1,
                "best_epoch": int(self.best_epoch) + 1}


def fit(model: Any, plan: RuntimePlan, train_data: Any, val_data: Any | None, recorder: EpochRecorder,
        stop_early: StopEarly | None = None, class_weight: dict[int, float] | None = None,
        before: list[Any] | None = None) -> None:
    """Train from the plan's start to `plan.epochs`. A start inside an epoch (a mid-epoch
    checkpoint) takes two fit calls: the rest of that epoch, then the epochs after it. `before`: callbacks
    that run before the recorder after each call (pruning's masks, which a checkpoint then holds).

    Every fit call starts the input pipeline again from the spec's seed: the tf.data position is
    not checkpointed, so a resumed job does not see the batches an uninterrupted one would have.
    """
    if plan.initial_epoch >= plan.epochs:
        log.info("all %d epochs are already checkpointed; going straight to export", plan.epochs)
        return
    log.info("training epochs %d..%d: %d steps of %d examples, %d step(s) per execution",
             plan.initial_epoch + 1, plan.epochs, plan.steps_per_epoch, plan.global_batch_size, plan.steps_per_execution)
    common: dict[str, Any] = {
        "validation_data": val_data,
        "callbacks": [*(before or []), recorder, *([stop_early] if stop_early is not None else [])],
        "shuffle": False,  # the pipeline shuffles with the spec's seed
        "class_weight": class_weight,
        "verbose": 0,
    }
    first = plan.initial_epoch
    if plan.initial_step:
        log.info("%s epoch %d at step %d: %d of its %d steps left",
                 "continuing (after steps_per_execution's trial)" if recorder.trial else "resuming", first + 1,
                 plan.initial_step, plan.steps_per_epoch - plan.initial_step, plan.steps_per_epoch)
        recorder.train_function.start_epochs(plan.steps_per_epoch - plan.initial_step)
        model.fit(train_data, initial_epoch=first, epochs=first + 1,
                  steps_per_epoch=plan.steps_per_epoch - plan.initial_step, **common)
        first += 1
    if first < plan.epochs and not model.stop_training:
        recorder.train_function.start_epochs(plan.steps_per_epoch)
        model.fit(train_data, initial_epoch=first, epochs=plan.epochs, steps_per_epoch=plan.steps_per_epoch, **common)
