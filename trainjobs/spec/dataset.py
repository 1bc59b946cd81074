"""spec.dataset: where the data is, its format, and the options of each format. Staging (worker/staging/)
reads the same options, and checks the format it detects with `options_problem`, as submit does with the
format given or guessed from the source's name."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from trainjobs.spec.strict import Int, Number, StrictModel, fail

DatasetFormat = Literal["auto", "npz", "csv", "tfrecord", "image_folder"]
ColumnType = Literal["numeric", "categorical", "text"]
COLUMN_TYPES: tuple[str, ...] = ("numeric", "categorical", "text")
MAX_COLUMNS = 4096
# The shape of every data source: a program's channels are held to it too (trainjobs/spec/program.py).
SOURCE_SHAPE = re.compile(r"gs://[a-z0-9][a-z0-9._-]{1,220}/.+|https://\S+|http://\S+|file://\S+|dataset:[0-9a-f]{64}|sklearn:(digits|iris|wine|breast_cancer)|[^:\n]+")


_KEY = Annotated[str, Field(min_length=1, max_length=256)]
_SIDE = Annotated[Int, Field(ge=1, le=4096)]
# Which format reads each option; an option set for another format is refused, never ignored.
OPTION_FORMATS: dict[str, tuple[str, ...]] = {
    "header": ("csv",), "skip_rows": ("csv",), "label_column": ("csv",), "delimiter": ("csv",), "label_separator": ("csv",),
    "na_values": ("csv",), "na_policy": ("csv",), "na_fill": ("csv",), "columns": ("csv",),
    "x_key": ("npz", "tfrecord"), "y_key": ("npz", "tfrecord"),
    "features": ("tfrecord",), "image_shape": ("tfrecord",), "compression": ("tfrecord",),
    "image_size": ("image_folder",),
}


class DatasetOptions(StrictModel):
    validation_split: Number = Field(default=0.2, ge=0.0, le=0.5)
    # --- csv ---
    header: Int | Literal["none"] | None = Field(
        default=None, description="csv: the header row, counted from 0 after skip_rows (default 0), or 'none' "
        "when every row is data (columns are then named by position).")
    skip_rows: Int = Field(default=0, ge=0, le=1_000_000, description="csv: lines skipped before the header or data")
    label_column: str | Int | list[str | Int] | None = Field(
        default=None, description="csv: the label column, by header name, or by position from 0 (negative counts "
        "from the end: -1 is the last). Default 'label' with a header, the last column without.")
    delimiter: str | None = Field(default=None, min_length=1, max_length=1, description="csv: the field separator (default ',')")
    na_values: list[Annotated[str, Field(max_length=64)]] | None = Field(
        default=None, max_length=64, description="csv: cell texts that mean 'missing' (default: the empty cell)")
    na_policy: Literal["error", "drop", "fill"] = Field(
        default="error", description="csv: a missing cell fails the job naming its line and column (error), leaves "
        "its row out (drop, counted in the job's runtime), or, for features, becomes na_fill (fill)")
    na_fill: Number | None = Field(default=None, description="csv: the feature value of a missing cell under na_policy fill (default 0)")
    # --- npz and tfrecord ---
    x_key: _KEY | None = Field(default=None, description="npz: the features array (default 'x'); tfrecord: the "
                               "feature holding the example (a float or int64 list, or encoded image bytes)")
    y_key: _KEY | None = Field(default=None, description="npz: the labels array (default 'y'); tfrecord: the label "
                               "feature (int64 class ids or byte-string class names)")
    features: list[_KEY] | None = Field(default=None, min_length=1, max_length=4096, description="tfrecord: several "
                                        "float or int64 features concatenated, in this order, into the example (instead of x_key)")
    image_shape: tuple[_SIDE, _SIDE, Annotated[Int, Field(ge=1, le=4)]] | None = Field(
        default=None, description="tfrecord: [height, width, channels]; flat lists are reshaped to it, encoded images "
        "resized to it (default: the decoded size)")
    compression: Literal["auto", "none", "gzip", "zlib"] = Field(
        default="auto", description="tfrecord: auto detects GZIP and ZLIB files")
    # --- image_folder ---
    image_size: tuple[Annotated[Int, Field(ge=8, le=1024)], Annotated[Int, Field(ge=8, le=1024)]] | None = None
    shard_examples: Int = Field(default=4096, ge=64, le=1_000_000, description="examples per staged TFRecord shard")
    label_separator: str | None = Field(default=None, min_length=1, max_length=8, description=(
        "task multilabel: the label column holds the example's label names joined by this (e.g. '|'; an "
        "empty cell is no label)"))
    positive_label: str | None = Field(default=None, min_length=1, max_length=256, description=(
        "task binary: the label value that is the positive class (needed when the labels are text)"))
    columns: dict[str, ColumnType] | None = Field(default=None, description=(
        "csv: feature columns' types by header name: numeric, categorical (a vocabulary of the training split's "
        "values, one-hot, an out-of-vocabulary bucket) or text (words, bag of words). Columns not named are "
        "detected: numbers are numeric, other text categorical, or text when its cells average three words or more"))

    # Checked before the unions are tried, so a bad value gets one reason, not one per union member.
    @field_validator("header", mode="before")
    @classmethod
    def _header_row(cls, v: Any) -> Any:
        if v is None or v == "none" or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 1000):
            return v
        raise fail("header", "header is the header's row number, 0 to 1000 (after skip_rows), or 'none'")

    @field_validator("label_column", mode="before")
    @classmethod
    def _label_column(cls, v: Any) -> Any:
        def one(c: Any) -> bool:
            return (isinstance(c, str) and 1 <= len(c) <= 256) or (
                isinstance(c, int) and not isinstance(c, bool) and -10_000 <= c <= 10_000)

        if v is None or one(v):
            return v
        if isinstance(v, list) and 1 <= len(v) <= 1024 and all(one(c) for c in v) and len(set(map(str, v))) == len(v):
            return v  # several: a regression's targets, or a multilabel task's 0/1 columns
        raise fail("label_column", "label_column is a column's name (1 to 256 characters) or its position "
                   "(an integer from 0; negative counts from the end), or a list of distinct ones (task "
                   "regression's targets, task multilabel's 0/1 columns)")

    @field_validator("columns", mode="before")
    @classmethod
    def _columns(cls, v: Any) -> Any:
        if v is None:
            return v
        if not isinstance(v, dict) or not 1 <= len(v) <= MAX_COLUMNS:
            raise fail("columns", f"columns maps header names to a type ({', '.join(COLUMN_TYPES)}): 1 to "
                       f"{MAX_COLUMNS} of them")
        for name, kind in v.items():
            if not isinstance(name, str) or not 1 <= len(name) <= 256:
                raise fail("columns", "a column is named by its header text, 1 to 256 characters")
            if kind not in COLUMN_TYPES:
                raise fail(name, f"a column's type is {', '.join(COLUMN_TYPES)}, not {kind!r}")
        return v

    @field_validator("delimiter")
    @classmethod
    def _usable_delimiter(cls, v: str | None) -> str | None:
        if v is not None and v in ('"', "\r", "\n"):
            raise fail("delimiter", "the delimiter cannot be a quote or a line break")
        return v

    @model_validator(mode="after")
    def _consistent_options(self) -> DatasetOptions:
        if self.x_key is not None and self.features is not None:
            raise fail("features", "give x_key (one feature) or features (several), not both")
        if self.na_fill is not None and self.na_policy != "fill":
            raise fail("na_fill", f"na_fill is the value of a missing cell under na_policy fill, not {self.na_policy}")
        if (isinstance(self.label_column, str) or (isinstance(self.label_column, list) and any(
                isinstance(c, str) for c in self.label_column))) and self.header == "none":
            raise fail("label_column", "a CSV without a header has no column names: give label_column as a position")
        if self.columns is not None and self.header == "none":
            raise fail("columns", "columns names columns by the header; this CSV has none (header: none)")
        labels = self.label_column if isinstance(self.label_column, list) else [self.label_column or "label"]
        if self.columns is not None and (named := [c for c in labels if isinstance(c, str) and c in self.columns]):
            raise fail(f"columns.{named[0]}", "that is a label column; columns gives the features' types")
        return self

    def set_options(self) -> list[str]:
        """The format-specific options this spec sets to other than their defaults. By value, not by
        model_fields_set: a stored spec is dumped with every default written out."""
        fields = type(self).model_fields
        return [k for k in OPTION_FORMATS if getattr(self, k) != fields[k].default]

    def formats_allowed(self) -> set[str]:
        """The formats that read every option set here."""
        allowed = {"npz", "csv", "tfrecord", "image_folder"}
        for key in self.set_options():
            allowed &= set(OPTION_FORMATS[key])
        return allowed


def options_problem(options: DatasetOptions, fmt: str) -> tuple[str, str] | None:
    """(option, reason) for the first option set that format `fmt` does not read, else None. Shared by
    submit (format given or guessed from the source) and staging (the format it detected)."""
    for key in options.set_options():
        if fmt not in OPTION_FORMATS[key]:
            return key, f"{key} applies to {' and '.join(OPTION_FORMATS[key])} data, not {fmt}"
    return None


_FORMAT_BY_SUFFIX = {".csv": "csv", ".csv.gz": "csv", ".npz": "npz", ".tfrecord": "tfrecord", ".tfrecords": "tfrecord", ".tfr": "tfrecord"}


def guess_format(source: str) -> str | None:
    """The format a source's name gives away (what staging's `auto` will detect), or None."""
    if source.startswith("sklearn:"):
        return "sklearn"
    name = source.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1].lower()
    for suffix, fmt in _FORMAT_BY_SUFFIX.items():
        if name.endswith(suffix):
            return fmt
    if ".tfrecord" in name:  # TFDS-style train.tfrecord-00000-of-00008
        return "tfrecord"
    return None


class DatasetSpec(StrictModel):
    source: str = Field(
        min_length=1, max_length=2048,
        description="dataset:<sha256> (uploaded through POST /v1/datasets), https:// (public hosts), "
        "gs://BUCKET/PATH (in trainjobs' own bucket only the project's uploads and jobs), sklearn:digits "
        "(bundled data), or a worker host path / file:// inside a directory the operator allows.",
    )
    format: DatasetFormat = "auto"
    options: DatasetOptions = DatasetOptions()

    @field_validator("source")
    @classmethod
    def _source_shape(cls, v: str) -> str:
        if not SOURCE_SHAPE.fullmatch(v):
            raise fail("source", f"unsupported dataset source {v!r}")
        return v

    @model_validator(mode="after")
    def _options_match_format(self) -> DatasetSpec:
        o = self.options
        if not o.formats_allowed():
            formats = {k: OPTION_FORMATS[k] for k in o.set_options()}
            raise fail("options", "these options belong to different formats and no format reads them all: "
                       + "; ".join(f"{k}: {'/'.join(v)}" for k, v in formats.items()))
        fmt = self.format if self.format != "auto" else guess_format(self.source)
        if fmt == "sklearn":
            if o.set_options():
                raise fail("options", f"{o.set_options()[0]} does not apply to sklearn: bundled data, which has no such option")
        elif fmt is not None and (problem := options_problem(o, fmt)):
            raise fail(f"options.{problem[0]}", problem[1] + ("" if self.format != "auto" else " (the format of the source's name)"))
        return self
