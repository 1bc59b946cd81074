"""TFRecords already in GCS in our schema, used where they are.

Nothing is copied, but every shard is read once: the manifest needs example counts, the feature
size and the classes, and a shard that is not in our schema must fail here, not on the accelerator.
Splits come from shard names: a name with the word validation, valid, val, eval or test is
validation data. With no such shard, the last round(n * validation_split) of n >= 2 shards are
held out (whole shards: we may not rewrite the data). Labels must already be class ids 0..K-1.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from worker.staging.budget import StagingBudget
from worker.staging.errors import DatasetError
from worker.staging.example_proto import NotOurSchema
from worker.staging.manifest import Split
from worker.staging.tfrecord import iter_examples

_VALIDATION_NAME = re.compile(r"(?<![a-z])(validation|valid|val|eval|test)(?![a-z])")


@dataclass(frozen=True)
class ShardScan:
    uri: str
    examples: int
    feature_size: int | None
    labels: dict[int, int]  # examples of each class id


_STOP_EVERY = 4096  # records between checks for a stop


def scan_shard(blob: Any, uri: str, budget: StagingBudget) -> ShardScan:
    count, size = 0, None
    labels: dict[int, int] = {}
    budget.check_stop()
    with blob.open("rb") as stream:
        for x, y in iter_examples(stream, uri):
            if count % _STOP_EVERY == _STOP_EVERY - 1:
                budget.check_stop()
            if size is None:
                size = len(x)
            elif len(x) != size:
                raise DatasetError(f"{uri} record {count}: {len(x)} features where earlier records have {size}")
            if not np.isfinite(x).all():
                raise DatasetError(f"{uri} record {count} has a NaN or infinite feature")
            if not isinstance(y, int):  # a regression's float targets: not classes to use in place
                raise NotOurSchema(f"{uri} record {count} holds float targets, not a class id")
            labels[y] = labels.get(y, 0) + 1
            count += 1
    return ShardScan(uri, count, size, labels)


def scan_in_place(shards: list[tuple[Any, str]], validation_split: float,
                  budget: StagingBudget) -> tuple[list[str], list[int], dict[str, Split]]:
    """(class names, feature shape, splits) for TFRecord objects, given as (blob, gs:// URI), used in place."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        scans = list(pool.map(lambda shard: scan_shard(shard[0], shard[1], budget), shards))
    uris = [uri for _, uri in shards]
    sizes = {s.feature_size for s in scans if s.feature_size is not None}
    if not sizes:
        raise DatasetError(f"the TFRecord files at {uris[0].rsplit('/', 1)[0]}/ hold no examples")
    if len(sizes) > 1:
        raise DatasetError(f"the TFRecord files disagree on the number of features: {sorted(sizes)}")
    labels = set().union(*(s.labels for s in scans))
    if min(labels) < 0:
        raise DatasetError("TFRecords used in place need class ids 0..K-1 in 'y'; they hold a negative one")
    if len(labels) < 2:
        raise DatasetError("classification needs at least 2 classes, the TFRecords hold only 1")
    splits = _assign_splits(scans, validation_split, max(labels) + 1)
    return [str(i) for i in range(max(labels) + 1)], [sizes.pop()], splits


def _assign_splits(scans: list[ShardScan], validation_split: float, num_classes: int) -> dict[str, Split]:
    named = [_VALIDATION_NAME.search(s.uri.rsplit("/", 1)[-1].lower()) is not None for s in scans]
    if not any(named) and len(scans) >= 2:
        held = min(len(scans) - 1, round(len(scans) * validation_split))
        named = [i >= len(scans) - held for i in range(len(scans))]
    train = [s for s, v in zip(scans, named, strict=True) if not v]
    validation = [s for s, v in zip(scans, named, strict=True) if v]
    if not sum(s.examples for s in train):
        raise DatasetError("every TFRecord file with examples is named as validation data; there is nothing to train on")
    def counts(group: list[ShardScan]) -> list[int]:
        return [sum(s.labels.get(k, 0) for s in group) for k in range(num_classes)]

    return {
        "train": Split(sum(s.examples for s in train), [s.uri for s in train], counts(train)),
        "validation": Split(sum(s.examples for s in validation), [s.uri for s in validation], counts(validation)),
    }
