"""Issue 25: a running job whose agent has nothing new to say costs little. The worker reads status.json
with a download conditional on the generation it read last (304, no body, while nothing was written)
and, while the reports bring nothing a user sees, ever less often, down to once in `status_idle_polls`
polls; the row is written only when what a user sees changed. A new report is still seen within that
interval, and a cancel as soon as before. Requests are counted by the GCS emulator as they arrive
(stack/emulator_requests.py): the worker's real storage client against it, real PostgreSQL."""

from __future__ import annotations

import os
import threading
import time
import uuid
from datetime import UTC, datetime

from service.db import jobs as jobdata
from service.db.models import Job
from service.db.session import get_engine, transaction
from stack.emulator_requests import request_counts
from tests.support import eventually, scaled
from tests.support.worker import FAST, submit, wait_for
from trainjobs import storage
from trainjobs.job_paths import JobPaths
from trainjobs.states import JobStatus as S
from worker.driver import DriverConfig
from worker.gcs_channel import GcsJobChannel
from worker.loop import Worker, WorkerConfig
from worker.memory_cloud import MemoryCloud, memory_stager

POLL_S = 0.1
IDLE_POLLS = 10  # status.json that brings nothing new: read once a second here (10 s at the default 1 s poll)


def _report(progress: float) -> dict:
    return {"state": "running", "phase": "training", "attempt": 1, "progress": progress,
            "heartbeat_at": datetime.now(UTC).isoformat()}


def _status_key(job_id: uuid.UUID) -> str:
    return storage.split_uri(JobPaths.for_job(str(job_id)).status)[1]


def _status_gets(bucket: str, job_id: uuid.UUID) -> dict[int, int]:
    """GETs of the job's status.json the emulator served so far, by the status it answered."""
    key, by_status = _status_key(job_id), {}
    for row in request_counts(os.environ["STORAGE_EMULATOR_HOST"], bucket):
        if row["object"] == key and row["class"] == "B":
            by_status[row["status"]] = by_status.get(row["status"], 0) + row["count"]
    return by_status


def _running_job(db, database_url, running_workers, *, poll_s: float = POLL_S) -> uuid.UUID:
    """A job RUNNING on a machine that stays up (the in-memory cloud's) whose agent is this test: its
    status.json is what the test writes, read by the worker's real GCS channel."""
    job_id = submit(db)[0]
    storage.write_json(JobPaths.for_job(str(job_id)).status, _report(0.1))
    config = WorkerConfig(concurrency=1, name=f"reads-{uuid.uuid4().hex[:6]}", **FAST,  # type: ignore[arg-type]
                          driver=DriverConfig(poll_s=poll_s, status_idle_polls=IDLE_POLLS))
    worker = Worker(get_engine(database_url), MemoryCloud(), GcsJobChannel(), memory_stager, config)
    running_workers.append(worker)
    worker.start()
    wait_for(db, job_id, {S.RUNNING})
    return job_id


def _row(db, job_id: uuid.UUID) -> Job:
    with transaction(db) as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job


def test_an_agent_that_writes_nothing_costs_a_304_per_idle_interval(db, database_url, bucket, running_workers):
    job_id = _running_job(db, database_url, running_workers)
    before = _status_gets(bucket, job_id)
    watched = scaled(3)
    time.sleep(watched)
    after = _status_gets(bucket, job_id)

    new = {code: n - before.get(code, 0) for code, n in after.items() if n > before.get(code, 0)}
    # Nothing was written, so nothing is downloaded: every read is answered 304 Not Modified.
    assert set(new) <= {304}, new
    # At one read a poll this would be 30 (x scale); reads double their wait from the last news
    # (1, 2, 4, 8 polls) and then come once every IDLE_POLLS polls. A loaded host only reads less.
    idle_s = POLL_S * IDLE_POLLS
    assert sum(new.values()) <= 4 + watched / idle_s + 1, new


def test_a_heartbeat_alone_writes_nothing_to_the_row_and_news_arrives_within_the_idle_interval(
        db, database_url, bucket, running_workers):
    job_id = _running_job(db, database_url, running_workers)
    eventually(lambda: _row(db, job_id).progress == 0.1, 5, "the first report's progress reached the row")
    written = _row(db, job_id).updated_at
    stop = threading.Event()

    def heartbeat() -> None:  # what the agent writes every TRAINJOBS_HEARTBEAT_S: the same, a new heartbeat
        while not stop.wait(POLL_S):
            storage.write_json(JobPaths.for_job(str(job_id)).status, _report(0.1))

    def downloads() -> int:
        return sum(n for code, n in _status_gets(bucket, job_id).items() if code in (200, 206))

    before = downloads()
    beating = threading.Thread(target=heartbeat, daemon=True)
    beating.start()
    try:
        time.sleep(scaled(2))
        assert _row(db, job_id).updated_at == written  # what it read changed nothing a user sees
        assert downloads() > before  # and it did read them
    finally:
        stop.set()
        beating.join()

    storage.write_json(JobPaths.for_job(str(job_id)).status, _report(0.5))
    eventually(lambda: _row(db, job_id).progress == 0.5, POLL_S * IDLE_POLLS + 2, "the new progress reached the row")
    assert _row(db, job_id).updated_at > written


def test_a_cancel_still_ends_a_quiet_job_within_5_seconds_at_the_default_poll(db, database_url, bucket,
                                                                               running_workers):
    job_id = _running_job(db, database_url, running_workers, poll_s=DriverConfig().poll_s)
    time.sleep(scaled(1))  # quiet for a moment: the status reads back off from the first report
    with transaction(db) as session:
        job = _row(db, job_id)
        jobdata.request_cancel(session, job.project_id, job_id)
    wait_for(db, job_id, {S.CANCELLED}, timeout=5)
