"""A CSV's feature columns by type (issue 21): numeric, categorical or text.

One rule, here, for which type a column is and what its vocabulary holds; the agent builds Keras'
own preprocessing layers from the vocabularies the manifest records (agent/columns.py), so the
trained model and the served one encode a row the same way, and the served model takes raw rows.

- A column named in `dataset.options.columns` has that type.
- Otherwise: a column whose every present cell is a number is numeric (and one whose cells are
  numbers but for a few, 90% of 10 or more, is numeric with bad cells: staging names the first);
  any other is text when its cells average TEXT_MIN_WORDS words or more, else categorical.
- categorical: the training split's values, most frequent first (ties by value), at most
  CATEGORICAL_MAX_VALUES; anything else (a value first seen in validation, or at serving) falls in
  the out-of-vocabulary bucket. Keras' StringLookup, one-hot.
- text: Keras' TextVectorization, standardised as it does by default (ASCII lower case, ASCII
  punctuation removed, split on whitespace); the vocabulary is the training split's words seen at
  least TEXT_MIN_COUNT times (every word seen, when none is seen that often), most frequent first, at
  most TEXT_MAX_TOKENS; a multi-hot bag of words.
  `words` only chooses the vocabulary: training and serving both go through the Keras layer.

A missing cell of a categorical or text column is the empty text under na_policy fill (the
out-of-vocabulary bucket, no words), as errors and drops follow na_policy like any feature's.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

NUMERIC, CATEGORICAL, TEXT = "numeric", "categorical", "text"
TEXT_MIN_WORDS = 3.0
CATEGORICAL_MAX_VALUES = 1000
TEXT_MAX_TOKENS = 10_000
TEXT_MIN_COUNT = 2
OOV_TOKEN = "[UNK]"
NUMERIC_SHARE, NUMERIC_MIN_CELLS = 0.9, 10

# keras.layers.TextVectorization's standardize="lower_and_strip_punctuation" and split="whitespace":
# tf.strings.lower lowers ASCII letters only, the regex is Keras' DEFAULT_STRIP_REGEX, and
# tf.strings.split splits on runs of ASCII whitespace.
_PUNCTUATION = re.compile(r'[!"#$%&()\*\+,-\./:;<=>?@\[\\\]^_`{|}~\']')
_WHITESPACE = re.compile(r"[ \t\n\v\f\r]+")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # numeric | categorical | text
    index: int  # its place in the record's 'x' (numeric) or 'xs' (categorical and text)
    vocabulary: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        doc: dict[str, object] = {"name": self.name, "type": self.type, "index": self.index}
        if self.type != NUMERIC:
            doc["vocabulary"] = list(self.vocabulary)
        return doc


def words(text: str) -> list[str]:
    """The words TextVectorization makes of `text` by default."""
    return [w for w in _WHITESPACE.split(_PUNCTUATION.sub("", text.translate(_ASCII_LOWER))) if w]


def is_numeric(cells: np.ndarray) -> bool:
    try:
        cells.astype(np.float32)
    except ValueError:
        return False
    return True


def detected_type(cells: np.ndarray) -> str:
    """The type of a column not named in dataset.options.columns, from its present cells. A column of
    numbers but for a few cells (NUMERIC_SHARE of NUMERIC_MIN_CELLS or more) is numeric with bad
    cells, which the reader names, not a category."""
    if is_numeric(cells):
        return NUMERIC
    numbers = sum(_number(c) for c in cells.tolist())
    if len(cells) >= NUMERIC_MIN_CELLS and numbers >= NUMERIC_SHARE * len(cells):
        return NUMERIC
    present = [c for c in cells.tolist() if c]
    mean_words = sum(len(c.split()) for c in present) / max(1, len(present))
    return TEXT if mean_words >= TEXT_MIN_WORDS else CATEGORICAL


def _number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def vocabulary(kind: str, cells: np.ndarray) -> tuple[str, ...]:
    """A categorical or text column's vocabulary from its training split's cells."""
    if kind == CATEGORICAL:
        counts = Counter(c for c in cells.tolist() if c)
        limit, least = CATEGORICAL_MAX_VALUES, 1
    else:
        counts = Counter(w for c in cells.tolist() for w in words(c))
        limit, least = TEXT_MAX_TOKENS, TEXT_MIN_COUNT
    # "[UNK]" is the layers' out-of-vocabulary token, which a vocabulary may not hold.
    if not any(n >= least for n in counts.values()):
        least = 1  # little data: every word seen is better than none
    ranked = sorted((kv for kv in counts.items() if kv[1] >= least and kv[0] != OOV_TOKEN), key=lambda kv: (-kv[1], kv[0]))
    return tuple(value for value, _ in ranked[:limit])
