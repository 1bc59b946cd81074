"""The training script of bench/program_bench.py (issue 20): a user's Keras script with the runtime's
lines, run the same way by hand (`TRAINJOBS_SPEC=spec.json python program_script.py`) and as a program
job through `trainjobs up`.

An MLP on synthetic data it makes itself (so neither side reads a dataset: the comparison is of running
the code, not of staging): EXAMPLES examples of 64 features in 10 classes, the label the argmax of a
fixed linear map. `--plain` leaves the runtime out (tf.distribute and Keras as a script written without
trainjobs would use them, steps_per_execution 1), for a third column.

It times itself and writes timing.json to its model directory: each epoch's training examples/s (from
on_epoch_begin to on_epoch_end; no validation), and the wall-clock times of the process start, the
first training step's end and the last one's.
"""

from __future__ import annotations

import time

STARTED = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--examples", type=int, default=80_000)
ap.add_argument("--features", type=int, default=64)
ap.add_argument("--plain", action="store_true", help="without the runtime: Keras' own strategy and step")
ap.add_argument("--devices", type=int, default=2, help="logical CPUs (--plain only; the runtime reads the spec)")
ap.add_argument("--batch", type=int, default=256, help="global batch (--plain only)")
ap.add_argument("--epochs", type=int, default=4, help="--plain only")
args = ap.parse_args()

if args.plain:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.devices)
    strategy = (tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])
                if args.devices > 1 else tf.distribute.get_strategy())
    batch, epochs, spe, lr = args.batch, args.epochs, 1, 1e-3
    model_dir = Path(os.environ.get("AIP_MODEL_DIR") or "plain-model")
    model_dir.mkdir(parents=True, exist_ok=True)
    callbacks: list = []
else:
    from trainjobs import runtime as tj

    strategy = tj.strategy()
    batch, epochs, spe, lr = tj.global_batch_size, tj.epochs, tj.steps_per_execution, tj.learning_rate
    model_dir = tj.model_dir
    callbacks = tj.callbacks(tensorboard=False)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

rng = np.random.default_rng(7)
x = rng.normal(size=(args.examples, args.features)).astype("float32")
y = np.argmax(x @ rng.normal(size=(args.features, 10)), axis=1).astype("int32")
train = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(16_384, seed=7).batch(batch, drop_remainder=True)
         .prefetch(tf.data.AUTOTUNE))
steps = args.examples // batch

with strategy.scope():
    model = keras.Sequential([keras.Input((args.features,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(lr), steps_per_execution=spe,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])


class Clock(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.epochs: list[dict] = []
        self.first_step_at: float | None = None
        self.last_step_at = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._began_at, self._began = time.time(), time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.last_step_at = time.time()
        if self.first_step_at is None:
            self.first_step_at = self.last_step_at

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self._began
        self.epochs.append({"epoch": epoch + 1, "began_at": self._began_at, "seconds": seconds, "examples_per_sec": steps * batch / seconds,
                            "loss": float(logs["loss"]), "accuracy": float(logs["accuracy"])})


clock = Clock()
model.fit(train, epochs=epochs, steps_per_epoch=steps, callbacks=[clock, *callbacks], verbose=2)
model.save(model_dir / "model.keras")
(model_dir / "timing.json").write_text(json.dumps({
    "started_at": STARTED, "first_step_at": clock.first_step_at, "last_step_at": clock.last_step_at,
    "saved_at": time.time(), "epochs": clock.epochs, "batch": batch, "steps_per_execution": spe,
    "replicas": int(strategy.num_replicas_in_sync)}))
