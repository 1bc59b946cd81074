"""TensorFlow reads what staging writes, exactly. Staging itself: tests/integration/test_staging.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.staging import stage
from tests.support.staging import operator_allows_test_files  # noqa: F401 - an autouse fixture
from trainjobs import storage


@pytest.mark.tf
def test_tensorflow_parses_the_shards_exactly(bucket: str, tmp_path: Path) -> None:
    import tensorflow as tf

    n = 1000  # 200 classes of 5 examples: classes, not a measurement (worker/staging/examples.py)
    rng = np.random.default_rng(7)
    x = rng.normal(size=(n, 4, 3)).astype(np.float32) * np.float32(1e6)
    x[:, 0, 0] = np.arange(n)  # an id, to match each parsed record to its source row
    y = rng.permutation(np.arange(n) % 200)  # ids >= 128 take two-byte varints
    np.savez(tmp_path / "d.npz", x=x, y=y)
    staged = stage(str(tmp_path / "d.npz"), bucket, tmp_path / "work", options={"shard_examples": 64})
    m = staged.manifest

    local = tmp_path / "downloaded"
    storage.download_prefix(staged.uri, local)
    shape = m["feature"]["shape"]
    schema = {
        m["feature"]["key"]: tf.io.FixedLenFeature([int(np.prod(shape))], tf.float32),
        m["label"]["key"]: tf.io.FixedLenFeature([1], tf.int64),
    }
    parsed_x, parsed_y = [], []
    for split in ("train", "validation"):
        files = [str(local / s) for s in m["splits"][split]["shards"]]
        records = list(tf.data.TFRecordDataset(files).map(lambda r: tf.io.parse_single_example(r, schema)))
        assert len(records) == m["splits"][split]["examples"]
        parsed_x += [tf.reshape(r["x"], shape).numpy() for r in records]
        parsed_y += [int(r["y"][0]) for r in records]

    order = np.argsort(np.array(parsed_x)[:, 0, 0])
    assert np.array_equal(np.array(parsed_x)[order], x)
    assert np.array_equal(np.array(parsed_y)[order], y)


# Cells a table may hold: case, punctuation of every kind, tabs and line breaks, non-ASCII letters
# (which TextVectorization's lower case leaves alone), non-breaking spaces (not whitespace to it).
NASTY_CELLS = ["Great food, GREAT staff!", "  leading\tand\ntrailing  ", "Ünïcode ÉTÉ café", "a\u00a0b  c",
               "it's-a_state-of/the.art (thing)?", "", "...", "Ǆ ǅ ǆ", "中文 テキスト", "x[UNK]y"]


@pytest.mark.tf
def test_tensorflow_parses_a_csvs_cells_and_keras_makes_the_words_staging_counted(bucket: str, tmp_path: Path) -> None:
    """'xs' parses as the cells, byte for byte; TextVectorization, as the agent builds it, splits each
    cell into the words staging's vocabulary was counted from (worker/staging/columns.py)."""
    import csv

    import keras
    import tensorflow as tf

    from worker.staging.columns import words

    path = tmp_path / "notes.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["n", "note", "label"])
        writer.writerows([i, NASTY_CELLS[i % len(NASTY_CELLS)], i % 2] for i in range(40))
    staged = stage(str(path), bucket, tmp_path / "work", options={"columns": {"note": "text"}, "na_policy": "fill"})
    local = tmp_path / "downloaded"
    storage.download_prefix(staged.uri, local)
    schema = {"x": tf.io.FixedLenFeature([1], tf.float32), "xs": tf.io.FixedLenFeature([1], tf.string)}
    for split in ("train", "validation"):
        files = [str(local / s) for s in staged.manifest["splits"][split]["shards"]]
        for record in tf.data.TFRecordDataset(files):
            parsed = tf.io.parse_single_example(record, schema)
            i = int(parsed["x"][0])
            assert parsed["xs"][0].numpy().decode() == NASTY_CELLS[i % len(NASTY_CELLS)].strip()  # cells are trimmed

    split = keras.layers.TextVectorization(output_mode="int")
    split.adapt(tf.constant(NASTY_CELLS))
    vocabulary = split.get_vocabulary()
    for cell in NASTY_CELLS:
        ids = split(tf.constant([cell])).numpy()[0]
        assert [vocabulary[i] for i in ids if i] == words(cell), cell
