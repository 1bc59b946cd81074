"""npz, csv and scikit-learn's bundled data sets -> Examples."""

from __future__ import annotations

import csv
import re
import warnings
import zipfile
from pathlib import Path

import numpy as np

from worker.staging.errors import DatasetError, short
from worker.staging.examples import Examples, make_examples

SKLEARN_DATASETS = ("digits", "iris", "wine", "breast_cancer")
_NOT_A_NUMBER = re.compile(r"could not convert string '(.*)' to float32 at row \d+, column (\d+)")


def read_npz(path: Path, x_key: str, y_key: str) -> Examples:
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [k for k in (x_key, y_key) if k not in data.files]
            if missing:
                raise DatasetError(f"{path.name} has no array {missing[0]!r}; its arrays are: {', '.join(data.files) or 'none'}")
            x, y = data[x_key], data[y_key]
    except DatasetError:
        raise
    except ValueError as exc:  # object arrays need pickle, which we never load from user data
        raise DatasetError(f"{path.name}: {exc}") from None
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise DatasetError(f"{path.name} is not a readable .npz file ({exc})") from None
    return make_examples(x, y, path.name)


def read_csv(path: Path, label_column: str) -> Examples:
    """A header row, then one example per row; every column but the label is a numeric feature."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = [h.strip() for h in next(reader, [])]
            if not header:
                raise DatasetError(f"{path.name} is empty: a CSV needs a header row naming its columns")
            if label_column not in header:
                raise DatasetError(f"{path.name} has no label column {label_column!r}; its columns are: {', '.join(header)}")
            at = header.index(label_column)
            labels = []
            for row in reader:
                if row and len(row) != len(header):
                    raise DatasetError(
                        f"{path.name} is not a well-formed CSV file: line {reader.line_num} has {len(row)} fields, the header {len(header)}"
                    )
                if row:
                    labels.append(row[at].strip())
    except UnicodeDecodeError:
        raise DatasetError(f"{path.name} is not a UTF-8 text CSV file") from None
    feature_cols = [i for i in range(len(header)) if i != at]
    if not feature_cols:
        raise DatasetError(f"{path.name} has only the label column {label_column!r}: no feature columns")
    if not labels:
        raise DatasetError(f"{path.name} holds no examples (only a header row)")
    x = _csv_features(path, feature_cols, header)
    return make_examples(x, _numeric_if_possible(labels), path.name)


def _csv_features(path: Path, cols: list[int], header: list[str]) -> np.ndarray:
    # numpy's C parser: fast, and its errors name the row and column of the bad value.
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "input contained no data" is reported by make_examples
            return np.loadtxt(path, delimiter=",", skiprows=1, usecols=cols, dtype=np.float32, ndmin=2, quotechar='"', encoding="utf-8")
    except ValueError as exc:
        bad = _NOT_A_NUMBER.search(str(exc))
        if bad:  # numpy numbers file columns from 1
            column = header[int(bad.group(2)) - 1]
            raise DatasetError(f"{path.name}: feature column {column!r} is not numeric: {short(bad.group(1))}") from None
        raise DatasetError(f"{path.name} is not a well-formed CSV file: {exc}") from None


def _numeric_if_possible(labels: list[str]) -> np.ndarray:
    """'3' is class 3, not the string '3' (which would sort '10' before '2')."""
    try:
        return np.asarray(labels, dtype=np.float64)
    except ValueError:
        return np.asarray(labels)


def read_sklearn(name: str) -> Examples:
    """scikit-learn's bundled data sets: shipped inside the package, so nothing is downloaded."""
    from sklearn import datasets  # lazy: scikit-learn is heavy and only this source needs it

    if name not in SKLEARN_DATASETS:
        raise DatasetError(f"unknown scikit-learn data set {short(name)}; known: {', '.join(SKLEARN_DATASETS)}")
    bunch = getattr(datasets, f"load_{name}")()
    x = np.asarray(bunch.data, dtype=np.float32)
    if name == "digits":  # 8x8 grey images with pixel values 0..16: make them images in [0, 1]
        x = (x / 16.0).reshape(-1, 8, 8, 1)
    names = [str(n) for n in bunch.target_names]
    return make_examples(x, bunch.target, f"sklearn:{name}", class_names=names)
