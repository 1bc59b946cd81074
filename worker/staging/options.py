"""The conversion options with every default filled in: what the readers use, what the content hash
covers and what the manifest records, so a default that changes can never reuse an old dataset."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from trainjobs.spec import DatasetOptions

SHUFFLE_SEED = 20240601  # fixed: the same data and options always give the same split


@dataclass(frozen=True)
class CsvOptions:
    header: int | None = 0  # the header row after skip_rows; None: every row is data
    skip_rows: int = 0
    label_column: str | int | tuple[str | int, ...] | None = None  # None: 'label' with a header, the last column without
    label_separator: str | None = None  # multilabel: one column of names joined by it
    delimiter: str = ","
    na_values: tuple[str, ...] = ("",)
    na_policy: str = "error"  # error | drop | fill
    na_fill: float = 0.0
    columns: tuple[tuple[str, str], ...] | None = None  # (name, type) named by dataset.options.columns, sorted


@dataclass(frozen=True)
class TfrecordOptions:
    x_key: str | None = None  # None: 'x', else the image layout's 'image/encoded'
    y_key: str | None = None  # None: 'y', else 'image/class/label'
    features: tuple[str, ...] | None = None
    image_shape: tuple[int, int, int] | None = None
    compression: str = "auto"  # auto | none | gzip | zlib

    @property
    def is_default(self) -> bool:
        return self == TfrecordOptions()


@dataclass(frozen=True)
class ConversionOptions:
    validation_split: float
    shard_examples: int
    label_column: str = "label"  # kept for the content hash of data staged before CsvOptions
    x_key: str = "x"
    y_key: str = "y"
    image_size: tuple[int, int] = (32, 32)  # (height, width)
    csv: CsvOptions = CsvOptions()
    tfrecord: TfrecordOptions = TfrecordOptions()
    task: str = "classification"  # trainjobs/spec/task.py: how the labels are read
    positive_label: str | None = None  # task binary
    # The spec's options, to refuse those the detected format does not read; not part of the hash.
    spec: DatasetOptions | None = field(default=None, compare=False)

    @classmethod
    def from_spec(cls, o: DatasetOptions, task: str = "classification") -> ConversionOptions:
        csv = CsvOptions(
            header=None if o.header == "none" else (o.header or 0), skip_rows=o.skip_rows,
            label_column=tuple(o.label_column) if isinstance(o.label_column, list) else o.label_column,
            label_separator=o.label_separator, delimiter=o.delimiter or ",",
            na_values=tuple(o.na_values) if o.na_values is not None else ("",),
            na_policy=o.na_policy, na_fill=o.na_fill if o.na_fill is not None else 0.0,
            columns=tuple(sorted(o.columns.items())) if o.columns else None,
        )
        tfrecord = TfrecordOptions(
            x_key=o.x_key, y_key=o.y_key, features=tuple(o.features) if o.features else None,
            image_shape=(o.image_shape[0], o.image_shape[1], o.image_shape[2]) if o.image_shape else None,
            compression=o.compression,
        )
        return cls(
            validation_split=o.validation_split,
            shard_examples=o.shard_examples,
            label_column=o.label_column if isinstance(o.label_column, str) else cls.label_column,
            x_key=o.x_key or cls.x_key,
            y_key=o.y_key or cls.y_key,
            image_size=(o.image_size[0], o.image_size[1]) if o.image_size else cls.image_size,
            csv=csv,
            tfrecord=tfrecord,
            task=task,
            positive_label=o.positive_label,
            spec=o,
        )

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        del d["spec"]
        # Added with tasks (issue 21): left out at their defaults, so data staged before keeps its hash.
        for key, default in (("task", "classification"), ("positive_label", None)):
            if d[key] == default:
                del d[key]
        for key in ("label_separator", "columns"):
            if d["csv"][key] is None:
                del d["csv"][key]
        # As JSON has it (tuples become lists), so a manifest compares equal once stored and read back.
        loaded: dict[str, Any] = json.loads(json.dumps(d))
        return loaded
