"""The optimizer and its learning rate: scaled for the global batch, warmed up linearly."""

from __future__ import annotations

from typing import Any

from trainjobs.spec import TrainingSpec
from agent.plan import RuntimePlan


def make_optimizer(training: TrainingSpec, plan: RuntimePlan) -> Any:
    import keras

    rate: Any = plan.learning_rate
    if plan.warmup_steps:
        rate = _warmup_schedule(plan.learning_rate, plan.warmup_steps)
    match training.optimizer:
        case "adam":
            return keras.optimizers.Adam(rate)
        case "adamw":
            return keras.optimizers.AdamW(rate)
        case "sgd":
            return keras.optimizers.SGD(rate, momentum=0.9)
        case "rmsprop":
            return keras.optimizers.RMSprop(rate)


def _warmup_schedule(peak: float, warmup_steps: int) -> Any:
    import keras

    class LinearWarmup(keras.optimizers.schedules.LearningRateSchedule):
        """peak * (step + 1) / warmup_steps for the warmup, then peak. Starting at step + 1 keeps
        the first update non-zero."""

        def __call__(self, step: Any) -> Any:
            ramp = keras.ops.cast(step + 1, "float32") / float(warmup_steps)
            return peak * keras.ops.minimum(1.0, ramp)

        def get_config(self) -> dict[str, Any]:
            return {"peak": peak, "warmup_steps": warmup_steps}

    return LinearWarmup()
