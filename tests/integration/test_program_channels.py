"""A program's channels (issue 37): each source's files copied as they are into the job's own directory at
staging (worker/staging_channels.py), under the same rules as its data: another project's objects are a
422 naming the channel, and what only the data tells (a missing object, an empty folder, too many bytes)
fails the job at STAGING, before any machine. Against the real API, PostgreSQL and the GCS emulator."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import scaled
from tests.support.jobs import make_key
from tests.support.tenancy import project_id, refusal
from tests.support.worker import make_worker, path, wait_for
from trainjobs import storage
from trainjobs.addresses import shown
from trainjobs.client.local_paths import pack_channel
from trainjobs.job_paths import JobPaths
from trainjobs.source_rules import DataAccessRules
from worker.ports import ProgramError
from worker.staging.budget import StagingLimits
from worker.staging_adapter import GcsStager
from worker.staging_channels import MAX_BYTES_ENV, stage_channels

PROGRAM = b"print('hi')\n"


def _module(api: httpx.Client) -> str:
    r = api.post("/v1/modules", files={"file": ("train.py", PROGRAM)})
    assert r.status_code == 201, r.text
    return str(r.json()["module"])


def _dataset(api: httpx.Client, name: str, data: bytes) -> str:
    r = api.post("/v1/datasets", files={"file": (name, data)})
    assert r.status_code == 201, r.text
    return str(r.json()["dataset"])


def _upload_uri(bucket: str, project: str, sha: str) -> str:
    [blob] = storage.client().list_blobs(bucket, prefix=f"uploads/{project}/{sha}/")
    return f"gs://{bucket}/{blob.name}"


def _copied(job_id: str, name: str) -> dict[str, bytes]:
    prefix = JobPaths.for_job(job_id).channel(name) + "/"
    return {uri.removeprefix(prefix): storage.blob(uri).download_as_bytes() for uri in storage.list_uris(prefix)}


def test_a_channel_naming_another_projects_upload_is_refused_at_submit(api, db, api_url, bucket) -> None:
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {make_key(db, 'beta')}"},
                      timeout=scaled(30)) as beta:
        theirs = _dataset(beta, "secret.csv", b"a,label\n1,0\n").removeprefix("dataset:")
    theirs_uri = _upload_uri(bucket, project_id(db, "beta"), theirs)

    answer = refusal(api.post("/v1/jobs", json={"program": {"source": _module(api), "channels": {
        "training": theirs_uri}}}))

    assert answer["field"] == "program.channels.training"
    assert "only its own project's uploads" in answer["reason"]
    # Named by content address, another project's upload is not found in this one's: staging says so.
    with pytest.raises(ProgramError, match=r"^program\.channels\.training: no upload dataset:"):
        stage_channels({"training": f"dataset:{theirs}"}, job_id=str(uuid.uuid4()), project_id=project_id(db, "alpha"),
                       rules=DataAccessRules(), limits=StagingLimits(), bucket=bucket, work=Path("/nonexistent"))


def test_a_missing_channel_object_fails_the_job_at_staging_before_any_machine(
        api, db, database_url, bucket, tmp_path: Path, running_workers: list[Any]) -> None:
    from service.db.models import JobStatus
    from worker.memory_cloud import MemoryCloud

    alpha = project_id(db, "alpha")
    real = _upload_uri(bucket, alpha, _dataset(api, "train.csv", b"a,label\n1,0\n").removeprefix("dataset:"))
    missing = f"gs://{bucket}/uploads/{alpha}/{'0' * 64}/test.csv"
    submitted = api.post("/v1/jobs", json={"program": {"source": _module(api), "channels": {
        "training": real, "testing": missing}}})
    assert submitted.status_code == 201, submitted.text
    job_id = uuid.UUID(submitted.json()["id"])
    worker = make_worker(database_url, MemoryCloud(), "w", stager=GcsStager(tmp_path / "staging"), concurrency=1)
    running_workers.append(worker)
    worker.start()

    failed = wait_for(db, job_id, {JobStatus.FAILED}, timeout=scaled(60))

    assert failed.error == f"program.channels.testing: no object or folder at {shown(missing)}"
    assert path(db, job_id) == ["QUEUED", "STAGING", "FAILED"]
    assert _copied(str(job_id), "training") == {}  # listed and counted first: nothing was copied


def test_each_kind_of_source_is_copied_as_it_is(api, db, bucket, tmp_path: Path, monkeypatch) -> None:
    alpha = project_id(db, "alpha")
    # A folder packed as `trainjobs submit` packs it, uploaded, and unpacked at staging.
    folder = tmp_path / "mnist"
    (folder / "nested").mkdir(parents=True)
    (folder / "train_data.npy").write_bytes(b"\x93NUMPY fake array")
    (folder / "nested" / "labels.bin").write_bytes(bytes(range(256)))
    packed = _dataset(api, "channel.tar.gz", pack_channel(folder, tmp_path / "channel.tar.gz").read_bytes())
    # The same files pack to the same bytes: uploaded once.
    again = pack_channel(folder, tmp_path / "again.tar.gz").read_bytes()
    assert hashlib.sha256(again).hexdigest() == packed.removeprefix("dataset:")
    csv = _upload_uri(bucket, alpha, _dataset(api, "eval.csv", b"x,y\n1,2\n").removeprefix("dataset:"))
    hosted = tmp_path / "host" / "test"
    hosted.mkdir(parents=True)
    (hosted / "t10k.gz").write_bytes(b"\x1f\x8b not really")
    monkeypatch.setenv("TRAINJOBS_HOST_DATA_DIRS", str(tmp_path / "host"))
    job_id = str(uuid.uuid4())

    stage_channels({"training": packed, "eval": csv, "folder": csv.rsplit("/", 1)[0] + "/", "test": str(hosted)},
                   job_id=job_id, project_id=alpha, rules=DataAccessRules.from_env(), limits=StagingLimits(),
                   bucket=bucket, work=tmp_path / "work")

    assert _copied(job_id, "training") == {"train_data.npy": b"\x93NUMPY fake array",
                                           "nested/labels.bin": bytes(range(256))}
    assert _copied(job_id, "eval") == {"eval.csv": b"x,y\n1,2\n"} == _copied(job_id, "folder")
    assert _copied(job_id, "test") == {"t10k.gz": b"\x1f\x8b not really"}  # no gzip undone: as it is
    assert not (tmp_path / "work").exists()


def test_channels_over_the_byte_limit_fail_naming_the_setting_and_copy_nothing(api, db, bucket, tmp_path: Path,
                                                                              monkeypatch) -> None:
    alpha = project_id(db, "alpha")
    small = _upload_uri(bucket, alpha, _dataset(api, "a.csv", b"x\n" * 10).removeprefix("dataset:"))
    big = _upload_uri(bucket, alpha, _dataset(api, "b.csv", b"x\n" * 100).removeprefix("dataset:"))
    monkeypatch.setenv(MAX_BYTES_ENV, "150")
    job_id = str(uuid.uuid4())

    with pytest.raises(ProgramError, match=rf"^program\.channels\.b: the job's channels hold more than 150 bytes "
                                           rf"\({MAX_BYTES_ENV}\)"):
        stage_channels({"a": small, "b": big}, job_id=job_id, project_id=alpha, rules=DataAccessRules(),
                       limits=StagingLimits(), bucket=bucket, work=tmp_path / "work")
    assert _copied(job_id, "a") == {}


def test_an_empty_folder_fails_its_channel(db, bucket, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "host" / "empty").mkdir(parents=True)
    monkeypatch.setenv("TRAINJOBS_HOST_DATA_DIRS", str(tmp_path / "host"))

    with pytest.raises(ProgramError, match=r"^program\.channels\.training: .*empty holds no files"):
        stage_channels({"training": str(tmp_path / "host" / "empty")}, job_id=str(uuid.uuid4()),
                       project_id=project_id(db, "alpha"), rules=DataAccessRules.from_env(), limits=StagingLimits(),
                       bucket=bucket, work=tmp_path / "work")


def test_trainjobs_submit_uploads_local_channels_and_staging_gives_back_their_files(api, db, bucket, tmp_path: Path,
                                                                                   monkeypatch) -> None:
    import yaml
    from click.testing import CliRunner

    from stack.cli import main

    (tmp_path / "train.py").write_bytes(PROGRAM)
    (tmp_path / "data" / "deep").mkdir(parents=True)
    (tmp_path / "data" / "x_train.npy").write_bytes(b"\x93NUMPY x")
    (tmp_path / "data" / "deep" / "y_train.npy").write_bytes(b"\x93NUMPY y")
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(b"\x1f\x8b labels")
    spec = {"program": {"source": "train.py", "channels": {"training": "data", "testing": "t10k-labels-idx1-ubyte.gz"}}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("TRAINJOBS_API_URL", str(api.base_url).rstrip("/"))
    monkeypatch.setenv("TRAINJOBS_API_KEY", api.headers["authorization"].split()[1])

    result = CliRunner().invoke(main, ["submit", str(tmp_path / "job.yaml")])

    assert result.exit_code == 0, result.output
    [job] = api.get("/v1/jobs").json()["jobs"]
    channels = job["spec"]["program"]["channels"]
    assert all(source.startswith("dataset:") for source in channels.values()), channels
    stage_channels(channels, job_id=job["id"], project_id=project_id(db, "alpha"), rules=DataAccessRules(),
                   limits=StagingLimits(), bucket=bucket, work=tmp_path / "work")
    assert _copied(job["id"], "training") == {"x_train.npy": b"\x93NUMPY x", "deep/y_train.npy": b"\x93NUMPY y"}
    assert _copied(job["id"], "testing") == {"t10k-labels-idx1-ubyte.gz": b"\x1f\x8b labels"}


def test_a_prefix_of_too_many_objects_fails_at_the_first_past_the_limit_not_listed_to_its_end(
        db, bucket, tmp_path: Path, monkeypatch) -> None:
    alpha = project_id(db, "alpha")
    for i in range(12):
        storage.blob(f"gs://{bucket}/uploads/{alpha}/many/{i:02d}.npy").upload_from_string(b"x")
    client_type = type(storage.client())
    real_list = client_type.list_blobs
    listed: list[str] = []

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        for blob in real_list(self, *args, **kwargs):  # the real listing; what staging took of it, counted
            listed.append(blob.name)
            yield blob

    monkeypatch.setattr(client_type, "list_blobs", counted)

    with pytest.raises(ProgramError, match=r"^program\.channels\.training: the job's channels hold more than 3 files"):
        stage_channels({"training": f"gs://{bucket}/uploads/{alpha}/many/"}, job_id=str(uuid.uuid4()), project_id=alpha,
                       rules=DataAccessRules(), limits=StagingLimits(max_files=3), bucket=bucket, work=tmp_path / "work")
    assert len(listed) == 4  # a prefix of millions of objects is not listed to its end (nor held in memory) first


def test_a_url_whose_last_part_is_dot_dot_is_saved_under_a_name_of_its_own(db, bucket, tmp_path: Path,
                                                                            monkeypatch) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Data(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"data")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Data)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    monkeypatch.setenv("TRAINJOBS_FETCH_ALLOW_HOSTS", "127.0.0.1")
    job_id = str(uuid.uuid4())
    try:
        stage_channels({"training": f"http://127.0.0.1:{server.server_address[1]}/data/%2e%2e"}, job_id=job_id,
                       project_id=project_id(db, "alpha"), rules=DataAccessRules.from_env(), limits=StagingLimits(),
                       bucket=bucket, work=tmp_path / "work")
    finally:
        server.shutdown()
        server.server_close()
    assert _copied(job_id, "training") == {"download": b"data"}


def test_a_channel_archive_past_the_limits_fails_before_a_byte_is_unpacked(api, db, bucket, tmp_path: Path) -> None:
    # Its members say 4 KiB each; staging counts what they say before unpacking any.
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for i in range(3):
            info = tarfile.TarInfo(f"part-{i}.bin")
            info.size = 4096
            tar.addfile(info, io.BytesIO(b"\0" * 4096))
    packed = _dataset(api, "bomb.tar.gz", buffer.getvalue())
    work = tmp_path / "work"

    with pytest.raises(ProgramError, match=r"^program\.channels\.training: .*bomb\.tar\.gz"):
        stage_channels({"training": packed}, job_id=str(uuid.uuid4()), project_id=project_id(db, "alpha"),
                       rules=DataAccessRules(), limits=StagingLimits(max_bytes=10_000), bucket=bucket, work=work)
    assert not list(work.rglob("part-*"))  # and nothing of it is left in the worker's scratch
