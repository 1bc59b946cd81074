"""Files users upload (POST /v1/datasets, POST /v1/modules), stored by project and content:
gs://BUCKET/uploads/<project id>/<sha256>/<filename>.

An upload is its project's alone: the same bytes uploaded by two projects are two objects, and
`dataset:<sha256>` resolves only inside the project of the job that names it. The layout is a prefix
per project (and per file), so a storage credential can be limited to "uploads/<project>/<sha>/".

The API writes them; dataset staging and the agent read them. The sha256 is only known once the last
byte has arrived, so the bytes stream to a temporary key through a resumable upload (bounded memory,
any size) while they are hashed, then are rewritten server-side to their content key. A job names a
dataset as `dataset:<sha256>` and model code by the gs:// URI the upload answered with.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import PurePosixPath
from typing import Any, BinaryIO, Literal

from trainjobs import job_paths, storage

UploadKind = Literal["dataset", "module"]

_READ = 1 << 20
_CHUNK = 8 << 20  # resumable-upload chunk: the most of an upload held in memory (multiple of 256 KiB)
# One rule for every uploaded file name: it becomes part of a GCS key and of a path on the agent.
_FILENAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,200}$")
SUFFIXES: dict[UploadKind, tuple[str, ...]] = {
    "dataset": (".npz", ".csv", ".csv.gz", ".tfrecord", ".tfrecords", ".tfrecord.gz", ".zip", ".tar.gz", ".tgz"),
    "module": (".py", ".zip", ".tar.gz", ".tgz"),
}
MAX_MODULE_BYTES = 50 << 20  # code, not weights
DEFAULT_MAX_DATASET_BYTES = 20 << 30  # TRAINJOBS_MAX_UPLOAD_BYTES overrides it
UPLOADS = f"{job_paths.UPLOADS}/"
INCOMING = f"{job_paths.INCOMING}/"  # the temporaries (job_paths.py)
# A temporary appears when its last byte is committed and is rewritten and deleted seconds later; one
# this old is an API's that was killed in between. TRAINJOBS_INCOMING_MAX_AGE_S overrides it.
DEFAULT_INCOMING_MAX_AGE_S = 3600.0


class UploadError(ValueError):
    """The upload cannot be stored; the message says why, for the user."""


class UploadTooLarge(UploadError):
    """The upload passed its kind's size cap (HTTP 413); nothing was kept."""


def max_upload_bytes(kind: UploadKind) -> int:
    """The size cap for one upload. Read per call, so an operator's TRAINJOBS_MAX_UPLOAD_BYTES applies
    to a running API's next upload."""
    if kind == "module":
        return MAX_MODULE_BYTES
    return int(os.environ.get("TRAINJOBS_MAX_UPLOAD_BYTES") or DEFAULT_MAX_DATASET_BYTES)


def too_large_message(kind: UploadKind, limit: int) -> str:
    if kind == "module":
        return f"model code is limited to {limit >> 20} MiB: ship weights as a dataset, not as code"
    return f"a dataset upload is limited to {limit} bytes (TRAINJOBS_MAX_UPLOAD_BYTES on the server)"


def check_filename(filename: str, kind: UploadKind) -> str:
    """The name the file is stored under, or UploadError naming what a name may hold."""
    suffixes = SUFFIXES[kind]
    ok = bool(_FILENAME.match(filename)) and filename.endswith(suffixes)
    if kind == "module":
        ok = ok and not filename[0].isdigit()  # it is imported by its name
    if not ok:
        raise UploadError(f"file name {filename[:60]!r}: expected letters, digits, '.', '_' and '-', ending in "
                          + ", ".join(suffixes))
    return filename


def project_prefix(project_id: str) -> str:
    """Every upload of one project lies under this key prefix."""
    return f"{UPLOADS}{uuid.UUID(str(project_id))}/"


def upload_prefix(project_id: str, sha256: str) -> str:
    return f"{project_prefix(project_id)}{sha256}/"


def store_upload(stream: BinaryIO, filename: str, *, project_id: str, kind: UploadKind = "dataset",
                 bucket: str | None = None, max_bytes: int | None = None) -> tuple[str, int]:
    """Store an uploaded file of one project by content; returns (sha256 of its bytes, size).
    Idempotent within the project.

    An empty file is not stored (size 0 tells the caller to refuse it); any other file is. Past
    max_bytes it stops reading and raises UploadTooLarge, and the partial object is deleted.
    """
    name = check_filename(PurePosixPath(filename.replace("\\", "/")).name.strip(), kind)
    b = storage.bucket(bucket)
    incoming = b.blob(f"{INCOMING}{uuid.uuid4().hex}")
    digest, size = hashlib.sha256(), 0
    out = incoming.open("wb", chunk_size=_CHUNK)
    try:
        with out:
            while chunk := stream.read(_READ):
                digest.update(chunk)
                size += len(chunk)
                if max_bytes is not None and size > max_bytes:
                    raise UploadTooLarge(too_large_message(kind, max_bytes))
                out.write(chunk)
        sha = digest.hexdigest()
        if size and find_upload(project_id, sha, bucket=bucket) is None:
            _rewrite(incoming, b.blob(f"{upload_prefix(project_id, sha)}{name}"))
        return sha, size
    finally:
        if not out.closed:
            # Its close() failed (storage unreachable) and left the buffer open: io's finalizer would
            # call close() again whenever the writer is collected, a fresh upload under the storage
            # client's own 120 s of retries in whichever thread collects it (a request's, or the
            # next test's). Dropped here instead: nothing of a failed upload is kept anyway.
            if (buffer := getattr(out, "_buffer", None)) is not None:  # BlobWriter's own; absent: nothing to drop
                buffer.close()
        _delete_quietly(incoming)


def find_upload(project_id: str, sha256: str, *, bucket: str | None = None) -> Any | None:
    """The project's stored blob for dataset:<sha256>, or None. The first file name it was uploaded
    under wins. Another project's upload of the same bytes is never found."""
    name = bucket or storage.bucket_name()
    prefix = upload_prefix(project_id, sha256)
    return next(iter(storage.client().list_blobs(name, prefix=prefix, max_results=1)), None)


def incoming_max_age_s() -> float:
    """How old an upload temporary must be before sweep_incoming removes it."""
    return float(os.environ.get("TRAINJOBS_INCOMING_MAX_AGE_S") or DEFAULT_INCOMING_MAX_AGE_S)


def sweep_incoming(*, max_age_s: float | None = None, bucket: str | None = None,
                   now: datetime | None = None) -> int:
    """Delete the upload temporaries (uploads/.incoming/) older than max_age_s; return how many.

    store_upload deletes its own temporary in every outcome but one: the API process dies between
    the temporary's last byte and its delete. Nobody else ever names that key, so it would stay (and
    bill) forever. Age, not ownership, decides: an upload still in flight has no object yet, and one
    being rewritten is seconds old, so any API replica's live upload is safe from any sweeper.
    """
    limit = incoming_max_age_s() if max_age_s is None else max_age_s
    cutoff = (now or datetime.now(timezone.utc)) - timedelta(seconds=limit)
    stale = [blob for blob in storage.client().list_blobs(bucket or storage.bucket_name(), prefix=INCOMING)
             if blob.time_created is not None and blob.time_created <= cutoff]
    for blob in stale:
        _delete_quietly(blob)  # another sweeper may have taken it first
    return len(stale)


def _rewrite(source: Any, dest: Any) -> None:
    # rewrite, unlike copy, is resumable: GCS may answer a large object in several calls.
    token, _, _ = dest.rewrite(source)
    while token is not None:
        token, _, _ = dest.rewrite(source, token=token)


def _delete_quietly(blob: Any) -> None:
    from google.api_core.exceptions import NotFound

    with contextlib.suppress(NotFound):  # an empty upload may never have created the object
        blob.delete()
