"""A job's log objects (logs/agent-<attempt>-<task>.log), read in bounded pieces from a cursor.

The job's own code can write these objects, and as large as it likes: nothing here holds more than
one page (storage.LOG_PAGE_MAX_BYTES) of them in memory, and a page is read with ranged GETs, never
a whole object (issue 18, finding 5). GET /logs serves pages (log_page); the log stream reads the
same way (streams.LogTail).

A cursor is "<object name>=<bytes read>;..." for each object read so far: the agent only appends to
its log and re-uploads it, so bytes past an offset are new ones whichever generation answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.errors import ApiError
from trainjobs import storage

# One attempt and task per object; a job that writes thousands more has only these many read.
MAX_LOG_OBJECTS = 200


def bad_cursor(reason: str) -> ApiError:
    return ApiError(422, f"cursor: {reason}", "invalid_request", [{"field": "cursor", "reason": reason}])


def decode_cursor(cursor: str | None) -> dict[str, int]:
    offsets: dict[str, int] = {}
    for part in (cursor or "").split(";"):
        if not part:
            continue
        name, sep, offset = part.rpartition("=")
        if not sep or not name or "/" in name or not offset.isdigit():
            raise bad_cursor(f"{cursor!r} is not a cursor this API sent")
        offsets[name] = int(offset)
    return offsets


def encode_cursor(offsets: dict[str, int]) -> str:
    return ";".join(f"{name}={offset}" for name, offset in sorted(offsets.items()))


def log_objects(logs_uri: str) -> list[Any]:
    """The job's log objects in name order (GCS lists in that order), their metadata only."""
    bucket, prefix = storage.split_uri(logs_uri.rstrip("/") + "/")
    return list(storage.client().list_blobs(bucket, prefix=prefix, max_results=MAX_LOG_OBJECTS))


def object_name(blob: Any) -> str:
    return str(blob.name).rsplit("/", 1)[-1]


def read_range(blob: Any, start: int, end: int) -> bytes:
    """Bytes [start, end) of the object as it is now; raw_download: stored bytes, never inflated
    (storage.read_bounded). Not the listed generation: the agent may have uploaded a longer one
    since, and GCS answers 404 for a generation that is no longer the live one."""
    current = blob.bucket.blob(blob.name)
    data: bytes = current.download_as_bytes(start=start, end=end - 1, raw_download=True)
    return data[: end - start]


def whole_lines(chunk: bytes, capped: bool) -> bytes:
    """The part of a chunk read up to a page's limit to hand out now: up to its last line end, unless
    it holds none (one line longer than a page goes out a page at a time)."""
    if not capped:
        return chunk
    end = max(chunk.rfind(b"\n"), chunk.rfind(b"\r"))
    return chunk[: end + 1] if end >= 0 else chunk


@dataclass
class LogPage:
    text: str
    next_cursor: str | None  # more is there to read now
    end_cursor: str  # where the text ends: what the job writes after it is read from here


def log_page(logs_uri: str, cursor: str | None, limit: int) -> LogPage:
    """At most `limit` bytes of log past the cursor, each object headed '==> name <==' where it starts."""
    offsets = decode_cursor(cursor)
    blobs = log_objects(logs_uri)
    parts: list[bytes] = []
    left, more = limit, False
    for index, blob in enumerate(blobs):
        name, size = object_name(blob), int(blob.size or 0)
        start = offsets.get(name, 0)
        if size <= start:
            continue
        if left <= 0:
            more = True
            break
        capped = size - start > left
        chunk = whole_lines(read_range(blob, start, start + min(size - start, left)), capped)
        if start == 0:
            parts.append((b"\n" if index else b"") + f"==> {name} <==\n".encode())
        parts.append(chunk)
        offsets[name] = start + len(chunk)
        left -= len(chunk)
        if capped:  # the rest of this object opens the next page, before any later object
            more = True
            break
    end = encode_cursor(offsets)
    return LogPage(b"".join(parts).decode("utf-8", "replace"), end if more else None, end)


def log_tail(logs_uri: str, lines: int, limit: int) -> LogPage:
    """The last `lines` lines, from at most `limit` bytes read backwards from the ends of the objects."""
    blobs = log_objects(logs_uri)
    ends = {object_name(b): int(b.size or 0) for b in blobs}
    sections: list[bytes] = []
    left = limit
    for index in range(len(blobs) - 1, -1, -1):
        blob = blobs[index]
        name, size = object_name(blob), int(blob.size or 0)
        start = max(0, size - left)
        body = read_range(blob, start, size) if size > start else b""
        head = ((b"\n" if index else b"") + f"==> {name} <==\n".encode()) if start == 0 else b""
        sections.insert(0, head + body)
        left -= size - start
        if left <= 0 or sum(s.count(b"\n") for s in sections) > lines:
            break
    text = b"".join(sections).decode("utf-8", "replace")
    return LogPage("\n".join(text.splitlines()[-lines:]) + "\n", None, encode_cursor(ends))
