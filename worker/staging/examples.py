"""Examples in memory, and the checks every format passes through before anything is written.

Readers give raw labels (make_examples); `labelled` turns them into what the job's task trains on, by
one rule for all formats (trainjobs/spec/task.py):
- regression: float32 targets [n, 1], every one a finite number;
- binary: class ids 0 (negative) and 1 (positive) of exactly two label values: the larger number, or
  the text named by dataset.options.positive_label;
- classification: the rule below, after refusing a label column that looks continuous (numbers that
  are not whole, or whole numbers with nearly a value per row: "did you mean task: regression?").

Classification labels become class ids 0..K-1 by one rule for all formats:
- non-negative integers (or integral floats) are class ids as given, when they are dense enough
  (max + 1 <= 2 x the number of distinct labels, so 1-based labels still work); class_names = "0".."max";
- anything else (strings, negative or sparse integers) maps the sorted distinct values to 0..K-1,
  and class_names records the values.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from worker.staging.columns import NUMERIC, Column, vocabulary
from worker.staging.errors import DatasetError


@dataclass(frozen=True)
class Examples:
    x: np.ndarray  # float32 [n, *feature_shape]
    # The source's labels until `labelled`; then int64 [n] class ids (classification, binary) or
    # float32 [n, 1] targets (regression).
    y: np.ndarray
    class_names: list[str] | None  # names of class ids (a regression's target names); None: not yet labelled
    dropped: int = 0  # rows of the source left out (a CSV's missing cells under na_policy drop)
    notes: list[str] = field(default_factory=list)  # what staging did that the user should read
    what: str = ""  # the data, for messages
    task: str = ""  # set by `labelled`
    label_names: list[str] | None = None  # the label columns' names (a CSV's header), for targets and labels
    label_separator: str | None = None  # multilabel: each label cell is names joined by it
    target_mean: list[float] | None = None  # regression: the training split's, set by shards.write_splits' caller
    target_std: list[float] | None = None
    # A CSV's categorical and text columns (columns.py): their cells [n, k] beside x's numbers, and every
    # feature column in the file's order (vocabularies set by `with_vocabularies`); None: x is all there is.
    strings: np.ndarray | None = None
    columns: list[Column] | None = None

    @property
    def feature_shape(self) -> list[int]:
        return [int(d) for d in self.x.shape[1:]]

    @property
    def num_classes(self) -> int:
        """Class ids (classification, binary) or labels (multilabel); 0 for a regression."""
        return 0 if self.task == "regression" else len(self.class_names or ())


def make_examples(x: object, labels: object, what: str, class_names: list[str] | None = None, *,
                  dropped: int = 0, notes: list[str] | None = None, label_names: list[str] | None = None,
                  label_separator: str | None = None, strings: np.ndarray | None = None,
                  columns: list[Column] | None = None) -> Examples:
    """Validated Examples from raw features and labels ([n], or [n, k] for several label columns);
    `what` names the data in error messages."""
    features = _features(x, what, strings is not None)
    y_raw = np.asarray(labels)
    if y_raw.ndim == 2 and y_raw.shape[1] == 1:
        y_raw = y_raw[:, 0]
    if y_raw.ndim not in (1, 2):
        raise DatasetError(f"{what}: labels must be one value (or one row of values) per example, got an array of "
                           f"shape {list(y_raw.shape)}")
    if len(features) != len(y_raw):
        raise DatasetError(f"{what}: {len(features)} examples of features but {len(y_raw)} labels")
    if len(features) == 0:
        raise DatasetError(f"{what} holds no examples")
    return Examples(features, y_raw, class_names, dropped, list(notes or []), what=what, label_names=label_names,
                    label_separator=label_separator, strings=strings, columns=columns)


# A label column with more distinct whole numbers than this share of its rows (and more than
# CONTINUOUS_MIN_VALUES of them) is a measurement, not classes.
CONTINUOUS_SHARE, CONTINUOUS_MIN_VALUES = 0.3, 10


def labelled(ex: Examples, task: str, positive_label: str | None = None) -> Examples:
    """`ex` with its labels as `task` trains on them (see the module docstring)."""
    what, raw = ex.what, ex.y
    if task == "multilabel":
        return _multilabel(ex)
    if raw.ndim == 2 and task != "regression":
        raise DatasetError(f"{what}: {raw.shape[1]} label columns; task {task} has one (several are task "
                           "regression's targets or task multilabel's 0/1 columns)")
    if task == "regression":
        if ex.class_names is not None:
            raise DatasetError(f"{what}: its labels are named classes (class folders, a classification set), "
                               "not numbers; task regression needs a numeric label column (csv, npz or tfrecord)")
        try:
            y = np.asarray(raw, dtype=np.float64)
        except (TypeError, ValueError):
            raise DatasetError(f"{what}: task regression needs numeric labels, and some are text") from None
        if not np.isfinite(y).all():
            row = int(np.argwhere(~np.isfinite(y))[0][0])
            raise DatasetError(f"{what}: example {row}'s target is NaN or infinite")
        y = y.reshape(len(y), -1)
        for j in range(y.shape[1]):
            if len(np.unique(y[:, j])) < 2:
                raise DatasetError(f"{what}: target {j + 1} has the same value in every row: there is nothing to learn")
        names = ["target"] if y.shape[1] == 1 else (ex.label_names or [f"target_{j}" for j in range(y.shape[1])])
        return replace(ex, y=y.astype(np.float32), class_names=list(names), task=task)
    if ex.class_names is not None:  # the source named its classes (image folders, scikit-learn)
        y, names = raw.astype(np.int64), list(ex.class_names)
    else:
        if task == "classification":
            _refuse_continuous(raw, what)
        y, names = encode_labels(raw, what)
    if task == "binary":
        y, names = _binary(y, names, positive_label, what, numeric=ex.class_names is None and raw.dtype.kind in "biuf")
    elif len(np.unique(y)) < 2:
        raise DatasetError(f"{what}: classification needs at least 2 classes, found only 1")
    return replace(ex, y=y, class_names=names, task=task)


def _multilabel(ex: Examples) -> Examples:
    """Multi-hot float32 [n, k] from several 0/1 columns, or from one column of names joined by the
    label separator (sorted names are the labels)."""
    what, raw = ex.what, ex.y
    if ex.class_names is not None:
        raise DatasetError(f"{what}: its labels are named classes, one per example; task multilabel needs 0/1 "
                           "label columns or a column of names joined by dataset.options.label_separator")
    if raw.ndim == 1:
        if ex.label_separator is None:
            raise DatasetError(f"{what}: task multilabel needs several 0/1 label columns (dataset.options.label_column "
                               "as a list) or one column of names joined by dataset.options.label_separator")
        sets = [{n.strip() for n in str(cell).split(ex.label_separator) if n.strip()} for cell in raw.tolist()]
        names = sorted(set().union(*sets))
        if len(names) > 10_000:
            raise DatasetError(f"{what}: {len(names)} distinct label names, over the limit of 10000")
        index = {n: i for i, n in enumerate(names)}
        y = np.zeros((len(sets), len(names)), np.float32)
        for r, found in enumerate(sets):
            y[r, [index[n] for n in found]] = 1.0
    else:
        try:
            values = np.asarray(raw, dtype=np.float64)
        except (TypeError, ValueError):
            raise DatasetError(f"{what}: task multilabel's label columns hold 0 or 1, and some hold text") from None
        if not np.isin(values, (0.0, 1.0)).all():
            r, c = np.argwhere(~np.isin(values, (0.0, 1.0)))[0]
            raise DatasetError(f"{what}: example {int(r)}'s label column {int(c) + 1} is not 0 or 1")
        y = values.astype(np.float32)
        names = ex.label_names or [f"label_{j}" for j in range(y.shape[1])]
    if y.shape[1] < 2:
        raise DatasetError(f"{what}: task multilabel needs at least 2 labels, found {y.shape[1]}; one is task binary")
    if never := [j for j in range(y.shape[1]) if not y[:, j].any()]:
        raise DatasetError(f"{what}: label {never[0] + 1} of {y.shape[1]} is on no example: there is nothing to learn")
    return replace(ex, y=y, class_names=list(names), task="multilabel")


def _refuse_continuous(raw: np.ndarray, what: str) -> None:
    if raw.dtype.kind not in "iuf" or not len(raw):
        return
    values = raw.astype(np.float64)
    if not np.isfinite(values).all():
        return  # encode_labels names the example
    distinct = len(np.unique(values))
    whole = bool(np.array_equal(values, np.round(values)))
    if not whole or (distinct > CONTINUOUS_MIN_VALUES and distinct > CONTINUOUS_SHARE * len(values)):
        seen = "numbers that are not whole" if not whole else f"{distinct} distinct whole numbers in {len(values)} rows"
        raise DatasetError(f"{what}: the label column looks continuous ({seen}): a measurement to predict, not "
                           "classes; did you mean task: regression?")


def _binary(y: np.ndarray, names: list[str], positive: str | None, what: str, numeric: bool) -> tuple[np.ndarray, list[str]]:
    """Class ids 0 (negative) and 1 (positive) of exactly two label values."""
    present = np.unique(y)
    if len(present) != 2:
        raise DatasetError(f"{what}: task binary needs exactly 2 label values, found {len(present)}")
    kept = [names[int(i)] for i in present]
    if positive is None:
        if not numeric:
            raise DatasetError(f"{what}: the labels are text: name the positive one with "
                               "dataset.options.positive_label (one of the 2 label values)")
        positive = kept[1]  # numbers: the larger one (encode_labels keeps them in order)
    if positive not in kept:
        raise DatasetError(f"{what}: dataset.options.positive_label is not one of the 2 label values")
    negative = kept[0] if kept[1] == positive else kept[1]
    pos_id = int(present[kept.index(positive)])
    return (y == pos_id).astype(np.int64), [negative, positive]


def _features(x: object, what: str, has_strings: bool = False) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "biuf":
        try:
            arr = arr.astype(np.float32)
        except (TypeError, ValueError):
            raise DatasetError(f"{what}: features are not numeric (dtype {arr.dtype})") from None
    if arr.dtype.kind == "c":
        raise DatasetError(f"{what}: features are complex numbers")
    if arr.ndim == 0:
        raise DatasetError(f"{what}: features must be an array with one row per example, got a single value")
    arr = arr.astype(np.float32, copy=False)
    if arr.ndim == 1:
        arr = arr[:, None]
    if len(arr) and arr[0].size == 0 and not has_strings:
        raise DatasetError(f"{what}: each example needs at least one feature, got shape {list(arr.shape)}")
    finite = np.isfinite(arr.reshape(len(arr), -1)).all(axis=1) if arr.size else np.ones(0, bool)
    if not finite.all():
        raise DatasetError(f"{what}: example {int(np.argmin(finite))} has a NaN or infinite feature")
    return arr


def encode_labels(y: np.ndarray, what: str) -> tuple[np.ndarray, list[str]]:
    """Class ids 0..K-1 and class names for raw labels (see the module docstring)."""
    if y.dtype.kind == "b":
        y = y.astype(np.int64)
    if y.dtype.kind == "f":
        if not np.isfinite(y).all() or not np.array_equal(y, np.round(y)):
            bad = int(np.argmax(~np.isfinite(y) | (y != np.round(y))))
            raise DatasetError(f"{what}: labels must be class ids or names; example {bad}'s label is a number that is not whole")
        y = y.astype(np.int64)
    if y.dtype.kind in "iu" and len(y):
        distinct = np.unique(y)
        top = int(distinct[-1])
        if distinct[0] >= 0 and top + 1 <= 2 * len(distinct):
            return y.astype(np.int64), [str(i) for i in range(top + 1)]
    if y.dtype.kind == "O":
        # Text labels stay Python strings: astype(str) would make every label as wide as the longest.
        y = np.array([v if isinstance(v, str) else str(v) for v in y.tolist()], dtype=object)
    values, ids = np.unique(y, return_inverse=True)
    return ids.astype(np.int64).reshape(-1), [str(v) for v in values.tolist()]


def with_vocabularies(ex: Examples, train: np.ndarray) -> Examples:
    """`ex` with each categorical and text column's vocabulary, from the training rows `train`."""
    if ex.columns is None or ex.strings is None:
        return ex
    columns = []
    for at, c in enumerate(ex.columns):
        if c.type != NUMERIC:
            c = replace(c, vocabulary=vocabulary(c.type, ex.strings[train, c.index]))
            if not c.vocabulary:  # Keras' lookup layers need a vocabulary; named by position, never by its bytes
                raise DatasetError(f"{ex.what}: feature column {at + 1} ({c.type}) has no "
                                   f"{'word' if c.type == 'text' else 'value'} in any training row")
        columns.append(c)
    return replace(ex, columns=columns)
