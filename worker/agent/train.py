"""model.fit with the bookkeeping around each epoch: metrics, checkpoint, status, TensorBoard."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import keras

from worker.agent.input_wait import InputWaitMeter
from worker.agent.plan import RuntimePlan
from worker.agent.step_functions import CountingTrainFunction

log = logging.getLogger("trainjobs.agent")

KERAS_METRICS = ("loss", "accuracy", "val_loss", "val_accuracy")


class EpochRecorder(keras.callbacks.Callback):
    """Times the training part of each epoch (validation excluded) and hands a finished history
    entry to `on_epoch`. Keras calls on_test_begin when validation starts, which ends the clock.
    Each entry also says how many train-function calls the epoch took and how many steps they ran."""

    def __init__(self, plan: RuntimePlan, attempt: int, meter: InputWaitMeter, train_function: CountingTrainFunction,
                 on_epoch: Callable[[dict[str, Any]], None], on_progress: Callable[[float], None]):
        super().__init__()
        self.plan, self.attempt, self.meter, self.train_function = plan, attempt, meter, train_function
        self.on_epoch, self.on_progress = on_epoch, on_progress
        self._epoch = 0
        self._began = self._train_ended = 0.0
        self._waited = 0.0
        self._calls_before = self._steps_before = 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch
        self._train_ended = 0.0
        self.meter.reset()
        self._calls_before, self._steps_before = self.train_function.calls, self.train_function.steps_run
        self._began = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.on_progress(self._epoch + (batch + 1) / self.plan.steps_per_epoch)

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._stop_clock()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._stop_clock()
        logs = logs or {}
        train_s = self._train_ended - self._began
        examples = self.plan.steps_per_epoch * self.plan.global_batch_size
        entry: dict[str, Any] = {"epoch": epoch + 1, "attempt": self.attempt}
        entry.update({k: float(logs[k]) if k in logs else None for k in KERAS_METRICS})
        entry.update({
            "learning_rate": float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)),
            "examples_per_sec": round(examples / train_s, 2),
            "step_time_ms": round(1000 * train_s / self.plan.steps_per_epoch, 3),
            "input_wait_fraction": round(min(1.0, self._waited / train_s), 4),
            "train_seconds": round(train_s, 3),
            "epoch_seconds": round(time.perf_counter() - self._began, 3),
            "executions": self.train_function.calls - self._calls_before,
            "steps": self.train_function.steps_run - self._steps_before,
        })
        self.on_epoch(entry)

    def _stop_clock(self) -> None:
        if not self._train_ended:
            self._train_ended = time.perf_counter()
            self._waited = self.meter.waited_s


def fit(model: Any, plan: RuntimePlan, train_data: Any, val_data: Any | None, recorder: EpochRecorder) -> None:
    if plan.initial_epoch >= plan.epochs:
        log.info("all %d epochs are already checkpointed; going straight to export", plan.epochs)
        return
    log.info("training epochs %d..%d: %d steps of %d examples, %d step(s) per execution",
             plan.initial_epoch + 1, plan.epochs, plan.steps_per_epoch, plan.global_batch_size, plan.steps_per_execution)
    model.fit(
        train_data,
        epochs=plan.epochs,
        initial_epoch=plan.initial_epoch,
        steps_per_epoch=plan.steps_per_epoch,
        validation_data=val_data,
        callbacks=[recorder],
        shuffle=False,  # the pipeline shuffles with the spec's seed
        verbose=0,
    )
