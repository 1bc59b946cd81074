"""manifest.json: what the training agent reads to find and parse a staged dataset.

    {"format_version": 1, "sha256": "...", "source": "sklearn:digits", "num_classes": 10,
     "class_names": ["0", ...],
     "feature": {"key": "x", "shape": [8, 8, 1], "dtype": "float32"},
     "label": {"key": "y", "dtype": "int64"},
     "splits": {"train": {"examples": 1438, "shards": ["shards/train-00000-of-00001.tfrecord"]},
                "validation": {"examples": 359, "shards": [...]}},
     "in_place": false, "source_format": "sklearn", "options": {...}}

A regression (`"task": "regression"`, trainjobs/spec/task.py) has no classes: its label is
{"key": "y", "dtype": "float32", "shape": [1], "names": ["target"], "mean": [...], "std": [...]}, the
training split's mean and standard deviation, and each record's 'y' is a float_list. A multilabel task's
'y' is a float_list of 0/1, one per label (class_names; class_counts count each label's positives). A
binary task's class_names are [negative, positive]. Manifests without "task" are classification.

A CSV with categorical or text columns (columns.py) also has, in "feature", "strings_key": "xs" (each
record's bytes_list of those columns' cells, UTF-8) and "columns": every feature column in the file's
order, {"name", "type": numeric|categorical|text, "index"} (its place in 'x' for numbers, in 'xs' for
the others) and, for the others, the training split's "vocabulary". 'x' then holds the numeric columns.

Shard paths are relative to the manifest's folder, or absolute gs:// URIs when the data is used in
place. Each record is a tf.train.Example in our schema (example_proto.py): parse 'x' as
FixedLenFeature([prod(shape)], float32) and reshape to `shape`; 'y' as FixedLenFeature([1], int64).
Each split also counts its examples of each class id (`class_counts`), and the manifest says how
many source rows staging left out (`dropped_examples`, e.g. a CSV's rows with missing cells under
na_policy drop) and why (`notes`). A validation split may hold 0 examples and no shards (validation_split 0). The manifest is
written last: when it exists, every shard it names exists too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.staging.options import ConversionOptions

FORMAT_VERSION = 1


@dataclass(frozen=True)
class Split:
    examples: int
    shards: list[str]
    class_counts: list[int] | None = None  # examples of each class id; None when not counted


@dataclass(frozen=True)
class Provenance:
    """What staging did to the source's rows, for the job's record."""

    dropped_examples: int = 0
    notes: tuple[str, ...] = ()


def build_manifest(
    *, sha256: str, source: str, source_format: str, class_names: list[str], feature_shape: list[int],
    splits: dict[str, Split], options: ConversionOptions, in_place: bool, provenance: Provenance = Provenance(),
    task: str = "classification", targets: dict[str, list[float]] | None = None,
    columns: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    regression = task == "regression"
    if regression:
        label: dict[str, Any] = {"key": "y", "dtype": "float32", "shape": [len(class_names)], "names": class_names,
                                 **(targets or {})}
    elif task == "multilabel":
        label = {"key": "y", "dtype": "float32", "shape": [len(class_names)]}
    else:
        label = {"key": "y", "dtype": "int64"}
    return {
        "format_version": FORMAT_VERSION,
        "sha256": sha256,
        "source": source,
        "task": task,
        "num_classes": 0 if regression else len(class_names),
        "class_names": [] if regression else class_names,
        "feature": {"key": "x", "shape": feature_shape, "dtype": "float32",
                    **({"strings_key": "xs", "columns": columns} if columns else {})},
        "label": label,
        "splits": {name: {"examples": s.examples, "shards": s.shards, "class_counts": s.class_counts}
                   for name, s in splits.items()},
        "in_place": in_place,
        "source_format": source_format,
        "options": options.as_dict(),
        "dropped_examples": provenance.dropped_examples,
        "notes": list(provenance.notes),
    }
