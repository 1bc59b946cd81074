"""Examples -> train and validation TFRecord shards on local disk, ready to upload."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from trainjobs.job_paths import DATASET_SHARDS
from worker.staging.examples import Examples
from worker.staging.manifest import Split
from worker.staging.options import SHUFFLE_SEED, ConversionOptions
from worker.staging.tfrecord import write_examples


def split_indices(n: int, validation_split: float) -> dict[str, np.ndarray]:
    """A deterministic shuffle, then the first round(n * split) examples (never all) are validation."""
    order = np.random.default_rng(SHUFFLE_SEED).permutation(n)
    n_val = min(n - 1, round(n * validation_split))
    return {"train": order[n_val:], "validation": order[:n_val]}


def write_splits(examples: Examples, options: ConversionOptions, out_dir: Path) -> dict[str, Split]:
    """Write shards/<split>-NNNNN-of-MMMMM.tfrecord under out_dir; paths in the result are relative to it."""
    (out_dir / DATASET_SHARDS).mkdir(parents=True, exist_ok=True)
    splits: dict[str, Split] = {}
    for name, rows in split_indices(len(examples.y), options.validation_split).items():
        count = math.ceil(len(rows) / options.shard_examples)
        shards = []
        for k in range(count):
            part = rows[k * options.shard_examples : (k + 1) * options.shard_examples]
            rel = f"{DATASET_SHARDS}/{name}-{k:05d}-of-{count:05d}.tfrecord"
            write_examples(out_dir / rel, examples.x[part], examples.y[part])
            shards.append(rel)
        if examples.task == "regression":
            splits[name] = Split(int(len(rows)), shards, None)
        else:
            counts = np.bincount(examples.y[rows], minlength=examples.num_classes)
            splits[name] = Split(int(len(rows)), shards, [int(c) for c in counts])
    return splits


def train_target_stats(examples: Examples, options: ConversionOptions) -> dict[str, list[float]]:
    """A regression's targets over the training split: their mean and standard deviation (1 where a
    target does not vary there), which the trainer's model is built around (trainjobs/spec/task.py)."""
    y = examples.y[split_indices(len(examples.y), options.validation_split)["train"]].astype(np.float64)
    std = y.std(axis=0)
    return {"mean": [float(v) for v in y.mean(axis=0)], "std": [float(v) if v > 0 else 1.0 for v in std]}
