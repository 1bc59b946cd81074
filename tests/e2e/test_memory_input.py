"""A split held in memory (agent/data.py's _parsed_split) is read without tf.data, in the order tf.data's
interleave of its shards gives: a seed gives the batches it gave when tf.data read them."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainjobs.tfrecord import frame, split_records
from agent.data import INTERLEAVE_CYCLE, Split, _records, interleaved

pytestmark = pytest.mark.tf


@pytest.mark.parametrize("sizes", [(5,), (5, 2, 7), (3, 0, 4, 1), tuple(range(1, INTERLEAVE_CYCLE + 1))])
def test_the_records_come_in_tf_datas_interleaved_order(tmp_path: Path, sizes: tuple[int, ...]) -> None:
    files = []
    for i, n in enumerate(sizes):
        path = tmp_path / f"shard-{i}.tfrecord"
        path.write_bytes(b"".join(frame(f"file {i} record {j}".encode()) for j in range(n)))
        files.append(path)
    split = Split(sum(sizes), tuple(files))
    ours = interleaved([split_records(f.read_bytes(), f.name) for f in files])
    assert ours == [r.numpy() for r in _records(split)]
    assert sorted(ours) == sorted(f"file {i} record {j}".encode() for i, n in enumerate(sizes) for j in range(n))
