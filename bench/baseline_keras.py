"""The baseline for bench/trainer_bench.py: the Keras script a competent user writes by hand to
train the same model on the same TFRecord shards, with no trainjobs machinery around model.fit.

Same as the agent: the built-in cnn (agent/builtin_models.py, normalised by the first 4096
training examples), Adam, float32, the same strategy over the same logical CPU devices, the same
global batch, learning rate and steps_per_execution, tf.data with a batched parse_example, shuffle,
prefetch, and validation data of declared length. Timed the same way: each epoch's training part,
from on_epoch_begin to on_test_begin. Left out is what the agent adds around model.fit: its own
step functions (bench/README.md), the input-wait meter, the per-call progress and checkpoint
schedule, the heartbeat, and the per-epoch metrics, checkpoint and TensorBoard uploads.

Usage (trainer_bench.py runs it): python bench/baseline_keras.py --data DIR --strategy mirrored
    --devices 2 --global-batch 256 --steps-per-epoch 140 --steps-per-execution 1 --epochs 5 --out result.json
DIR holds manifest.json and the shards it names, as staging wrote them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for the model builder only

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from agent.builtin_models import cnn  # noqa: E402
from agent.models import ModelInputs  # noqa: E402

SHUFFLE_BUFFER = 16_384
STATS_EXAMPLES = 4096


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--strategy", choices=["mirrored", "default"], required=True)
    ap.add_argument("--devices", type=int, required=True)
    ap.add_argument("--global-batch", type=int, required=True)
    ap.add_argument("--steps-per-epoch", type=int, required=True)
    ap.add_argument("--steps-per-execution", type=int, required=True)
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--learning-rate", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--checkpoint-dir", type=Path, help="save a checkpoint at every epoch's end (small_job_bench.py)")
    ap.add_argument("--export-dir", type=Path, help="export a SavedModel at the end")
    args = ap.parse_args()

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.devices)
    if args.strategy == "mirrored":
        strategy = tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])
    else:
        strategy = tf.distribute.get_strategy()

    keras.utils.set_random_seed(args.seed)
    manifest = json.loads((args.data / "manifest.json").read_text())
    shape = tuple(manifest["feature"]["shape"])
    files = {split: [str(args.data / s) for s in v["shards"]] for split, v in manifest["splits"].items()}
    spec = {"x": tf.io.FixedLenFeature([math.prod(shape)], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}

    def parse(serialized):  # type: ignore[no-untyped-def]
        parsed = tf.io.parse_example(serialized, spec)
        return tf.reshape(parsed["x"], (-1, *shape)), tf.cast(parsed["y"], tf.int32)

    auto = tf.data.AUTOTUNE
    train = (tf.data.TFRecordDataset(files["train"], num_parallel_reads=auto)
             .shuffle(SHUFFLE_BUFFER, seed=args.seed).repeat()
             .batch(args.global_batch, drop_remainder=True).map(parse, num_parallel_calls=auto).prefetch(auto))
    # Declaring the validation length matters: with it unknown, each validation pass runs the
    # distributed iterator into end-of-data, and training after it ran at 1/2 to 1/4 speed under
    # MirroredStrategy on 2 CPUs (Keras 3.15, TF 2.21). The agent declares it too.
    val_steps = -(-int(manifest["splits"]["validation"]["examples"]) // args.global_batch)
    val = (tf.data.TFRecordDataset(files["validation"]).batch(args.global_batch)
           .apply(tf.data.experimental.assert_cardinality(val_steps)).map(parse, num_parallel_calls=auto).prefetch(auto))

    x = next(iter(tf.data.TFRecordDataset(files["train"]).take(STATS_EXAMPLES).batch(STATS_EXAMPLES).map(parse)))[0].numpy()
    mean, variance = x.mean(axis=(0, 1, 2)).tolist(), x.var(axis=(0, 1, 2)).tolist()

    with strategy.scope():
        model = cnn(ModelInputs(shape, int(manifest["num_classes"]), {}, tuple(mean), tuple(variance)))
        model.compile(optimizer=keras.optimizers.Adam(args.learning_rate),
                      loss=keras.losses.SparseCategoricalCrossentropy(), metrics=["accuracy"],
                      steps_per_execution=args.steps_per_execution)

    timer = EpochTimer(args.steps_per_epoch * args.global_batch)
    callbacks: list[keras.callbacks.Callback] = [timer]
    if args.checkpoint_dir:
        # What a careful user writes: the model and optimizer after every epoch, the previous one
        # kept until the new one is whole. Before the timer, whose epoch end then includes it.
        callbacks.insert(0, EpochCheckpoint(tf.train.Checkpoint(model=model, optimizer=model.optimizer),
                                            args.checkpoint_dir))
    began = time.time()
    model.fit(train, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, validation_data=val,
              callbacks=callbacks, verbose=0)
    if args.export_dir:
        model.export(str(args.export_dir), verbose=False)
    args.out.write_text(json.dumps({"epochs": timer.epochs, "fit_began_at": began, "ended_at": time.time()}, indent=2))


class EpochCheckpoint(keras.callbacks.Callback):
    def __init__(self, checkpoint: tf.train.Checkpoint, directory: Path):
        super().__init__()
        self.checkpoint, self.directory, self.previous = checkpoint, directory, None
        directory.mkdir(parents=True, exist_ok=True)

    def on_epoch_end(self, epoch, logs=None):  # type: ignore[no-untyped-def]
        path = self.checkpoint.write(str(self.directory / f"epoch-{epoch + 1}"))
        if self.previous:
            for stale in self.directory.glob(f"{Path(self.previous).name}.*"):
                stale.unlink()
        self.previous = path


class EpochTimer(keras.callbacks.Callback):
    """Examples/s of each epoch's training steps: the clock stops when validation begins."""

    def __init__(self, examples_per_epoch: int):
        super().__init__()
        self.examples_per_epoch = examples_per_epoch
        self.epochs: list[dict[str, float]] = []
        self._began = self._ended = self._began_at = 0.0

    def on_epoch_begin(self, epoch, logs=None):  # type: ignore[no-untyped-def]
        self._ended = 0.0
        self._began = time.perf_counter()
        self._began_at = time.time()

    def on_test_begin(self, logs=None):  # type: ignore[no-untyped-def]
        self._ended = self._ended or time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):  # type: ignore[no-untyped-def]
        self._ended = self._ended or time.perf_counter()
        train_s = self._ended - self._began
        self.epochs.append({"epoch": epoch + 1, "examples_per_sec": round(self.examples_per_epoch / train_s, 2),
                            "train_seconds": round(train_s, 3), "train_began_at": self._began_at,
                            "ended_at": time.time(), "val_accuracy": (logs or {}).get("val_accuracy")})


if __name__ == "__main__":
    main()
