"""TFRecord framing, shared by staging (worker/staging/tfrecord.py writes and reads shards) and the
agent (agent/data.py reads a whole split into memory). Each record is

    uint64 length | uint32 masked_crc32c(length) | data[length] | uint32 masked_crc32c(data)

all little-endian (tensorflow/core/lib/io/record_writer.h). The CRC is Castagnoli, "masked" so that
a CRC of data that itself holds CRCs stays well distributed.
"""

from __future__ import annotations

import struct

import google_crc32c

_MASK_DELTA = 0xA282EAD8
_HEAD = struct.Struct("<QI")
_CRC = struct.Struct("<I")


class CorruptRecords(ValueError):
    """A TFRecord buffer that is cut short or fails a checksum."""


def masked_crc(data: bytes) -> int:
    crc = int(google_crc32c.value(data))
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    length = struct.pack("<Q", len(record))
    return length + struct.pack("<I", masked_crc(length)) + record + struct.pack("<I", masked_crc(record))


def split_records(buffer: bytes, name: str) -> list[bytes]:
    """Every record of an uncompressed TFRecord file's bytes, both checksums verified as TensorFlow's
    reader verifies them. One pass over bytes in memory: for a split of 80,000 records this takes a
    tenth of the time tf.data takes to hand them over in batches (agent/data.py)."""
    records: list[bytes] = []
    pos, end = 0, len(buffer)
    while pos < end:
        if end - pos < 12:
            raise CorruptRecords(f"{name} is truncated: record {len(records)} has an incomplete header")
        length, length_crc = _HEAD.unpack_from(buffer, pos)
        if masked_crc(buffer[pos:pos + 8]) != length_crc:
            raise CorruptRecords(f"{name} is corrupt: record {len(records)}'s header fails its checksum")
        start = pos + 12
        stop = start + length
        if stop + 4 > end:
            raise CorruptRecords(f"{name} is truncated: record {len(records)} is cut short")
        data = buffer[start:stop]
        if masked_crc(data) != _CRC.unpack_from(buffer, stop)[0]:
            raise CorruptRecords(f"{name} is corrupt: record {len(records)} fails its checksum")
        records.append(data)
        pos = stop + 4
    return records
