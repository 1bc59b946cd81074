"""Files users upload (POST /v1/datasets), stored by content: gs://BUCKET/uploads/<sha256>/<filename>.

The sha256 is only known once the last byte has arrived, so the bytes stream to a temporary key
through a resumable upload (bounded memory, any size) while they are hashed, then are rewritten
server-side to their content key. A job names the file as `dataset:<sha256>`.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import uuid
from pathlib import PurePosixPath
from typing import Any, BinaryIO

from trainjobs import storage
from worker.staging.errors import DatasetError, short

_READ = 1 << 20
_CHUNK = 8 << 20  # resumable-upload chunk: the most of an upload held in memory (multiple of 256 KiB)
_FILENAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._ -]{0,254}$")
INCOMING = "uploads/.incoming/"


def upload_prefix(sha256: str) -> str:
    return f"uploads/{sha256}/"


def store_upload(stream: BinaryIO, filename: str, *, bucket: str | None = None) -> tuple[str, int]:
    """Store an uploaded file by content; returns (sha256 of its bytes, size). Idempotent.

    An empty file is not stored (size 0 tells the caller to refuse it); any other file is.
    """
    name = PurePosixPath(filename.replace("\\", "/")).name.strip()
    if not _FILENAME.match(name):
        raise DatasetError(f"unusable file name {short(filename)}: use letters, digits, '.', '_', '-' and spaces")
    b = storage.bucket(bucket)
    incoming = b.blob(f"{INCOMING}{uuid.uuid4().hex}")
    digest, size = hashlib.sha256(), 0
    try:
        with incoming.open("wb", chunk_size=_CHUNK) as out:
            while chunk := stream.read(_READ):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
        sha = digest.hexdigest()
        if size and find_upload(sha, bucket=bucket) is None:
            _rewrite(incoming, b.blob(f"{upload_prefix(sha)}{name}"))
        return sha, size
    finally:
        _delete_quietly(incoming)


def find_upload(sha256: str, *, bucket: str | None = None) -> Any | None:
    """The stored blob for dataset:<sha256>, or None. The first file name it was uploaded under wins."""
    name = bucket or storage.bucket_name()
    return next(iter(storage.client().list_blobs(name, prefix=upload_prefix(sha256), max_results=1)), None)


def _rewrite(source: Any, dest: Any) -> None:
    # rewrite, unlike copy, is resumable: GCS may answer a large object in several calls.
    token, _, _ = dest.rewrite(source)
    while token is not None:
        token, _, _ = dest.rewrite(source, token=token)


def _delete_quietly(blob: Any) -> None:
    from google.api_core.exceptions import NotFound

    with contextlib.suppress(NotFound):  # an empty upload may never have created the object
        blob.delete()
