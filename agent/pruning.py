"""Gradual magnitude pruning on Keras 3 itself (issue 23; tfmot needs tf_keras and does not work with
Keras 3).

Each prunable kernel (Dense and EinsumDense for `dense`, the convolutions for `conv`; never the output
layer, whose few weights each class needs) gets a mask: a float32 variable of its shape, made in the
strategy's scope, saved in every checkpoint beside the model (agent/run.py), so a resumed job keeps
its masks. Two parts:

- in the train step, the kernel's `constraint` multiplies it by its mask. Keras 3 applies a variable's
  constraint right after every optimizer update, inside the step function: under every strategy and
  every steps_per_execution a pruned weight is zero after each step. It only reads the mask: a
  variable written inside a replica's step would need a merge_call, which tf.distribute refuses under
  a tf.cond or in the loop of a multi-step function;
- between train-function calls (a callback, on the host, in cross-replica context), every
  `frequency_steps` optimizer steps and at the window's end, the masks are recomputed from the
  weights: the smallest |w| of each kernel, the schedule's share of them, are masked (and zeroed at
  once). The schedule is a function of the optimizer's step count, which checkpoints restore, so a
  resumed job takes it up where it was.

The schedule over [begin, end] (epochs, as optimizer steps): polynomial s(t) = target x (1 - (1 - t)^3),
t the window's elapsed share (tfmot's PolynomialDecay with power 3: fast at first, while the network
can still recover), or constant: the target from begin on. After `end` the masks are fixed and training
goes on recovering with them. Updates fall on train-function calls, so with steps_per_execution k a
mask changes at most k - 1 steps after its schedule says.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import keras

from agent.model_inputs import ModelError

log = logging.getLogger("trainjobs.agent")

DENSE = ("Dense", "EinsumDense")
CONV = ("Conv1D", "Conv2D", "Conv3D", "DepthwiseConv2D", "SeparableConv2D", "Conv1DTranspose", "Conv2DTranspose")


class PruningError(ModelError):
    """The model has nothing the spec's pruning can prune; the message says why, for the user."""


@dataclass
class Pruned:
    layer: str
    kernel: Any  # the layer's kernel variable
    mask: Any  # float32 variable of its shape: 1 kept, 0 pruned


def prunable(model: Any, layers: str) -> list[tuple[str, Any]]:
    """(layer name, kernel) of every kernel `layers` names, the output layers' left out."""
    kinds = {"dense": DENSE, "conv": CONV, "all": DENSE + CONV}[layers]
    outputs = {t._keras_history[0].name for t in getattr(model, "outputs", None) or [] if hasattr(t, "_keras_history")}
    found = []
    for layer in _layers(model):
        if type(layer).__name__ not in kinds or layer.name in outputs:
            continue
        kernel = getattr(layer, "depthwise_kernel" if type(layer).__name__ == "DepthwiseConv2D" else "kernel", None)
        if kernel is not None:
            found.append((layer.name, kernel))
    return found


def _layers(model: Any) -> list[Any]:
    out = []
    for layer in model.layers:
        out.extend(_layers(layer) if hasattr(layer, "layers") and layer.layers else [layer])
    return out


class Pruner:
    """The masks of one model and their schedule; `callback()` goes first in fit's callbacks, so a
    checkpoint taken after a call holds the masks that call's update left."""

    def __init__(self, model: Any, layers: str, target: float, schedule: str, begin_step: int, end_step: int,
                 frequency: int):
        self.target, self.schedule, self.frequency = target, schedule, frequency
        self.begin_step, self.end_step = begin_step, max(end_step, begin_step + 1)
        self.model = model
        self.pruned: list[Pruned] = []
        for name, kernel in prunable(model, layers):
            mask = keras.Variable(keras.ops.ones(kernel.shape, dtype="float32"), trainable=False, dtype="float32",
                                  name=f"{name}_pruning_mask")
            kernel.constraint = _Masked(mask)
            self.pruned.append(Pruned(name, kernel, mask))
        if not self.pruned:
            raise PruningError(f"training.pruning: the model has no {'' if layers == 'all' else layers + ' '}layers "
                               "to prune besides its output layer (Dense or convolution kernels)")
        self._applied = -1  # the update last applied: its index in the schedule

    @property
    def masks(self) -> list[Any]:
        """For the checkpoint."""
        return [p.mask for p in self.pruned]

    def sparsity_at(self, step: int) -> float:
        if step < self.begin_step:
            return 0.0
        if self.schedule == "constant":
            return self.target
        t = min(1.0, (step - self.begin_step) / (self.end_step - self.begin_step))
        return self.target * (1.0 - (1.0 - t) ** 3)

    def _update_index(self, step: int) -> int:
        """Which update of the schedule `step` is in: -1 before begin, the last one from end on."""
        if step < self.begin_step:
            return -1
        last = math.ceil((self.end_step - self.begin_step) / self.frequency)
        if step >= self.end_step:  # the target, once, even where the window ends with training
            return last
        return min(last - 1, (step - self.begin_step) // self.frequency)

    def after_call(self) -> None:
        step = int(self.model.optimizer.iterations.numpy())
        index = self._update_index(step)
        if index < 0 or index <= self._applied:  # before the window, or this update is applied
            return
        self._applied = index
        self.update(self.sparsity_at(step))

    def update(self, sparsity: float) -> None:
        """Mask the smallest `sparsity` share of each kernel's weights, and zero them now."""
        import tensorflow as tf

        for p in self.pruned:
            magnitude = tf.abs(tf.cast(p.kernel.value, tf.float32))
            flat = tf.reshape(magnitude, [-1])
            k = int(math.floor(sparsity * int(flat.shape[0])))
            if k <= 0:
                mask = tf.ones_like(magnitude)
            else:
                threshold = tf.sort(flat)[k - 1]
                mask = tf.cast(magnitude > threshold, tf.float32)
            p.mask.assign(mask)
            p.kernel.assign(p.kernel.value * tf.cast(mask, p.kernel.dtype))

    def restore_progress(self) -> None:
        """After a checkpoint was restored: the update its masks reflect, so it is not applied twice."""
        self._applied = self._update_index(int(self.model.optimizer.iterations.numpy()))

    def callback(self) -> Any:
        pruner = self

        class PruningCallback(keras.callbacks.Callback):
            def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
                pruner.after_call()

        return PruningCallback()


class _Masked(keras.constraints.Constraint):
    """The kernel's constraint: itself times its mask, after every optimizer update (a Constraint: the
    images' Keras 3.4 takes nothing else)."""

    def __init__(self, mask: Any):
        self.mask = mask

    def __call__(self, w: Any) -> Any:
        return w * keras.ops.cast(self.mask, w.dtype)


def sparsity(model: Any, layers: str) -> dict[str, float]:
    """Each prunable kernel's share of zeros, by layer name (of an exported copy: no masks needed)."""
    import numpy as np

    return {name: round(float(np.mean(np.asarray(kernel.numpy()) == 0)), 4) for name, kernel in prunable(model, layers)}


def for_spec(model: Any, training: Any, steps_per_epoch: int) -> Pruner | None:
    """The Pruner training.pruning asks for (None without it), its window in optimizer steps."""
    p = training.pruning
    if p is None:
        return None
    begin, end = training.pruning_window()
    return Pruner(model, p.layers, p.target_sparsity, p.schedule, begin * steps_per_epoch, end * steps_per_epoch,
                  p.frequency_steps)
