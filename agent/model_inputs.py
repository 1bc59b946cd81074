"""What a model builder is given and what it may raise: shared by the builders of every kind of model
(agent/builtin_models.py, agent/models.py for keras.applications and the user's own), so none of them
imports another to get it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class ModelError(Exception):
    """The model could not be built; the message says why, for the user."""


@dataclass(frozen=True)
class ModelInputs:
    input_shape: tuple[int, ...]
    num_classes: int  # the model's outputs: classes; 1 for a binary task; targets for a regression
    params: dict[str, Any] = field(default_factory=dict)
    # Per-channel statistics of the training data, for the built-ins' Normalization layer.
    mean: tuple[float, ...] | None = None
    variance: tuple[float, ...] | None = None
    task: str = "classification"  # trainjobs/spec/task.py; agent/tasks.py builds each task's output
    target_mean: tuple[float, ...] | None = None  # a regression's training targets, for the output layer
    target_std: tuple[float, ...] | None = None

    def head(self, x: Any) -> Any:
        """This task's output layer(s) on features x (agent/tasks.py)."""
        from agent.tasks import head

        return head(x, self.task, self.num_classes)


Builder = Callable[[ModelInputs], Any]
