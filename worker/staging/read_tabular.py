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
_AT_ROW = re.compile(r"at row (\d+), column (\d+)")


def read_npz(path: Path, x_key: str, y_key: str) -> Examples:
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [k for k in (x_key, y_key) if k not in data.files]
            if missing:
                raise DatasetError(f"{path.name} has no array {missing[0]!r} (it holds {len(data.files)}); "
                                   "dataset.options.x_key and y_key name the arrays to use")
            x, y = data[x_key], data[y_key]
    except DatasetError:
        raise
    except ValueError:  # object arrays need pickle, which we never load from user data
        raise DatasetError(f"{path.name} is not a readable .npz file (it holds pickled objects or is malformed)") from None
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise DatasetError(f"{path.name} is not a readable .npz file ({type(exc).__name__})") from None
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
                # Never list the header: it is the file's first line, whatever the file is.
                raise DatasetError(f"{path.name} has no label column {label_column!r} in its header (line 1, "
                                   f"{len(header)} columns); set dataset.options.label_column")
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
    x = _csv_features(path, feature_cols)
    return make_examples(x, _numeric_if_possible(labels), path.name)


def _csv_features(path: Path, cols: list[int]) -> np.ndarray:
    # numpy's C parser: fast, and its errors name the row and column of the bad value. Messages give
    # the line and column, never the value or the column's name: both are the file's bytes.
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "input contained no data" is reported by make_examples
            return np.loadtxt(path, delimiter=",", skiprows=1, usecols=cols, dtype=np.float32, ndmin=2, quotechar='"', encoding="utf-8")
    except ValueError as exc:
        at = _AT_ROW.search(str(exc))
        if at is None:
            raise DatasetError(f"{path.name} is not a well-formed CSV file") from None
        # numpy counts data rows from 0 after the header (line 1) and file columns from 1.
        line, column = int(at.group(1)) + 2, int(at.group(2))
        if str(exc).startswith("could not convert"):
            raise DatasetError(f"{path.name} line {line}, column {column}: a feature that is not a number") from None
        raise DatasetError(f"{path.name} is not a well-formed CSV file (line {line}, column {column})") from None


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
