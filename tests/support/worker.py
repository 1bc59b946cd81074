"""The worker against real PostgreSQL with the in-memory cloud standing in for GCP: jobs inserted as the
API would, a worker with short timings, and a wait on a job's row."""

from __future__ import annotations

import uuid

from sqlalchemy import select

from service.db import jobs as jobdata
from service.db.models import Job, JobEvent
from service.db.projects import ensure_project
from service.db.session import get_engine, transaction
from tests.support import eventually
from tests.support.jobs import digits_spec
from trainjobs.spec import JobSpec
from worker.driver import DriverConfig
from worker.loop import Worker, WorkerConfig
from worker.memory_cloud import memory_stager

FAST = dict(lease_s=2.0, heartbeat_s=0.3, poll_s=0.2)


def submit(factory, n: int = 1, **overrides) -> list[uuid.UUID]:
    spec = JobSpec.model_validate(digits_spec(**overrides)).model_dump(mode="json")
    with transaction(factory) as s:
        project = ensure_project(s, "p")
        return [jobdata.create_job(s, project, spec, idempotency_key=None, request_hash=b"")[0].id for _ in range(n)]


def make_worker(database_url, cloud, name, stager=memory_stager, concurrency=4, **cfg) -> Worker:
    config = WorkerConfig(concurrency=concurrency, name=name, driver=DriverConfig(poll_s=0.05), **{**FAST, **cfg})
    return Worker(get_engine(database_url), cloud, cloud, stager, config)


def wait_for(factory, job_id, statuses, timeout=15.0) -> Job:
    seen: list[Job] = []

    def reached() -> Job | None:
        with transaction(factory) as s:
            seen[:] = [s.get(Job, job_id)]
        return seen[0] if seen[0].status in statuses else None

    return eventually(reached, timeout, lambda: f"job {job_id} reached {sorted(s.value for s in statuses)}; it is {seen[0].status.value}")


def path(factory, job_id) -> list[str]:
    with transaction(factory) as s:
        return [e.to_status.value for e in s.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id))]


def shut_down(workers: list[Worker]) -> None:
    """The end of the `running_workers` fixture (tests/conftest.py): every worker a test started stops."""
    for w in workers:
        if not w.stopping.is_set():
            w.shutdown(timeout=5)
