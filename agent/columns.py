"""A CSV's named columns as the model sees them (issue 21): Keras' own preprocessing layers, built
from the vocabularies staging recorded (worker/staging/columns.py, the manifest's feature.columns).

The same encoder runs in the input pipeline while training (on the host's CPU, so a TPU never
sees a string) and in front of the exported model, whose signature takes raw rows: one tensor [n]
per column, named as `input_names` says, strings for categorical and text columns, float32 for
numbers. Numeric columns pass through (the built-ins' Normalization standardises them);
categorical ones become StringLookup one-hots (index 0: out of vocabulary); text columns
TextVectorization multi-hot bags of words (index 0: words out of vocabulary). The encoded vector is
the columns' encodings side by side, in the file's order: what a model builder's input_shape counts.
"""

from __future__ import annotations

import re
from typing import Any

NUMERIC = "numeric"
_NOT_NAME = re.compile(r"[^A-Za-z0-9_]")


def input_names(columns: tuple[dict[str, Any], ...]) -> list[str]:
    """Each column's input name in the served signature: its header name where it is a valid one
    (ASCII letters, digits and _, starting with a letter: a SavedModel signature turns anything else
    into _ anyway), else the name with other characters as _ and `c_` in front where it does not start
    with a letter; a name taken twice gets _2, _3."""
    names: list[str] = []
    for c in columns:
        name = _NOT_NAME.sub("_", c["name"]) or "column"
        if not ("a" <= name[0].lower() <= "z"):
            name = f"c_{name}"
        base, k = name, 2
        while name in names:
            name, k = f"{base}_{k}", k + 1
        names.append(name)
    return names


def encoded_width(columns: tuple[dict[str, Any], ...]) -> int:
    """The encoded vector's length: 1 per number, vocabulary + 1 (out of vocabulary) per other column."""
    return sum(1 if c["type"] == NUMERIC else len(c["vocabulary"]) + 1 for c in columns)


def encoder(columns: tuple[dict[str, Any], ...]) -> Any:
    """A Keras layer taking {input name: [n] tensor} and returning the float32 [n, encoded_width] encoding."""
    import keras
    import tensorflow as tf

    names = input_names(columns)

    class ColumnEncoder(keras.layers.Layer):
        def __init__(self) -> None:
            super().__init__(name="columns", dtype="float32")
            # Only layers in the tracked list: the images' Keras 3.4 finds lookup tables to export by
            # walking it, and a None among them hides them.
            self.lookups = []
            self.kinds = tuple(c["type"] for c in columns)
            for name, c in zip(names, columns, strict=True):
                if c["type"] == "categorical":
                    self.lookups.append(keras.layers.StringLookup(
                        vocabulary=list(c["vocabulary"]), num_oov_indices=1, output_mode="one_hot",
                        name=f"lookup_{name}"))
                elif c["type"] == "text":
                    self.lookups.append(keras.layers.TextVectorization(
                        vocabulary=list(c["vocabulary"]), output_mode="multi_hot", name=f"words_{name}"))

        def call(self, inputs: dict[str, Any]) -> Any:
            parts, lookups = [], iter(self.lookups)
            for name, kind in zip(names, self.kinds, strict=True):
                value = inputs[name]
                if kind == NUMERIC:
                    parts.append(tf.reshape(tf.cast(value, tf.float32), (-1, 1)))
                else:  # trimmed, as staging trims a CSV's cells
                    parts.append(tf.cast(next(lookups)(tf.strings.strip(tf.reshape(value, (-1,)))), tf.float32))
            return tf.concat(parts, axis=-1)

    layer = ColumnEncoder()
    # Called once on no rows, so it is built (an export tracks only built layers) wherever it is used.
    layer({name: tf.zeros((0,), spec.dtype) for name, spec in input_signature(columns).items()})
    return layer


def named_columns(columns: tuple[dict[str, Any], ...], numbers: Any, strings: Any) -> dict[str, Any]:
    """{input name: [n] tensor} from a parsed batch: the numeric columns' `numbers` [n, a] and the
    others' `strings` [n, b] (the record's 'x' and 'xs')."""
    return {name: (numbers if c["type"] == NUMERIC else strings)[:, c["index"]]
            for name, c in zip(input_names(columns), columns, strict=True)}


def input_signature(columns: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """The served model's inputs: a [None] tensor per column, named by input_names."""
    import tensorflow as tf

    return {name: tf.TensorSpec((None,), tf.float32 if c["type"] == NUMERIC else tf.string, name=name)
            for name, c in zip(input_names(columns), columns, strict=True)}


def inputs_doc(columns: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    """labels.json's `inputs`: what the served model takes, in the encoding's order (the TFLite model
    takes the encoded vector: these vocabularies, an out-of-vocabulary slot first, side by side)."""
    out = []
    for name, c in zip(input_names(columns), columns, strict=True):
        entry: dict[str, Any] = {"name": name, "column": c["name"], "type": c["type"],
                                 "dtype": "float32" if c["type"] == NUMERIC else "string"}
        if c["type"] != NUMERIC:
            entry["vocabulary"] = list(c["vocabulary"])
        out.append(entry)
    return out
