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
