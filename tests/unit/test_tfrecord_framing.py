"""trainjobs/tfrecord.py: the framing staging writes and the agent reads back into memory. That
TensorFlow reads the same bytes is every e2e job's: a split held in memory goes through split_records,
a streamed one through tf.data's TFRecordDataset."""

from __future__ import annotations

import struct

import pytest

from trainjobs.tfrecord import CorruptRecords, frame, split_records



def test_records_framed_here_split_back_whole_and_in_order() -> None:
    records = [b"", b"a", b"hello world" * 100, bytes(range(256))]
    assert split_records(b"".join(frame(r) for r in records), "f") == records
    assert split_records(b"", "empty") == []


@pytest.mark.parametrize(("damage", "message"), [
    (lambda b: b[:-1], "record 1 is cut short"),
    (lambda b: b[:len(frame(b"first")) + 5], "record 1 has an incomplete header"),
    (lambda b: b[:len(frame(b"first")) + 12] + bytes([b[len(frame(b"first")) + 12] ^ 1]) + b[len(frame(b"first")) + 13:],
     "record 1 fails its checksum"),
    (lambda b: struct.pack("<Q", 7) + b[8:], "record 0's header fails its checksum"),
])
def test_a_damaged_buffer_says_which_record_and_how(damage: object, message: str) -> None:
    good = frame(b"first") + frame(b"second record")
    with pytest.raises(CorruptRecords, match=message):
        split_records(damage(good), "shard-0.tfrecord")  # type: ignore[operator]
