"""A job already stored is run by the spec rules it was accepted under: a validator tightened in a later
release refuses new jobs at submit, never a job already queued (issue 19). And what the worker charges a
job against limits.max_cost_usd is the price of the machine it gets, CPU VMs included."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from service.db import jobs as jobdata
from service.db.jobstate import JobStatus
from service.db.projects import ensure_project
from service.db.session import get_engine, transaction
from tests.support.jobs import digits_spec
from tests.support.worker import wait_for
from trainjobs.messages import AgentAssignment
from trainjobs.spec import SPEC_VERSION, JobSpec, parse_stored
from trainjobs.states import TERMINAL
from worker.driver import DriverConfig
from worker.loop import Worker, WorkerConfig
from worker.memory_cloud import MemoryCloud, memory_stager

S = JobStatus

# Rows as an older release wrote them: no spec_version, and what today's submit refuses.
OLDER_RELEASE_ROWS = {
    # Before built-in params were checked at submit, a typo was stored as given.
    "params today's submit refuses": digits_spec(model={"name": "mlp", "params": {"hiden_units": [8]}}),
    # A field a later release removed from the spec.
    "a field this release no longer has": {**digits_spec(), "training": {"epochs": 2, "retired_option": True}},
}


def _store_raw(factory: Any, spec: dict[str, Any]) -> uuid.UUID:
    """Insert the spec exactly as given, as the release that accepted it would have stored it."""
    with transaction(factory) as s:
        project = ensure_project(s, "p")
        return jobdata.create_job(s, project, spec, idempotency_key=None, request_hash=b"")[0].id


@pytest.fixture
def worker(database_url: str):  # type: ignore[no-untyped-def]
    started: list[Worker] = []

    def start(cloud: MemoryCloud) -> Worker:
        config = WorkerConfig(concurrency=2, name="w1", lease_s=2.0, heartbeat_s=0.3, poll_s=0.2,
                              driver=DriverConfig(poll_s=0.05))
        w = Worker(get_engine(database_url), cloud, cloud, memory_stager, config)
        started.append(w)
        w.start()
        return w

    yield start
    for w in started:
        w.shutdown(timeout=5)


@pytest.mark.parametrize("spec", OLDER_RELEASE_ROWS.values(), ids=OLDER_RELEASE_ROWS.keys())
def test_a_job_stored_under_older_rules_still_runs(db, worker, spec):
    job_id = _store_raw(db, spec)
    worker(MemoryCloud())
    job = wait_for(db, job_id, TERMINAL)
    assert job.status == S.SUCCEEDED, job.error
    assert job.driver_failures == 0


@pytest.mark.parametrize("spec", OLDER_RELEASE_ROWS.values(), ids=OLDER_RELEASE_ROWS.keys())
def test_the_agent_reads_an_older_releases_spec_as_stored(spec):
    assignment = AgentAssignment.model_validate({"job_id": "j", "attempt": 1, "spec": spec, "dataset_uri": "gs://b/d"})
    assert assignment.spec.spec_version == 1


def test_a_spec_stored_without_a_version_is_version_1_and_a_submitted_one_is_todays():
    assert parse_stored(digits_spec()).spec_version == 1
    assert JobSpec.model_validate(digits_spec()).spec_version == SPEC_VERSION
    # A spec copied from an older job's GET is checked by today's rules, so it is stamped with today's version.
    assert JobSpec.model_validate(digits_spec(spec_version=1)).spec_version == SPEC_VERSION


def test_a_cpu_job_is_charged_for_its_vm_against_max_cost(db, worker):
    # Two CPU replicas get an n2-standard-4, about 0.19 USD an hour: a millionth of a dollar lasts
    # a fiftieth of a second. At $0 an hour (the old price of every CPU job) the limit never fired.
    spec = JobSpec.model_validate(digits_spec(limits={"max_cost_usd": 0.000001})).model_dump(mode="json")
    job_id = _store_raw(db, spec)
    worker(MemoryCloud(train_s=30))
    job = wait_for(db, job_id, TERMINAL)
    assert job.status == S.FAILED and "max_cost_usd" in (job.error or "")
