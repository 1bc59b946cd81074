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


def stratified_indices(y: np.ndarray, validation_split: float) -> dict[str, np.ndarray]:
    """Classes (issue 21): each class's share held out apart, so every class with two examples or more
    is in both splits (a plain shuffle could leave a rare class out of one, and the job failed at
    staging for it). round(n_c * split) of each class's n_c, at least 1 and at most n_c - 1; both
    splits deterministic and shuffled."""
    rng = np.random.default_rng(SHUFFLE_SEED)
    train, validation = [], []
    for c in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == c))
        take = 0 if validation_split <= 0 or len(members) < 2 else min(len(members) - 1,
                                                                        max(1, round(len(members) * validation_split)))
        validation.append(members[:take])
        train.append(members[take:])
    return {"train": rng.permutation(np.concatenate(train)), "validation": rng.permutation(np.concatenate(validation))}


def examples_split(examples: Examples, options: ConversionOptions) -> dict[str, np.ndarray]:
    """Which examples are training and which validation: by class for classes, else a plain shuffle."""
    if examples.task in ("regression", "multilabel"):
        return split_indices(len(examples.y), options.validation_split)
    return stratified_indices(examples.y, options.validation_split)


def write_splits(examples: Examples, options: ConversionOptions, out_dir: Path) -> dict[str, Split]:
    """Write shards/<split>-NNNNN-of-MMMMM.tfrecord under out_dir; paths in the result are relative to it."""
    (out_dir / DATASET_SHARDS).mkdir(parents=True, exist_ok=True)
    splits: dict[str, Split] = {}
    for name, rows in examples_split(examples, options).items():
        count = math.ceil(len(rows) / options.shard_examples)
        shards = []
        for k in range(count):
            part = rows[k * options.shard_examples : (k + 1) * options.shard_examples]
            rel = f"{DATASET_SHARDS}/{name}-{k:05d}-of-{count:05d}.tfrecord"
            write_examples(out_dir / rel, examples.x[part], examples.y[part],
                           None if examples.strings is None else examples.strings[part])
            shards.append(rel)
        if examples.task == "multilabel":  # each label's positive examples
            splits[name] = Split(int(len(rows)), shards, [int(c) for c in examples.y[rows].sum(axis=0)])
        elif examples.task == "regression":
            splits[name] = Split(int(len(rows)), shards, None)
        else:
            counts = np.bincount(examples.y[rows], minlength=examples.num_classes)
            splits[name] = Split(int(len(rows)), shards, [int(c) for c in counts])
    return splits


def train_target_stats(examples: Examples, options: ConversionOptions) -> dict[str, list[float]]:
    """A regression's targets over the training split: their mean and standard deviation (1 where a
    target does not vary there), which the trainer's model is built around (trainjobs/spec/task.py)."""
    y = examples.y[examples_split(examples, options)["train"]].astype(np.float64)
    std = y.std(axis=0)
    return {"mean": [float(v) for v in y.mean(axis=0)], "std": [float(v) if v > 0 else 1.0 for v in std]}
