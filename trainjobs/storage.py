"""Google Cloud Storage access.

Everything that crosses between the worker, the agent on the accelerator VM and the API goes
through GCS with the real `google-cloud-storage` client. TensorFlow's own `gs://` filesystem ignores
`STORAGE_EMULATOR_HOST`, so nothing here hands a `gs://` path to TensorFlow: the agent downloads
shards to local disk and uploads what it writes. Tests and production run the same code.

The layout of what is kept there (jobs, datasets, uploads) is trainjobs/job_paths.py.
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

from trainjobs.job_paths import DEFAULT_BUCKET as DEFAULT_BUCKET, bucket_name as bucket_name, within_job
from trainjobs.storage_limits import honours_call_limits

log = logging.getLogger("trainjobs.storage")

UTC = timezone.utc  # datetime.UTC is 3.11+; the agent's wheel runs on the VM images' Python 3.10


@lru_cache(maxsize=4)
@honours_call_limits  # API requests and job drivers wait seconds, not minutes (storage_limits.py)
def _client(emulator: str | None, project: str | None, token_file: str | None = None) -> Any:
    from google.cloud import storage

    if emulator:
        # The client reads STORAGE_EMULATOR_HOST itself; anonymous credentials keep it from looking
        # for Application Default Credentials that a laptop or CI machine does not have.
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project=project or "trainjobs-local", credentials=AnonymousCredentials())
    if token_file:
        return storage.Client(project=project, credentials=token_file_credentials(Path(token_file)))
    return storage.Client(project=project)


def client() -> Any:
    """The process-wide storage client (thread-safe for requests)."""
    return _client(os.environ.get("STORAGE_EMULATOR_HOST"), os.environ.get("TRAINJOBS_GCP_PROJECT"),
                   os.environ.get(TOKEN_FILE_ENV))


# On a job's machine: the file holding the job's downscoped access token, which the worker rewrites
# before it expires (worker/boundary/tokens.py). The machine holds no other credentials.
TOKEN_FILE_ENV = "TRAINJOBS_STORAGE_TOKEN_FILE"
_TOKEN_MIN_LIFE = timedelta(minutes=5)  # google-auth refuses a token within 3m45s of its expiry


def token_file_credentials(path: Path, wait_s: float = 120.0) -> Any:
    """Credentials whose every refresh re-reads the token file; while the file's token is near its
    end, they wait (up to wait_s) for the worker to write a newer one."""
    from google.oauth2.credentials import Credentials

    def refresh(request: Any, scopes: Any) -> tuple[str, datetime]:
        deadline = time.monotonic() + wait_s
        while True:
            data = json.loads(path.read_text())
            # google-auth compares expiries as naive UTC
            expiry = datetime.fromisoformat(data["expiry"]).astimezone(UTC).replace(tzinfo=None)
            if expiry - datetime.now(UTC).replace(tzinfo=None) > _TOKEN_MIN_LIFE or time.monotonic() > deadline:
                return str(data["access_token"]), expiry
            time.sleep(1.0)

    return Credentials(token=None, refresh_handler=refresh)


def bucket(name: str | None = None) -> Any:
    return client().bucket(name or bucket_name())


def ensure_bucket(name: str | None = None) -> None:
    from google.api_core.exceptions import Conflict

    b = bucket(name)
    if not b.exists():
        try:
            client().create_bucket(b)
        except Conflict:  # created by a concurrent process
            pass


def split_uri(uri: str) -> tuple[str, str]:
    """'gs://b/some/key' -> ('b', 'some/key')."""
    if not uri.startswith("gs://"):
        raise ValueError(f"not a gs:// URI: {uri!r}")
    rest = uri[5:]
    name, _, key = rest.partition("/")
    return name, key


def blob(uri: str) -> Any:
    name, key = split_uri(uri)
    return bucket(name).blob(key)


def write_json(uri: str, data: Any) -> None:
    blob(uri).upload_from_string(json.dumps(data, default=str), content_type="application/json")


def read_json(uri: str) -> Any | None:
    """For objects only trainjobs writes; what a job's code can write is read by read_json_bounded."""
    from google.api_core.exceptions import NotFound

    try:
        return json.loads(blob(uri).download_as_bytes())
    except NotFound:
        return None


# How much of an object a job's code can write (status.json, metrics.json, its manifests, its logs)
# a reader takes into memory at once. The agent's own documents are far smaller; a job that writes a
# 200 MB one must not take the worker or the API down with it (issue 18, finding 5).
STATUS_MAX_BYTES = 1 << 20  # status.json: a state, a heartbeat, the latest epoch's metrics
MANIFEST_MAX_BYTES = 1 << 20  # artifacts/manifest.json: ~150 bytes an artifact
METRICS_MAX_BYTES = 4 << 20  # metrics.json: ~300 bytes an epoch, every epoch of every attempt
LOG_PAGE_MAX_BYTES = 1 << 20  # one page of GET /logs, one poll of a log stream


class ObjectTooLarge(Exception):
    """An object is larger than its reader takes into memory; the message is for the job's owner."""

    def __init__(self, uri: str, size: int, limit: int, generation: int | None = None):
        self.uri, self.size, self.limit = uri, size, limit
        self.generation = generation  # the generation refused, where the reader learnt it
        super().__init__(f"{_within_job(uri)} is {_mib(size)}, over the {_mib(limit)} trainjobs reads of it")


def _within_job(uri: str) -> str:
    """'gs://b/jobs/<id>/status.json' -> 'status.json': the name its job's owner knows it by."""
    return within_job(split_uri(uri)[1]) or uri


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n} bytes"


def get_blob(uri: str) -> Any | None:
    """The object's metadata (size, generation), one GET that reads none of its bytes; None if absent."""
    name, key = split_uri(uri)
    return bucket(name).get_blob(key)


def read_bounded(uri: str, limit: int, *, found: Any | None = None) -> bytes | None:
    """The object's bytes, or None when there is none. ObjectTooLarge when it is over `limit`, judged
    by its size before a byte is read and again by what arrives: a job can replace the object between
    the two, so the download itself asks for at most limit + 1 bytes. `found`: its metadata, when the
    caller has just read it (get_blob)."""
    from google.api_core.exceptions import NotFound

    found = found if found is not None else get_blob(uri)
    if found is None:
        return None
    if int(found.size or 0) > limit:
        raise ObjectTooLarge(uri, int(found.size), limit)
    if not found.size:
        return b""
    try:
        # raw_download: the stored bytes as they are. A job could store its object gzip-encoded, and
        # the client would inflate what it was sent: a small object could be a large answer.
        data: bytes = blob(uri).download_as_bytes(start=0, end=limit, raw_download=True)
    except NotFound:  # deleted since
        return None
    if len(data) > limit:
        raise ObjectTooLarge(uri, len(data), limit)
    return data


class Unchanged:
    """The object's live generation is the one the caller already read."""


UNCHANGED = Unchanged()


def read_bounded_if_changed(uri: str, limit: int, generation: int | None) -> tuple[bytes | None, int | None] | Unchanged:
    """(its bytes, its generation) unless its live generation is `generation`; (None, None) when there
    is no object. One request either way: a download conditional on the generation, which GCS answers
    304 with no body when it holds (a class-B operation, no bytes sent). Ranged to limit + 1 bytes, so
    ObjectTooLarge is judged by what arrives, as read_bounded's second check; raw, for its reason."""
    from google.api_core.exceptions import NotFound, NotModified

    found = blob(uri)
    try:
        data: bytes = found.download_as_bytes(start=0, end=limit, raw_download=True,
                                              if_generation_not_match=generation)
    except NotModified:
        return UNCHANGED
    except NotFound:
        return None, None
    sent = None if found.generation is None else int(found.generation)
    if len(data) > limit:
        # The range says only "more than the limit"; the owner is told the object's size (one more
        # request, on this path alone). Gone or unreadable meanwhile: what arrived is the least it was.
        size = len(data)
        try:
            found.reload()
            size = max(size, int(found.size or 0))
        except Exception:  # noqa: BLE001 - the refusal stands whatever the reload says
            pass
        # The generation the download sent (x-goog-generation), not the reload's: the one refused.
        raise ObjectTooLarge(uri, size, limit, sent)
    return data, sent


def read_json_bounded(uri: str, limit: int, *, found: Any | None = None) -> Any | None:
    """read_bounded, parsed as JSON (ValueError if it is not)."""
    data = read_bounded(uri, limit, found=found)
    return None if data is None else json.loads(data)


def list_uris(prefix_uri: str) -> list[str]:
    name, prefix = split_uri(prefix_uri)
    return [f"gs://{name}/{b.name}" for b in client().list_blobs(name, prefix=prefix)]


def download_prefix(prefix_uri: str, local_dir: Path, workers: int = 8) -> list[Path]:
    """Copy every object under a prefix to local_dir, keeping relative paths; parallel."""
    from google.cloud.storage import transfer_manager

    name, prefix = split_uri(prefix_uri.rstrip("/") + "/")
    blobs = list(client().list_blobs(name, prefix=prefix))
    rel = restorable([b.name[len(prefix):] for b in blobs], local_dir)
    if not rel:
        return []
    local_dir.mkdir(parents=True, exist_ok=True)
    results = transfer_manager.download_many_to_path(
        bucket(name), rel, destination_directory=str(local_dir), blob_name_prefix=prefix,
        max_workers=workers, worker_type=transfer_manager.THREAD, raise_exception=True,
    )
    del results
    return [local_dir / r for r in rel]


def local_files(directory: Path) -> list[Path]:
    """The files under directory, sorted. A link is followed only where it stays inside: one that
    leads out of the directory (to another job's files on a shared machine, /etc, a dataset of
    terabytes) is left out, with a warning, so what a job's code puts in a directory we upload never
    carries anything else of the machine's into storage."""
    root = directory.resolve()
    found = []
    for path in sorted(directory.rglob("*")):
        if not path.is_file():
            continue
        if not path.resolve().is_relative_to(root):
            log.warning(
                "not uploaded: %s is a link to %s, outside %s", path.relative_to(directory).as_posix(),
                os.path.realpath(path), directory)
            continue
        found.append(path)
    return found


def restorable(names: list[str], local_dir: Path) -> list[str]:
    """The object names (relative to a prefix) that land inside local_dir when downloaded there. Jobs
    write under their own prefix, and GCS takes '..' in a name: one such as `ckpt/../../../.bashrc` is
    left in storage, with a warning (the client library's transfer manager skips them too; this does
    not depend on its version)."""
    root = local_dir.resolve()
    kept = []
    for rel in names:
        if rel and not rel.endswith("/") and not rel.startswith("/") and (root / rel).resolve().is_relative_to(root):
            kept.append(rel)
        elif rel and not rel.endswith("/"):
            log.warning("not downloaded: %r would land outside %s", rel, local_dir)
    return kept


def upload_dir(local_dir: Path, prefix_uri: str, workers: int = 8, found: list[Path] | None = None) -> list[str]:
    """Upload every file under local_dir (local_files, or `found` when the caller already listed them)
    to prefix_uri/<relative path>; parallel."""
    from google.cloud.storage import transfer_manager

    name, prefix = split_uri(prefix_uri.rstrip("/") + "/")
    files = [p.relative_to(local_dir).as_posix() for p in (local_files(local_dir) if found is None else found)]
    if files:
        transfer_manager.upload_many_from_filenames(
            bucket(name), files, source_directory=str(local_dir), blob_name_prefix=prefix,
            max_workers=workers, worker_type=transfer_manager.THREAD, raise_exception=True,
        )
    return [f"gs://{name}/{prefix}{f}" for f in files]
