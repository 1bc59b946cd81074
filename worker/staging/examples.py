"""Examples in memory, and the checks every format passes through before anything is written.

Labels become class ids 0..K-1 by one rule for all formats:
- non-negative integers (or integral floats) are class ids as given, when they are dense enough
  (max + 1 <= 2 x the number of distinct labels, so 1-based labels still work); class_names = "0".."max";
- anything else (strings, negative or sparse integers) maps the sorted distinct values to 0..K-1,
  and class_names records the values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from worker.staging.errors import DatasetError


@dataclass(frozen=True)
class Examples:
    x: np.ndarray  # float32 [n, *feature_shape]
    y: np.ndarray  # int64 [n], class ids 0..num_classes-1
    class_names: list[str]
    dropped: int = 0  # rows of the source left out (a CSV's missing cells under na_policy drop)
    notes: list[str] = field(default_factory=list)  # what staging did that the user should read

    @property
    def feature_shape(self) -> list[int]:
        return [int(d) for d in self.x.shape[1:]]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def make_examples(x: object, labels: object, what: str, class_names: list[str] | None = None, *,
                  dropped: int = 0, notes: list[str] | None = None) -> Examples:
    """Validated Examples from raw features and labels; `what` names the data in error messages."""
    features = _features(x, what)
    y_raw = np.asarray(labels)
    if y_raw.ndim == 2 and y_raw.shape[1] == 1:
        y_raw = y_raw[:, 0]
    if y_raw.ndim != 1:
        raise DatasetError(f"{what}: labels must be one class per example, got an array of shape {list(y_raw.shape)}")
    if len(features) != len(y_raw):
        raise DatasetError(f"{what}: {len(features)} examples of features but {len(y_raw)} labels")
    if len(features) == 0:
        raise DatasetError(f"{what} holds no examples")
    if class_names is not None:
        y, names = y_raw.astype(np.int64), class_names
    else:
        y, names = encode_labels(y_raw, what)
    distinct = np.unique(y)
    if len(distinct) < 2:
        raise DatasetError(f"{what}: classification needs at least 2 classes, found only 1")
    return Examples(features, y, names, dropped, list(notes or []))


def _features(x: object, what: str) -> np.ndarray:
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
    if len(arr) and arr[0].size == 0:
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
        y = y.astype(str)
    values, ids = np.unique(y, return_inverse=True)
    return ids.astype(np.int64).reshape(-1), [str(v) for v in values.tolist()]
