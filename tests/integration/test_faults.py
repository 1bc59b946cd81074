"""No fault leaves a job stuck, and no success is recorded as a failure (issue 8, section 2).

The worker against real PostgreSQL with the in-memory cloud. Faults come from a stager, provisioner
or channel that raises, a worker stopped without giving its jobs back (a crash), and PostgreSQL
refusing the worker's connections.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from service.db import queue
from service.db.jobstate import JobStatus, transition
from service.db.models import Job
from service.db.session import get_engine, transaction
from tests.support.jobs import digits_spec
from tests.support import eventually, scaled
from tests.support.worker import FAST, path, submit, wait_for
from trainjobs.messages import AgentReport, AgentState
from trainjobs.spec import JobSpec
from trainjobs.states import TERMINAL
from worker.driver import DriverConfig
from worker.loop import Worker, WorkerConfig
from worker.ports import DatasetError, MachineInfo, MachineRequest, MachineState, StagingStopped
from worker.memory_cloud import MemoryCloud, _FakeMachine, memory_stager

S = JobStatus
QUICK_RETRIES = dict(poll_s=0.05, retry_backoff_s=0.02, retry_backoff_max_s=0.1)


@pytest.fixture
def start_worker(database_url) -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(cloud: MemoryCloud, name: str = "w1", stager=memory_stager, concurrency: int = 4, **cfg) -> Worker:
        config = WorkerConfig(concurrency=concurrency, name=name, driver=DriverConfig(**QUICK_RETRIES),
                              **{**FAST, **cfg})
        worker = Worker(get_engine(database_url), cloud, cloud, stager, config)
        worker.start()
        started.append(worker)
        return worker

    yield start
    for w in started:
        if not w.stopping.is_set():
            w.shutdown(timeout=5)


def load(factory, job_id: uuid.UUID) -> Job:
    with transaction(factory) as s:
        return s.get(Job, job_id)


def agent_state(cloud: MemoryCloud, job_id: uuid.UUID, attempt: int = 1) -> AgentState | None:
    report = cloud.read_status(str(job_id), attempt)
    return None if report is None else report.state


# --- fault injectors ---

class FailingStager:
    """Raises `error` on its first `times` calls (on every call when times is None), then stages."""

    def __init__(self, error: Exception, times: int | None = None):
        self.error, self.times, self.calls = error, times, 0

    def __call__(self, spec: JobSpec, job_id: str, **kwargs) -> str:
        self.calls += 1
        if self.times is None or self.calls <= self.times:
            raise self.error
        return memory_stager(spec, job_id, **kwargs)


class CloudApiDown(MemoryCloud):
    """The provider's API answers every machine lookup with an error."""

    def get(self, name: str) -> MachineInfo | None:
        raise RuntimeError("compute API: 500 backend error")


class NulMetricsCloud(MemoryCloud):
    """Agents report a metric whose name PostgreSQL cannot store (JSON text may not hold \\u0000)."""

    def read_status(self, job_id: str, attempt: int) -> AgentReport | None:
        report = super().read_status(job_id, attempt)
        return None if report is None else report.model_copy(update={"metrics": {"loss\x00": 1.0}})


class ExitingCloud(MemoryCloud):
    """A machine stops once its agent has finished, as a local agent's process exits: only the
    agent's status tells how the attempt ended."""

    def _info(self, m: _FakeMachine) -> MachineInfo:
        info = super()._info(m)
        finished = info.state == MachineState.READY and time.monotonic() - m.created - self.boot_s >= self.train_s
        return replace(info, state=MachineState.STOPPED) if finished else info


def orphan_running_job(factory, cloud: MemoryCloud, job_id: uuid.UUID, owner: str, lease_s: float) -> None:
    """Put the job where a worker named `owner` left it: RUNNING attempt 1 on a machine of the cloud,
    leased for lease_s more seconds (negative: already lapsed)."""
    with transaction(factory) as s:
        s.execute(text("""UPDATE jobs SET status = 'RUNNING', attempt = 1, dataset_uri = 'mem://datasets/d',
                                 staging_at = now(), provisioning_at = now(), running_at = now(),
                                 lease_owner = :owner, lease_expires_at = now() + make_interval(secs => :lease_s)
                           WHERE id = :id"""), {"id": job_id, "owner": owner, "lease_s": lease_s})
    spec = JobSpec.model_validate(digits_spec())
    cloud.create(MachineRequest(str(job_id), 1, spec, cloud.job_dir(str(job_id))))


@contextmanager
def database_refusing_connections(database_url: str) -> Iterator[None]:
    """The test database drops every connection and refuses new ones until the block ends."""
    url = make_url(database_url)
    admin = url.set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{url.database}" ALLOW_CONNECTIONS false')
        try:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                         [url.database])
            yield
        finally:
            conn.execute(f'ALTER DATABASE "{url.database}" ALLOW_CONNECTIONS true')


# --- a driver step that keeps failing ends the job, with the reason ---

@pytest.mark.parametrize("cloud,stager,error", [
    (MemoryCloud(), FailingStager(OSError(36, "File name too long")), "OSError: [Errno 36] File name too long"),
    (CloudApiDown(), memory_stager, "RuntimeError: compute API: 500 backend error"),
    (NulMetricsCloud(train_s=60), memory_stager, "unsupported Unicode escape sequence"),
], ids=["staging raises", "provisioner raises", "database refuses what the agent reported"])
def test_a_step_that_keeps_failing_fails_the_job_with_the_error(db, start_worker, cloud, stager, error):
    start_worker(cloud, stager=stager)
    [job_id] = submit(db)
    job = wait_for(db, job_id, {S.FAILED})
    assert job.error.startswith("the worker could not drive this job: ") and error in job.error
    assert job.driver_failures == DriverConfig().max_driver_failures
    assert job.lease_owner is None and cloud.list({}) == []


def test_a_step_that_fails_then_works_is_retried_and_the_count_reset(db, start_worker):
    stager = FailingStager(OSError("stale file handle"), times=2)
    start_worker(MemoryCloud(), stager=stager)
    [job_id] = submit(db)
    job = wait_for(db, job_id, TERMINAL)
    assert job.status == S.SUCCEEDED and job.driver_failures == 0 and stager.calls == 3


def test_failures_counted_by_earlier_workers_count_toward_the_limit(db, start_worker):
    [job_id] = submit(db)
    with transaction(db) as s:  # four failed steps under workers since restarted
        s.execute(text("UPDATE jobs SET driver_failures = 4 WHERE id = :id"), {"id": job_id})
    stager = FailingStager(OSError("No space left on device"))
    start_worker(MemoryCloud(), stager=stager)
    job = wait_for(db, job_id, {S.FAILED})
    assert "No space left on device" in job.error and stager.calls == 1


# --- leases: renewed only while a driver runs ---

def test_a_job_leased_to_a_worker_that_is_not_driving_it_is_taken_over(db, start_worker):
    cloud = MemoryCloud(train_s=0.5)
    [job_id] = submit(db)
    orphan_running_job(db, cloud, job_id, owner="w1", lease_s=FAST["lease_s"])  # w1's driver is gone
    start_worker(cloud, "w1")
    job = wait_for(db, job_id, {S.SUCCEEDED})
    assert "RECOVERING" in path(db, job_id) and job.attempt == 1


# --- stored error text ---

@pytest.mark.parametrize("raw,stored", [
    ("PATH=/usr/bin\x00HOME=/root\x00", "PATH=/usr/binHOME=/root"),
    ("\x1b[31mred\x1b[0m alert\r\n\tindented", "red alert\n\tindented"),
    ("lone \ud800 surrogate", "lone \ufffd surrogate"),
], ids=["NUL bytes", "ANSI colours and carriage returns", "lone surrogate"])
def test_error_text_is_stored_readable(db, raw, stored):
    [job_id] = submit(db)
    with transaction(db) as s:
        transition(s, job_id, S.QUEUED, S.STAGING, reason="test")
        transition(s, job_id, S.STAGING, S.FAILED, reason=f"failed: {raw}", error=raw)
    assert load(db, job_id).error == stored


def test_error_text_is_capped(db):
    [job_id] = submit(db)
    with transaction(db) as s:
        transition(s, job_id, S.QUEUED, S.STAGING, reason="test")
        transition(s, job_id, S.STAGING, S.FAILED, reason="test", error="x" * 1_000_000)
    assert 0 < len(load(db, job_id).error) <= 4000


def test_a_dataset_error_quoting_nul_bytes_fails_the_job_readably(db, start_worker):
    stager = FailingStager(DatasetError("no label column in 'PATH=/usr/bin\x00HOME=/root\x00'"))
    start_worker(MemoryCloud(), stager=stager)
    [job_id] = submit(db)
    job = wait_for(db, job_id, {S.FAILED})
    assert job.error == "dataset: no label column in 'PATH=/usr/binHOME=/root'"


# --- recovery reads the agent's status first ---

@pytest.mark.parametrize("limits", [{}, {"max_retries": 0}], ids=["default retries", "max_retries 0"])
def test_a_job_whose_agent_finished_while_its_worker_was_dead_succeeds(db, start_worker, limits):
    cloud = ExitingCloud(train_s=1.0)
    dead = start_worker(cloud, "dead")
    [job_id] = submit(db, limits=limits)
    wait_for(db, job_id, {S.RUNNING})
    dead.stopping.set()  # a crash: its threads stop, nothing is given back
    eventually(lambda: agent_state(cloud, job_id) == AgentState.SUCCEEDED, 15, "the agent finished")
    start_worker(cloud, "heir")
    job = wait_for(db, job_id, TERMINAL)
    assert job.status == S.SUCCEEDED and job.attempt == 1 and job.metrics == {"val_accuracy": 0.99}
    assert len(cloud.created) == 1 and cloud.list({}) == []


def test_a_job_whose_agent_failed_while_its_worker_was_dead_fails_with_the_agents_error(db, start_worker):
    cloud = ExitingCloud(train_s=0, fail_next=["ValueError: shapes (3,) and (4,) not aligned"])
    [job_id] = submit(db)
    orphan_running_job(db, cloud, job_id, owner="dead", lease_s=-1)
    eventually(lambda: agent_state(cloud, job_id) == AgentState.FAILED, 15, "the agent failed")
    start_worker(cloud, "heir")
    job = wait_for(db, job_id, TERMINAL)
    assert job.status == S.FAILED and "shapes (3,) and (4,) not aligned" in job.error
    assert job.attempt == 1 and cloud.list({}) == []


# --- a taken-over job gets a slot first ---

def test_a_taken_over_job_is_watched_at_once_while_queued_jobs_fill_every_slot(db, start_worker):
    cloud = MemoryCloud(train_s=60)
    dead = start_worker(cloud, "dead", concurrency=1, lease_s=60)
    [orphaned] = submit(db)
    wait_for(db, orphaned, {S.RUNNING})
    dead.stopping.set()
    [queued] = submit(db)
    start_worker(cloud, "heir", concurrency=1)
    wait_for(db, queued, {S.RUNNING})  # the heir's one slot is busy
    with transaction(db) as s:
        queue.release_lease(s, orphaned, "dead")  # the dead worker's lease runs out
    eventually(lambda: (j := load(db, orphaned)).lease_owner == "heir" and j.status == S.RUNNING, 15,
               "the heir adopted the orphaned machine")
    assert load(db, queued).status == S.RUNNING and len(cloud.created) == 2


# --- cancel interrupts staging ---

def stage_until_stopped(spec: JobSpec, job_id: str, *, project_id: str,
                        should_stop: Callable[[], bool] = lambda: False) -> str:
    """A dataset that takes as long to stage as anyone lets it."""
    deadline = time.monotonic() + scaled(60)
    while not should_stop() and time.monotonic() < deadline:
        time.sleep(0.02)
    raise StagingStopped()


def test_cancel_while_staging_ends_the_job_cancelled_promptly(db, api, start_worker):
    start_worker(MemoryCloud(), stager=stage_until_stopped)
    job_id = uuid.UUID(api.post("/v1/jobs", json=digits_spec()).json()["id"])
    wait_for(db, job_id, {S.STAGING})
    assert api.post(f"/v1/jobs/{job_id}/cancel").json()["status"] == "CANCELLING"
    wait_for(db, job_id, {S.CANCELLED}, timeout=5)
    assert path(db, job_id)[-3:] == ["STAGING", "CANCELLING", "CANCELLED"]


# --- the database goes away for a while ---

def test_a_worker_rides_out_a_database_outage_and_finishes_its_jobs(db, database_url, start_worker):
    cloud = MemoryCloud(train_s=1.0)
    start_worker(cloud, lease_s=60)
    [job_id] = submit(db)
    wait_for(db, job_id, {S.RUNNING})
    with database_refusing_connections(database_url):
        # The agent finishes while the database is down; the driver's steps fail far more often
        # than its failure limit meanwhile.
        eventually(lambda: agent_state(cloud, job_id) == AgentState.SUCCEEDED, 15, "the agent finished")
        time.sleep(scaled(1.0))
    job = wait_for(db, job_id, TERMINAL)
    assert job.status == S.SUCCEEDED and job.attempt == 1
    [after] = submit(db)  # the claim loop lived through it too
    assert wait_for(db, after, TERMINAL).status == S.SUCCEEDED
