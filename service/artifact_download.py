"""Artifact bytes served only as the job left them.

The worker copies the agent's manifest (path, size, sha256 of each artifact) into the job's row
when the job succeeds, out of the job's reach. A download is checked against that copy: an object
whose size differs is refused before a byte is sent; a small one is hashed before it is sent; a
large one is streamed while it is hashed, with its last chunk held back until the hash matches, so a
changed artifact never arrives whole: the response is cut short and the client sees a broken
transfer, not a file.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from typing import Any

from fastapi.responses import Response, StreamingResponse

from service.errors import ApiError
from trainjobs.job_paths import ARTIFACTS

log = logging.getLogger("trainjobs.api")

CHUNK = 1 << 20


class ArtifactChanged(Exception):
    """The bytes in storage are not the ones the job's manifest recorded."""


def content_disposition(filename: str) -> str:
    """`attachment` with the artifact's name, which the job chose: as a quoted ASCII fallback with
    anything that could end the quoted string or the header (quotes, backslashes, control characters,
    non-ASCII) replaced, and whole as RFC 5987's percent-encoded `filename*` (RFC 6266)."""
    from urllib.parse import quote

    fallback = "".join(c if " " <= c <= "~" and c not in '"\\' else "_" for c in filename)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"


def verified_download(blob: Any, expected: dict[str, Any], filename: str) -> Response:
    from google.api_core.exceptions import NotFound

    where = f"gs://{blob.bucket.name}/{blob.name}"
    try:
        blob.reload()
    except NotFound:
        _refuse(where, "it is gone from storage")
    if blob.size != expected["size"]:
        _refuse(where, f"it is {blob.size} bytes where the job's manifest recorded {expected['size']}")
    headers = {"Content-Disposition": content_disposition(filename), "Content-Length": str(expected["size"])}
    # raw_download: the stored bytes, as sized and hashed. A job could store an artifact gzip-encoded,
    # and the client would inflate it: a small object could be a large answer (issue 36, finding 2).
    reader = blob.open("rb", chunk_size=CHUNK, raw_download=True)
    if expected["size"] <= CHUNK:
        with reader:
            content = reader.read()
        if hashlib.sha256(content).hexdigest() != expected["sha256"] or len(content) != expected["size"]:
            _refuse(where, "its sha256 is not the one the job's manifest recorded")
        return Response(content, media_type="application/octet-stream", headers=headers)
    return StreamingResponse(_checked_chunks(reader, expected, where), media_type="application/octet-stream",
                             headers=headers)


def _checked_chunks(reader: Any, expected: dict[str, Any], where: str) -> Iterator[bytes]:
    digest, size, held = hashlib.sha256(), 0, b""
    with reader:
        while chunk := reader.read(CHUNK):
            if held:
                yield held
            digest.update(chunk)
            size += len(chunk)
            held = chunk
            if size > expected["size"]:
                break
    if size != expected["size"] or digest.hexdigest() != expected["sha256"]:
        log.error("artifact %s changed after its job ended (%d bytes, sha256 %s; the manifest says %d bytes, %s): "
                  "download aborted", where, size, digest.hexdigest(), expected["size"], expected["sha256"])
        raise ArtifactChanged(where)
    yield held


def _refuse(where: str, why: str) -> None:
    log.error("artifact %s refused: %s", where, why)
    raise ApiError(409, f"artifact {where.rsplit(f'/{ARTIFACTS}/', 1)[-1]} was changed after the job ended "
                        f"({why}); it is not served", "artifact_changed")
