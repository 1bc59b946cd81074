"""The naive baseline for bench/naive_vs_auto.py: what a user writes first. numpy arrays from an .npz
straight into `model.fit`, Keras defaults everywhere (Adam, `validation_split`, no tf.data, no
steps_per_execution, no XLA choice), then `model.save`. The model is the agent's built-in one, from
the same builder and normalised by the same first 4096 training examples, so both sides train the same
network; a timing callback (each epoch's training part, on_epoch_begin to on_test_begin, as the agent
counts it) is the only addition, and it does not change what fit does.

Usage: python bench/naive_script.py --data data.npz --test test.npz --model mlp --epochs 4 --batch 128
    --seed 7 --out result.json --save model.keras
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for the model builder only

import keras  # noqa: E402
import numpy as np  # noqa: E402

from agent.builtin_models import BUILTIN_BUILDERS  # noqa: E402
from agent.models import ModelInputs  # noqa: E402

STATS_EXAMPLES = 4096


class EpochClock(keras.callbacks.Callback):
    def __init__(self, examples: int) -> None:
        super().__init__()
        self.examples, self.epochs, self._began, self._ended = examples, [], 0.0, 0.0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._began, self._ended = time.perf_counter(), 0.0

    def on_test_begin(self, logs: dict | None = None) -> None:
        self._ended = self._ended or time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        train_s = (self._ended or time.perf_counter()) - self._began
        self.epochs.append({"epoch": epoch + 1, "train_seconds": round(train_s, 3),
                            "examples_per_sec": round(self.examples / train_s, 2),
                            "val_accuracy": float((logs or {}).get("val_accuracy", float("nan")))})


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("--data", "--test", "--out", "--save"):
        ap.add_argument(name, type=Path, required=True)
    ap.add_argument("--model", choices=sorted(BUILTIN_BUILDERS), required=True)
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    began = time.perf_counter()

    keras.utils.set_random_seed(args.seed)
    data = np.load(args.data)
    x, y = data["x"].astype("float32"), data["y"]
    classes = int(y.max()) + 1
    train_examples = len(x) - int(0.2 * len(x))  # what validation_split=0.2 leaves for training
    axes = tuple(range(x.ndim - 1))
    stats = x[:STATS_EXAMPLES]
    inputs = ModelInputs(tuple(x.shape[1:]), classes, {}, tuple(stats.mean(axis=axes).tolist()),
                         tuple(stats.var(axis=axes).tolist()))
    model = BUILTIN_BUILDERS[args.model](inputs)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    clock = EpochClock(train_examples)  # fit trains the last, partial batch too
    fit_began = time.perf_counter()
    model.fit(x, y, batch_size=args.batch, epochs=args.epochs, validation_split=0.2, callbacks=[clock], verbose=0)
    fit_s = time.perf_counter() - fit_began
    model.save(args.save)
    test = np.load(args.test)
    predicted = model.predict(test["x"].astype("float32"), batch_size=1024, verbose=0).argmax(axis=-1)
    args.out.write_text(json.dumps({
        "epochs": clock.epochs, "test_accuracy": float((predicted == test["y"]).mean()),
        "train_examples": train_examples, "fit_s": round(fit_s, 3), "process_s": round(time.perf_counter() - began, 3),
    }))


if __name__ == "__main__":
    main()
