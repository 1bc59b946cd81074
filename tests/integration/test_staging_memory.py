"""Staging's memory and time are bounded whatever a dataset holds (issue 36, finding 3): a cell's length
costs that cell, not every cell; a dataset that needs more than one staging may have fails its own job
at STAGING, and the worker goes on staging other projects' jobs. Each staging runs in a child process
with a memory limit (worker/staging_child.py)."""

from __future__ import annotations

import gzip
import os
import resource
import signal
import socket
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.db import jobs as jobdata
from service.db.jobstate import JobStatus
from service.db.projects import ensure_project
from service.db.session import transaction
from service.db.outages import Outage, outage_of
from tests.support import scaled
from tests.support.staging import stage
from tests.support.staging import operator_allows_test_files  # noqa: F401 - an autouse fixture
from tests.support.worker import make_worker, path, wait_for
from trainjobs.spec import JobSpec
from trainjobs.storage_limits import StorageUnavailable
from worker.ports import DatasetError, StagingStopped
from worker.staging.budget import MEMORY_ENV, TIMEOUT_ENV
from worker.staging_adapter import GcsStager
from worker.staging_child import StagingCrashed, run_in_child

LONG_CELL = 131_000  # just under the csv module's field limit (131,072), as the review's file was
ROWS = 1000


def hostile_csv_gz(folder: Path) -> Path:
    """The review's file: under 1.4 KB of gzip, 1,000 ordinary rows, one text cell of 131,000 characters.
    A fixed-width array of its cells took 1,000 x 7 x 131,000 x 4 bytes: 3.7 GB."""
    lines = ["a,b,c,d,e,note,label"]
    for r in range(ROWS):
        note = "word " * (LONG_CELL // 5) if r == 0 else f"a short note {r % 7}"
        numbers = ",".join(str(r * k % 10) for k in (1, 3, 7, 9, 11))
        lines.append(f"{numbers},{note.strip()},{r % 2}")
    target = folder / "hostile.csv.gz"
    target.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=9))
    return target


def spec_of(source: Path | str, model: str = "mlp") -> JobSpec:
    return JobSpec.model_validate({"name": "memory", "dataset": {"source": str(source)}, "model": {"name": model},
                                   "accelerator": {"type": "cpu", "replicas": 1}, "training": {"epochs": 1}})


def _max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def test_a_long_cell_stages_within_a_512_mib_limit_and_off_the_workers_memory(
        bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = hostile_csv_gz(tmp_path)
    assert source.stat().st_size < 2048
    monkeypatch.setenv(MEMORY_ENV, "512")  # the fork server's libraries included
    before = _max_rss_mib()

    uri = GcsStager(tmp_path / "staging")(spec_of(source), "long-cell", project_id="p")

    assert uri.startswith(f"gs://{bucket}/datasets/")
    # The worker's own peak did not move: the cells lived (and died) in the staging child.
    assert _max_rss_mib() - before < 256


def test_what_a_staging_child_sends_the_worker_is_small_whatever_the_vocabulary_holds(
        bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A categorical column of 200 distinct 5,000-character values: a 1 MB vocabulary in the manifest,
    which stays in the child (and GCS); the worker receives the staged dataset's address."""
    import pickle

    from worker import staging_adapter

    source = tmp_path / "wide.csv"
    source.write_text("a,kind,label\n" + "".join(f"{r},{'k' * 5000}{r},{r % 2}\n" for r in range(200)))
    answers: list[int] = []

    def measured(*args: Any, **kwargs: Any) -> Any:
        answer = run_in_child(*args, **kwargs)
        answers.append(len(pickle.dumps(answer)))
        return answer

    monkeypatch.setattr(staging_adapter, "run_in_child", measured)
    uri = GcsStager(tmp_path / "staging")(spec_of(source), "wide", project_id="p")

    assert uri.startswith(f"gs://{bucket}/datasets/")
    assert answers and answers[0] < 4096


def test_a_cell_past_the_field_limit_is_refused_naming_the_file_and_line(bucket: str, tmp_path: Path) -> None:
    source = tmp_path / "long.csv"
    source.write_text("a,note,label\n1,short,0\n2," + "x" * 200_000 + ",1\n")
    with pytest.raises(DatasetError) as refused:
        stage(source, bucket, tmp_path / "work")
    assert str(refused.value) == "long.csv line 3: a cell longer than 131072 characters, the most staging reads from one cell"


def _npz_bomb(folder: Path, mib: int = 768) -> Path:
    """An .npz of a few hundred KB whose x decompresses to `mib` MiB of zeros, written a chunk at a time."""
    target = folder / "bomb.npz"
    rows, width = mib * 64, 4096  # float32: 16 KiB a row
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        with z.open("x.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (rows, width)})
            chunk = bytes(16 << 20)
            for _ in range(mib // 16):
                f.write(chunk)
        with z.open("y.npy", "w") as f:
            np.lib.format.write_array(f, np.arange(rows) % 2)
    return target


def test_a_dataset_past_the_memory_limit_fails_its_job_and_the_worker_stages_the_next(
        db: Any, database_url: str, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        running_workers: list[Any]) -> None:
    monkeypatch.setenv(MEMORY_ENV, "512")
    bomb = _npz_bomb(tmp_path)
    with transaction(db) as s:
        hostile = jobdata.create_job(s, ensure_project(s, "hostile"), spec_of(bomb).model_dump(mode="json"),
                                     idempotency_key=None, request_hash=b"")[0].id
        other = jobdata.create_job(s, ensure_project(s, "other"), spec_of("sklearn:iris").model_dump(mode="json"),
                                   idempotency_key=None, request_hash=b"")[0].id
    from worker.memory_cloud import MemoryCloud

    cloud = MemoryCloud()
    worker = make_worker(database_url, cloud, "w", stager=GcsStager(tmp_path / "staging"), concurrency=1)
    running_workers.append(worker)
    worker.start()

    failed = wait_for(db, hostile, {JobStatus.FAILED}, timeout=60)
    assert failed.error == ("dataset: staging ran out of its 512 MiB memory limit (TRAINJOBS_STAGING_MEMORY_MB): the "
                            "dataset needs more memory to convert than one staging may use")
    assert path(db, hostile) == ["QUEUED", "STAGING", "FAILED"]
    wait_for(db, other, {JobStatus.PROVISIONING, JobStatus.RUNNING, JobStatus.SUCCEEDED}, timeout=60)
    assert not worker.stopping.is_set()


def test_a_gzip_encoded_program_archive_is_checked_as_stored_not_inflated_onto_the_workers_disk(
        bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job can store an object of its jobs/<id>/ gzip-encoded; a later job naming it as its program is
    checked by staging, which must download the stored 64 KB and not the 64 MiB the client would inflate."""
    import uuid

    from trainjobs import storage
    from trainjobs.source_rules import DataAccessRules
    from trainjobs.spec import ProgramSpec
    from worker import staging_adapter
    from worker.ports import ProgramError

    stored = gzip.compress(bytes(64 << 20))
    uri = f"gs://{bucket}/jobs/{uuid.uuid4()}/artifacts/program.tar.gz"
    blob = storage.blob(uri)
    blob.content_encoding = "gzip"
    blob.upload_from_string(stored, content_type="application/octet-stream")
    listed: list[int] = []
    archive_names = staging_adapter.archive_names

    def listing(path: Path) -> list[str]:
        listed.append(path.stat().st_size)
        return archive_names(path)

    monkeypatch.setattr(staging_adapter, "archive_names", listing)
    with pytest.raises(ProgramError, match="has no __main__.py"):  # 64 MiB of zeros: an empty tar
        staging_adapter.check_program(ProgramSpec(source=uri), DataAccessRules(), bucket, str(uuid.uuid4()),
                                      tmp_path / "work")
    assert listed == [len(stored)]


@pytest.fixture
def silent_server() -> Iterator[str]:
    """An http://127.0.0.1 URL whose server accepts connections and never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not done.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/data.npz"
    done.set()
    thread.join()
    for conn in accepted:
        conn.close()
    listener.close()


def test_a_staging_that_hangs_fails_its_job_at_the_time_limit(
        bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, silent_server: str) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, "1")  # the server never answers: only the time limit ends it
    with pytest.raises(DatasetError) as refused:
        GcsStager(tmp_path / "staging")(spec_of(silent_server), "hangs", project_id="p")
    assert str(refused.value) == ("staging took longer than 1 s, the most one staging may take "
                                  "(TRAINJOBS_STAGING_TIMEOUT_S); it was stopped")
    assert not (tmp_path / "staging" / "hangs").exists()


def test_a_cancel_stops_a_staging_that_hangs(bucket: str, tmp_path: Path, silent_server: str) -> None:
    """The child waits on a server that never answers, deaf to the stop flag: the worker kills it."""
    cancelled = threading.Event()
    threading.Timer(0.5, cancelled.set).start()
    with pytest.raises(StagingStopped):
        GcsStager(tmp_path / "staging")(spec_of(silent_server), "cancelled", project_id="p",
                                        should_stop=cancelled.is_set)


def _storage_is_down() -> None:
    raise StorageUnavailable("storage unreachable for 5.0s")


class _Unpicklable(Exception):
    def __init__(self, a: str, b: str):
        super().__init__(f"{a} {b}")  # pickled args are one string: unpickling calls __init__ with one


def _raises_unpicklable() -> None:
    raise _Unpicklable("half", "done")


def _killed() -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer ends a process


def test_a_staging_child_that_dies_fails_its_job_with_the_reason() -> None:
    with pytest.raises(DatasetError) as died:
        run_in_child(_killed, memory_mb=2048, timeout_s=scaled(60))
    assert str(died.value).startswith("staging's process ended without an answer (killed by SIGKILL)")


def test_an_error_in_the_child_reaches_the_driver_as_the_same_class_or_by_name() -> None:
    """The driver retries an outage without counting it (service/db/outages.py): the class must cross."""
    with pytest.raises(StorageUnavailable) as down:
        run_in_child(_storage_is_down, memory_mb=2048, timeout_s=scaled(60))
    assert outage_of(down.value) is Outage.STORAGE
    with pytest.raises(StagingCrashed, match=r"test_staging_memory\._Unpicklable: half done"):
        run_in_child(_raises_unpicklable, memory_mb=2048, timeout_s=scaled(60))


def test_a_gzip_encoded_dataset_object_is_staged_as_stored_not_inflated_past_the_byte_budget(
        bucket: str, tmp_path: Path) -> None:
    """An object stored with Content-Encoding: gzip (a job can store its own that way) is 20 KB in storage and
    8 MiB of valid CSV inflated; the budget counts stored bytes, so staging reads the stored bytes: not a
    CSV, refused, instead of 8 MiB written to the worker's disk under a 1 MiB limit."""
    from tests.support.staging import PROJECT, stage
    from trainjobs import storage
    from worker.staging.budget import StagingLimits

    inflated = b"1.0,2.0,0\n1.0,2.0,1\n" * (400 << 10)
    uri = f"gs://{bucket}/uploads/{PROJECT}/{'a' * 64}/data.csv"
    blob = storage.blob(uri)
    blob.content_encoding = "gzip"
    blob.upload_from_string(gzip.compress(inflated), content_type="text/csv")
    with pytest.raises(DatasetError, match="UTF-8"):
        stage(uri, bucket, tmp_path / "work", limits=StagingLimits(max_bytes=1 << 20),
              options={"header": "none"})
