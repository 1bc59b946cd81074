"""TFRecord files without TensorFlow: written, detected and read for staging. The framing itself
(length, data, masked CRC32C of each) is trainjobs/tfrecord.py's, shared with the agent."""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, cast

import numpy as np

from trainjobs.tfrecord import frame, masked_crc
from worker.staging.budget import StagingBudget
from worker.staging.errors import DatasetError
from worker.staging.example_proto import NotOurSchema, decode_example, encode_examples, with_strings

_WRITE_BATCH = 1024  # examples encoded at once: bounds the byte matrices encode_examples builds


def write_examples(path: Path, x: np.ndarray, y: np.ndarray, strings: np.ndarray | None = None) -> None:
    """One TFRecord file of Examples in our schema; x is [n, ...] float32 (flattened here), y [n] int64;
    `strings` [n, k], a CSV's categorical and text cells, are each record's 'xs'."""
    flat = x.reshape(len(x), -1)
    with path.open("wb") as out:
        for start in range(0, len(flat), _WRITE_BATCH):
            stop = start + _WRITE_BATCH
            records = encode_examples(flat[start:stop], y[start:stop])
            if strings is not None:
                records = with_strings(records, strings[start:stop])
            out.write(b"".join(frame(r) for r in records))


class LooksCompressed(NotOurSchema):
    """A TFRecord file read as uncompressed whose bytes look GZIP- or ZLIB-compressed."""


def compression_of(head: bytes) -> str | None:
    """'gzip' or 'zlib' when the first bytes of a file are that format's header and not a valid
    uncompressed record header, else None."""
    if len(head) >= 12 and masked_crc(head[:8]) == struct.unpack("<I", head[8:12])[0]:
        return None
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if len(head) >= 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0:  # RFC 1950 CMF/FLG
        return "zlib"
    return None


class _ZlibReader:
    """A readable stream of a zlib stream's decompressed bytes (TF's ZLIB TFRecord option)."""

    def __init__(self, raw: BinaryIO):
        self.raw, self.inflate, self.buffer = raw, zlib.decompressobj(), b""

    def read(self, size: int) -> bytes:
        while len(self.buffer) < size and not self.inflate.eof:
            chunk = self.raw.read(1 << 16)
            if not chunk:
                break
            self.buffer += self.inflate.decompress(chunk)
        out, self.buffer = self.buffer[:size], self.buffer[size:]
        return out


@contextmanager
def open_records(path: Path, compression: str) -> Iterator[tuple[BinaryIO, str]]:
    """(the uncompressed bytes of a local TFRecord file, the compression read: none, gzip or zlib);
    `compression` auto detects GZIP and ZLIB."""
    with path.open("rb") as raw:
        if compression == "auto":
            compression = compression_of(raw.read(12)) or "none"
            raw.seek(0)
        if compression == "gzip":
            with gzip.GzipFile(fileobj=raw) as unzipped:
                yield cast(BinaryIO, unzipped), compression
        elif compression == "zlib":
            yield cast(BinaryIO, _ZlibReader(raw)), compression
        else:
            yield raw, "none"


def iter_records(stream: BinaryIO, name: str) -> Iterator[bytes]:
    """The records of one TFRecord stream, checksums verified."""
    index = 0
    try:
        head = stream.read(12)
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise DatasetError(f"{name} cannot be decompressed ({type(exc).__name__}); check dataset.options.compression") from None
    while head:
        if len(head) < 12:
            raise DatasetError(f"{name} is truncated: record {index} has an incomplete header")
        length, length_crc = struct.unpack("<QI", head)
        if masked_crc(head[:8]) != length_crc:
            if index == 0 and (kind := compression_of(head)):
                raise LooksCompressed(f"{name} looks {kind.upper()}-compressed; set dataset.options.compression "
                                      f"to {kind} (or auto, which detects it)")
            raise DatasetError(f"{name} is not a TFRecord file or is corrupt (bad checksum in record {index}'s header)")
        try:
            data = stream.read(length)
            tail = stream.read(4)
        except (OSError, EOFError, zlib.error) as exc:
            raise DatasetError(f"{name} is corrupt in record {index} ({type(exc).__name__})") from None
        if len(data) < length or len(tail) < 4:
            raise DatasetError(f"{name} is truncated: record {index} is cut short")
        if masked_crc(data) != struct.unpack("<I", tail)[0]:
            raise DatasetError(f"{name} is corrupt: record {index} fails its checksum")
        yield data
        index += 1
        try:
            head = stream.read(12)
        except (OSError, EOFError, zlib.error) as exc:
            raise DatasetError(f"{name} is corrupt after record {index - 1} ({type(exc).__name__})") from None


def iter_examples(stream: BinaryIO, name: str) -> Iterator[tuple[np.ndarray, int | np.ndarray]]:
    """(x, y) for each record of a TFRecord stream in our schema (y: a class id, or regression targets)."""
    for i, record in enumerate(iter_records(stream, name)):
        yield decode_example(record, f"{name} record {i}")
