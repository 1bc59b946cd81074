"""TFRecord files without TensorFlow: each record is

    uint64 length | uint32 masked_crc32c(length) | data[length] | uint32 masked_crc32c(data)

all little-endian (tensorflow/core/lib/io/record_writer.h). The CRC is Castagnoli, "masked" so that
a CRC of data that itself holds CRCs stays well distributed.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import google_crc32c
import numpy as np

from worker.staging.budget import StagingBudget
from worker.staging.errors import DatasetError
from worker.staging.example_proto import decode_example, encode_examples

_MASK_DELTA = 0xA282EAD8
_WRITE_BATCH = 1024  # examples encoded at once: bounds the byte matrices encode_examples builds


def masked_crc(data: bytes) -> int:
    crc = int(google_crc32c.value(data))
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    length = struct.pack("<Q", len(record))
    return length + struct.pack("<I", masked_crc(length)) + record + struct.pack("<I", masked_crc(record))


def write_examples(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    """One TFRecord file of Examples in our schema; x is [n, ...] float32 (flattened here), y [n] int64."""
    flat = x.reshape(len(x), -1)
    with path.open("wb") as out:
        for start in range(0, len(flat), _WRITE_BATCH):
            stop = start + _WRITE_BATCH
            out.write(b"".join(frame(r) for r in encode_examples(flat[start:stop], y[start:stop])))


def iter_records(stream: BinaryIO, name: str) -> Iterator[bytes]:
    """The records of one TFRecord stream, checksums verified."""
    index = 0
    while head := stream.read(12):
        if len(head) < 12:
            raise DatasetError(f"{name} is truncated: record {index} has an incomplete header")
        length, length_crc = struct.unpack("<QI", head)
        if masked_crc(head[:8]) != length_crc:
            raise DatasetError(f"{name} is not a TFRecord file or is corrupt (bad checksum in record {index}'s header)")
        data = stream.read(length)
        tail = stream.read(4)
        if len(data) < length or len(tail) < 4:
            raise DatasetError(f"{name} is truncated: record {index} is cut short")
        if masked_crc(data) != struct.unpack("<I", tail)[0]:
            raise DatasetError(f"{name} is corrupt: record {index} fails its checksum")
        yield data
        index += 1


def iter_examples(stream: BinaryIO, name: str) -> Iterator[tuple[np.ndarray, int]]:
    """(x, y) for each record of a TFRecord stream in our schema."""
    for i, record in enumerate(iter_records(stream, name)):
        yield decode_example(record, f"{name} record {i}")


def read_examples(paths: list[Path], root: Path, budget: StagingBudget) -> tuple[np.ndarray, np.ndarray]:
    """All examples of local TFRecord files as (x [n, D] float32, y [n] int64)."""
    xs: list[np.ndarray] = []
    ys: list[int] = []
    for path in paths:
        budget.check_stop()
        name = str(path.relative_to(root)) if path != root else path.name
        with path.open("rb") as stream:
            for x, y in iter_examples(stream, name):
                if xs and len(x) != len(xs[0]):
                    raise DatasetError(f"{name} record {len(ys)}: {len(x)} features where earlier records have {len(xs[0])}")
                xs.append(x)
                ys.append(y)
    if not xs:
        return np.zeros((0, 0), np.float32), np.zeros((0,), np.int64)
    return np.stack(xs), np.asarray(ys, dtype=np.int64)
