"""A job's code reaches only its own job's storage and nothing of the worker (issue 8, section 1).

The agent's environment is an allow-list; storage is reachable only inside the job's boundary
(its job directory read/write, its dataset and model code read-only): a downscoped token on Google
Cloud, a storage guard in front of the local emulator; artifact downloads are checked against the
manifest the worker copied out of the job's reach when it succeeded."""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote, unquote

import httpx
import pytest

from tests.support.tenancy import JOB, OTHER_JOB, PROJECT_A, PROJECT_B, succeeded_job
from trainjobs import storage
from worker.boundary import storage_guard
from worker.boundary.access import JobBoundary, Scope


# --- 1. the agent's environment ------------------------------------------------------------------


# --- 2. the boundary, as Google Cloud enforces it --------------------------------------------------


# --- 2. the boundary, as the local storage guard enforces it ---------------------------------------

@pytest.fixture
def guarded(bucket, monkeypatch) -> Iterator[tuple[Any, str]]:
    """(a storage client that reaches the emulator only through a job's guard, the guard's URL), with
    another job's artifact and another project's upload in the bucket."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage as gcs

    admin = storage.bucket(bucket)
    for key in (f"datasets/{'d' * 64}/shards/train-0.tfrecord", f"uploads/{PROJECT_B}/{'b' * 64}/model.py",
                f"uploads/{PROJECT_A}/{'a' * 64}/secret.py", f"jobs/{OTHER_JOB}/artifacts/metrics.json"):
        admin.blob(key).upload_from_string(b"original")
    boundary = JobBoundary(JOB, read=(Scope(bucket, f"datasets/{'d' * 64}/"),
                                      Scope(bucket, f"uploads/{PROJECT_B}/{'b' * 64}/model.py")),
                           write=(Scope(bucket, f"jobs/{JOB}/"),))
    server = storage_guard.serve(boundary, os.environ["STORAGE_EMULATOR_HOST"])
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)  # read by the client at construction
    client = gcs.Client(project="p", credentials=AnonymousCredentials())
    monkeypatch.undo()
    yield client, url
    server.shutdown()


def _original(bucket: str, key: str) -> bytes:
    return bytes(storage.bucket(bucket).blob(key).download_as_bytes())


def test_guard_lets_a_job_write_read_list_and_delete_its_own_directory(guarded, bucket):
    client, _ = guarded
    b = client.bucket(bucket)
    b.blob(f"jobs/{JOB}/status.json").upload_from_string(b"{}")
    big = os.urandom(700_000)
    b.blob(f"jobs/{JOB}/checkpoints/ckpt-1.data", chunk_size=256 * 1024).upload_from_string(big)  # resumable
    assert b.blob(f"jobs/{JOB}/checkpoints/ckpt-1.data").download_as_bytes() == big
    assert {x.name for x in client.list_blobs(bucket, prefix=f"jobs/{JOB}/")} == {
        f"jobs/{JOB}/status.json", f"jobs/{JOB}/checkpoints/ckpt-1.data"}
    b.blob(f"jobs/{JOB}/status.json").delete()
    assert not storage.bucket(bucket).blob(f"jobs/{JOB}/status.json").exists()


def test_what_a_job_writes_stays_readable_once_its_guard_is_gone(guarded, bucket):
    """The emulator stores the links it hands out: they must name the emulator, while the job itself
    is shown only the guard's."""
    client, url = guarded
    client.bucket(bucket).blob(f"jobs/{JOB}/artifacts/model.tflite").upload_from_string(b"model")
    assert client.bucket(bucket).get_blob(f"jobs/{JOB}/artifacts/model.tflite").media_link.startswith(url)
    stored = storage.bucket(bucket).get_blob(f"jobs/{JOB}/artifacts/model.tflite")
    assert not stored.media_link.startswith(url)
    assert stored.download_as_bytes() == b"model"


def test_guard_lets_a_job_read_its_dataset_and_model_code(guarded, bucket):
    client, _ = guarded
    assert [x.name for x in client.list_blobs(bucket, prefix=f"datasets/{'d' * 64}/")] == [
        f"datasets/{'d' * 64}/shards/train-0.tfrecord"]
    assert client.bucket(bucket).blob(f"uploads/{PROJECT_B}/{'b' * 64}/model.py").download_as_bytes() == b"original"


@pytest.mark.parametrize("attempt", [
    "list the bucket", "list uploads", "list jobs", "read another project's upload", "read another job's artifact",
    "overwrite another job's artifact", "overwrite its dataset", "overwrite its model code",
    "write outside through dot segments", "open a resumable upload elsewhere", "delete another job's artifact",
    "copy another job's artifact into its own directory", "read the bucket's metadata",
])
def test_guard_refuses_everything_outside_the_boundary_with_403(guarded, bucket, attempt):
    from google.api_core.exceptions import Forbidden

    client, _ = guarded
    b = client.bucket(bucket)
    other = f"jobs/{OTHER_JOB}/artifacts/metrics.json"
    attempts = {
        "list the bucket": lambda: list(client.list_blobs(bucket)),
        "list uploads": lambda: list(client.list_blobs(bucket, prefix="uploads/")),
        "list jobs": lambda: list(client.list_blobs(bucket, prefix="jobs/")),
        "read another project's upload": lambda: b.blob(f"uploads/{PROJECT_A}/{'a' * 64}/secret.py").download_as_bytes(),
        "read another job's artifact": lambda: b.blob(other).download_as_bytes(),
        "overwrite another job's artifact": lambda: b.blob(other).upload_from_string(b"forged"),
        "overwrite its dataset": lambda: b.blob(f"datasets/{'d' * 64}/shards/train-0.tfrecord").upload_from_string(b"x"),
        "overwrite its model code": lambda: b.blob(f"uploads/{PROJECT_B}/{'b' * 64}/model.py").upload_from_string(b"x"),
        "write outside through dot segments": lambda: b.blob(f"jobs/{JOB}/../{OTHER_JOB}/artifacts/metrics.json")
        .upload_from_string(b"forged"),
        "open a resumable upload elsewhere": lambda: b.blob(other, chunk_size=256 * 1024).upload_from_string(
            os.urandom(600_000)),
        "delete another job's artifact": lambda: b.blob(other).delete(),
        "copy another job's artifact into its own directory": lambda: b.blob(f"jobs/{JOB}/copy").rewrite(b.blob(other)),
        "read the bucket's metadata": lambda: b.reload(),
    }
    with pytest.raises(Forbidden):
        attempts[attempt]()
    assert _original(bucket, other) == b"original"


def test_guard_answers_in_the_gcs_error_shape(guarded, bucket):
    _, url = guarded
    r = httpx.get(f"{url}/storage/v1/b/{bucket}/o", params={"prefix": "uploads/"})
    assert r.status_code == 403
    error = r.json()["error"]
    assert error["code"] == 403 and error["errors"][0]["reason"] == "forbidden" and "uploads/" in error["message"]


def test_guard_ignores_a_forged_host_header_and_unknown_upload_sessions(guarded, bucket):
    """The emulator builds its URL from the Host header: a job must not steer it to another path."""
    _, url = guarded
    other = f"jobs/{OTHER_JOB}/artifacts/metrics.json".replace("/", "%2F")
    own = f"jobs/{JOB}/x".replace("/", "%2F")
    forged_host = f"x/upload/storage/v1/b/{bucket}/o?uploadType=media&name={other}&"
    r = httpx.post(f"{url}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={own}", content=b"forged",
                   headers={"Host": forged_host})
    assert r.status_code == 200  # written where the guard checked: the job's own directory
    assert _original(bucket, f"jobs/{JOB}/x") == b"forged"
    r = httpx.put(f"{url}/upload/storage/v1/b/{bucket}/o?upload_id=guessed", content=b"forged")
    assert r.status_code == 403
    assert _original(bucket, f"jobs/{OTHER_JOB}/artifacts/metrics.json") == b"original"


# --- 3. artifact downloads are checked against the manifest kept at success -----------------------


def test_artifact_listing_comes_from_the_manifest_kept_at_success(db, api, bucket):
    job_id = succeeded_job(db, api, bucket, {"metrics.json": b'{"val_accuracy": 0.9}'})
    # The job's code could rewrite its own manifest in storage; the listing does not follow it.
    storage.write_json(f"gs://{bucket}/jobs/{job_id}/artifacts/manifest.json",
                       [{"path": "evil.bin", "size": 1, "sha256": "0" * 64}])
    listing = api.get(f"/v1/jobs/{job_id}/artifacts").json()["artifacts"]
    assert [(a["path"], a["size"]) for a in listing] == [("metrics.json", 21)]


def test_artifact_overwritten_after_success_is_refused(db, api, bucket):
    job_id = succeeded_job(db, api, bucket, {"metrics.json": b'{"val_accuracy": 0.9}'})
    storage.bucket(bucket).blob(f"jobs/{job_id}/artifacts/metrics.json").upload_from_string(b'{"val_accuracy": 1.0}')
    r = api.get(f"/v1/jobs/{job_id}/artifacts/metrics.json")
    assert r.status_code == 409
    assert r.json()["error"]["error"] == "artifact_changed"


def test_large_artifact_overwritten_with_the_same_size_is_cut_off_before_its_end(db, api, bucket):
    original = os.urandom(3 << 20)
    job_id = succeeded_job(db, api, bucket, {"saved_model/variables.data": original})
    forged = original[:-1] + bytes([original[-1] ^ 1])
    storage.bucket(bucket).blob(f"jobs/{job_id}/artifacts/saved_model/variables.data").upload_from_string(forged)
    received = bytearray()
    with pytest.raises(httpx.HTTPError):
        with api.stream("GET", f"/v1/jobs/{job_id}/artifacts/saved_model/variables.data") as r:
            for chunk in r.iter_bytes():
                received += chunk
    assert len(received) < len(original)


def test_unchanged_artifact_downloads_whole(db, api, bucket):
    original = os.urandom(3 << 20)
    job_id = succeeded_job(db, api, bucket, {"saved_model/variables.data": original, "metrics.json": b"{}"})
    assert api.get(f"/v1/jobs/{job_id}/artifacts/saved_model/variables.data").content == original
    assert api.get(f"/v1/jobs/{job_id}/artifacts/metrics.json").content == b"{}"


@pytest.mark.parametrize("name", ['a" filename="evil.html', "r\u00e9sum\u00e9 v1.txt"])
def test_an_artifact_name_the_job_chose_cannot_rewrite_the_download_header(db, api, bucket, name):
    job_id = succeeded_job(db, api, bucket, {name: b"x"})
    r = api.get(f"/v1/jobs/{job_id}/artifacts/{quote(name)}")
    assert r.status_code == 200 and r.content == b"x"
    # RFC 6266's grammar, strictly: one quoted ASCII name with no quote or backslash inside, then the
    # exact name percent-encoded (RFC 5987), which is what a browser saves the file as.
    disposition = re.fullmatch(r"""attachment; filename="[ !#-\[\]-~]*"; filename\*=UTF-8''([\w%!#$&+.^`|~-]+)""",
                               r.headers["content-disposition"])
    assert disposition is not None, r.headers["content-disposition"]
    assert unquote(disposition[1]) == name


class _StorageThatChanged(BaseHTTPRequestHandler):
    """An API whose listing is right and whose download link (as a signed URL would, straight from
    storage) serves bytes changed after the job ended."""

    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        if self.path.endswith("/artifacts"):
            body = json.dumps({"signed": True, "artifacts": [{
                "path": "metrics.json", "size": 2, "sha256": hashlib.sha256(b"{}").hexdigest(), "uri": "gs://b/x",
                "download_url": f"http://127.0.0.1:{self.server.server_address[1]}/signed/metrics.json"}]}).encode()
        else:
            body = b'{"val_accuracy": 1.0}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def test_client_refuses_a_downloaded_file_that_differs_from_the_listing(tmp_path):
    from trainjobs.client.api import ArtifactIntegrityError, Client

    server = ThreadingHTTPServer(("127.0.0.1", 0), _StorageThatChanged)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = Client(api_url=f"http://127.0.0.1:{server.server_address[1]}", api_key="k")
        with pytest.raises(ArtifactIntegrityError, match="metrics.json"):
            client.download_artifacts(str(uuid.uuid4()), tmp_path / "out")
    finally:
        server.shutdown()
    assert list((tmp_path / "out").rglob("*")) == []


# --- 4. the reported attacks, through the whole product --------------------------------------------


# --- 5. the agent zygote takes requests from the worker alone (issue 18) ---------------------------


