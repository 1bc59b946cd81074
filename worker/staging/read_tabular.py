"""npz, csv and scikit-learn's bundled data sets -> Examples."""

from __future__ import annotations

import csv
import zipfile
from array import array
from dataclasses import replace
from pathlib import Path

import numpy as np

from worker.staging.columns import CATEGORICAL, NUMERIC, TEXT, Column, detected_type
from worker.staging.errors import DatasetError, short
from worker.staging.examples import Examples, make_examples
from worker.staging.options import CsvOptions

SKLEARN_DATASETS = ("digits", "iris", "wine", "breast_cancer")


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


def read_csv(path: Path, o: CsvOptions) -> Examples:
    """One example per row; every column but the label column(s) is a feature: numeric, categorical or
    text (columns.py), the numbers in x and the others' cells in strings (see CsvOptions).

    Messages name the file's line and column (from 1), never a value or a column's name: both are
    the file's bytes."""
    header, cells, lines = _csv_cells(path, o)
    if header is None and not len(cells):
        raise DatasetError(f"{path.name} holds no examples")
    width = len(header) if header is not None else cells.shape[1]
    # First: a header without the label says more than no rows.
    wanted = o.label_column if isinstance(o.label_column, tuple) else (o.label_column,)
    ats = [_label_index(path.name, replace(o, label_column=c), header, width) for c in wanted]
    if len(set(ats)) != len(ats):
        raise DatasetError(f"dataset.options.label_column names one column of {path.name} twice")
    if not len(cells):
        raise DatasetError(f"{path.name} holds no examples (only a header row)")
    feature_cols = [i for i in range(width) if i not in ats]
    if not feature_cols:
        raise DatasetError(f"{path.name} has only label columns: no feature columns")
    missing = np.isin(cells, np.asarray(o.na_values, dtype=str)) if o.na_values else np.zeros(cells.shape, bool)
    keep = np.ones(len(cells), bool)
    # An empty cell of names joined by label_separator is an example without labels, not a missing one.
    label_cells_missing = missing[:, ats] if o.label_separator is None else np.zeros((len(cells), len(ats)), bool)
    feature_missing = missing[:, feature_cols]
    if label_cells_missing.any() and o.na_policy != "drop":
        r, c = np.argwhere(label_cells_missing)[0]
        raise DatasetError(f"{path.name} line {lines[r]}, column {ats[c] + 1}: the label is missing; fix the file or "
                           "set dataset.options.na_policy to drop to leave such rows out")
    label_missing = np.asarray(label_cells_missing.any(axis=1))
    if feature_missing.any() and o.na_policy == "error":
        r, c = np.argwhere(feature_missing)[0]
        raise DatasetError(f"{path.name} line {lines[r]}, column {feature_cols[c] + 1}: a missing feature; set "
                           "dataset.options.na_policy to drop (leave the row out) or fill (use na_fill)")
    if o.na_policy == "drop":
        keep = ~(label_missing | feature_missing.any(axis=1))
    dropped = int((~keep).sum())
    if not keep.any():
        raise DatasetError(f"{path.name}: every row has a missing cell, so na_policy drop leaves no examples")
    kept = cells if keep.all() else cells[keep]  # pointers only: the cells themselves are not copied
    block, absent = kept[:, feature_cols], feature_missing[keep]
    kinds = _column_types(path.name, o, header, feature_cols, block, absent)
    num = [j for j, k in enumerate(kinds) if k == NUMERIC]
    text = [j for j, k in enumerate(kinds) if k != NUMERIC]
    numbers = np.where(absent[:, num], "nan", block[:, num]) if o.na_policy == "fill" else block[:, num]
    x = _numbers(path.name, numbers, [lines[i] for i in np.flatnonzero(keep)], [feature_cols[j] for j in num])
    if o.na_policy == "fill":
        x = np.where(absent[:, num], np.float32(o.na_fill), x)
    columns = strings = None
    if text:  # categorical or text columns: the data's columns are the served model's inputs
        strings = np.where(absent[:, text], "", block[:, text])
        at = {j: i for i, j in enumerate(num)} | {j: i for i, j in enumerate(text)}
        columns = [Column(_column_name(header, c), kinds[j], at[j]) for j, c in enumerate(feature_cols)]
    labels = kept[:, ats[0]] if len(ats) == 1 else kept[:, ats]
    if o.label_separator is not None:
        labels = np.where(missing[keep][:, ats[0]], "", labels)  # na_values mean no labels too
    notes = []
    if dropped:
        notes.append(f"{dropped} of {len(cells)} rows of {path.name} left out for a missing cell (na_policy drop)")
    if o.na_policy == "fill" and (filled := int(feature_missing.sum())):
        notes.append(f"{filled} missing feature cells of {path.name} set to {o.na_fill:g} (na_policy fill)")
    if columns is not None:
        kinds_seen = ", ".join(f"{kinds.count(k)} {k}" for k in (NUMERIC, CATEGORICAL, TEXT) if k in kinds)
        notes.append(f"feature columns of {path.name}: {kinds_seen} (dataset.options.columns names a column's type)")
    names = [header[i] for i in ats] if header is not None else [f"label_{i}" for i in ats]
    return make_examples(x, labels if o.label_separator is not None else _numeric_if_possible(labels), path.name,
                         dropped=dropped, notes=notes, label_names=names, label_separator=o.label_separator,
                         strings=strings, columns=columns)


def _column_name(header: list[str] | None, at: int) -> str:
    return header[at] if header is not None else f"column_{at}"


def _column_types(name: str, o: CsvOptions, header: list[str] | None, feature_cols: list[int], block: np.ndarray,
                  absent: np.ndarray) -> list[str]:
    """Each feature column's type: as dataset.options.columns names it, else detected (columns.py)."""
    named = dict(o.columns or ())
    for column in named:
        if header is None or column not in header:
            raise DatasetError(f"dataset.options.columns names {short(column)}, which is not a column of {name}'s "
                               f"header ({len(header or ())} columns)")
        if header.index(column) not in feature_cols:
            raise DatasetError(f"dataset.options.columns names {short(column)}, a label column of {name}: "
                               "columns gives the features' types")
    kinds = []
    for j, c in enumerate(feature_cols):
        given = named.get(_column_name(header, c))
        kinds.append(given or detected_type(block[~absent[:, j], j]))
    return kinds


def _csv_cells(path: Path, o: CsvOptions) -> tuple[list[str] | None, np.ndarray, array[int]]:
    """(header or None, the data rows' stripped cells [rows, columns], each row's line number in the file).

    The cells are an object array of Python strings, never a fixed-width unicode one: numpy sizes
    every cell of those by the longest, so one long cell multiplied the whole file's memory (issue 36:
    a 1.4 KB .csv.gz cost 3.7 GB). Each cell costs its own characters plus a string object's header
    and a pointer; one cell is at most the csv module's field limit."""
    rows: list[list[str]] = []
    lines: array[int] = array("q")
    header: list[str] | None = None
    reader = None
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:  # -sig: Excel starts its CSVs with a BOM
            for _ in range(o.skip_rows):
                if not f.readline():
                    raise DatasetError(f"{path.name} has fewer than skip_rows={o.skip_rows} lines")
            reader = csv.reader(f, delimiter=o.delimiter)
            records = 0
            width = None
            for row in reader:
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue  # blank lines separate nothing
                line = o.skip_rows + reader.line_num
                if o.header is not None and records < o.header:
                    records += 1
                    continue
                if o.header is not None and header is None:
                    header, width = [h.strip() for h in row], len(row)
                    records += 1
                    continue
                if width is None:
                    width = len(row)
                if len(row) != width:
                    what = "the header" if header is not None else f"line {lines[0]}"
                    raise DatasetError(f"{path.name} is not a well-formed CSV file: line {line} has {len(row)} "
                                       f"fields, {what} {width}; check dataset.options.delimiter and skip_rows")
                rows.append([cell.strip() for cell in row])  # strip() returns the cell itself when it can
                lines.append(line)
    except UnicodeDecodeError:
        raise DatasetError(f"{path.name} is not a UTF-8 text CSV file") from None
    except csv.Error as exc:
        if reader is not None and "field larger than field limit" in str(exc):
            # The parser stops inside the cell, before it knows the cell's column.
            raise DatasetError(f"{path.name} line {o.skip_rows + reader.line_num}: a cell longer than "
                               f"{csv.field_size_limit()} characters, the most staging reads from one cell") from None
        raise DatasetError(f"{path.name} is not a well-formed CSV file ({type(exc).__name__})") from None
    if o.header is not None and header is None:
        raise DatasetError(f"{path.name} is empty: expected a header row (dataset.options.header is "
                           f"{o.header}; set it to 'none' when every row is data)")
    cells = np.empty((len(rows), width or 0), dtype=object)
    for i in range(len(rows) - 1, -1, -1):  # each row's list freed as its cells move
        cells[i] = rows.pop()
    return header, cells, lines


def _label_index(name: str, o: CsvOptions, header: list[str] | None, width: int) -> int:
    wanted = o.label_column
    if wanted is None:
        wanted = "label" if header is not None else -1
    if isinstance(wanted, int):
        at = wanted + width if wanted < 0 else wanted
        if not 0 <= at < width:
            raise DatasetError(f"dataset.options.label_column {wanted} is outside the {width} columns of {name}")
        return at
    if header is None:
        raise DatasetError("a CSV without a header has no column names: give dataset.options.label_column as a position")
    if wanted not in header:
        # Never list the header: it is a line of the file, whatever the file is.
        raise DatasetError(f"{name} has no label column {short(wanted)} in its header ({width} columns); set "
                           "dataset.options.label_column to its name or position (-1: the last)")
    return header.index(wanted)


def _numbers(name: str, block: np.ndarray, lines: list[int], cols: list[int]) -> np.ndarray:
    """float32 features from the text cells; a cell that is not a number is named by line and column."""
    try:
        return block.astype(np.float32)
    except ValueError:
        pass
    for c in range(block.shape[1]):
        try:
            block[:, c].astype(np.float32)
        except ValueError:
            for r, cell in enumerate(block[:, c].tolist()):
                try:
                    float(cell)
                except ValueError:
                    raise DatasetError(f"{name} line {lines[r]}, column {cols[c] + 1}: a feature that is not a "
                                       "number in a column of numbers (dataset.options.na_values lists the texts "
                                       "that mean missing; dataset.options.columns can name the column "
                                       "categorical)") from None
    raise DatasetError(f"{name} is not a well-formed CSV file")


def _numeric_if_possible(labels: np.ndarray) -> np.ndarray:
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
