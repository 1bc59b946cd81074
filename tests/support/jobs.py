"""Builders for what most integration and end-to-end tests start from: an API key, a job spec, and a
wait for a job through the API."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from tests.support import eventually
from trainjobs.states import TERMINAL

TERMINAL_STATUSES = TERMINAL  # the name the tests knew it by

# Every table of the data layer, emptied before each test that uses the `db` fixture.
TABLES = "sweep_trials, sweeps, job_events, idempotency_keys, jobs, api_keys, projects, machine_listings"


def make_key(factory, project: str) -> str:  # type: ignore[no-untyped-def]
    from service.db.projects import create_api_key
    from service.db.session import transaction

    with transaction(factory) as session:
        return create_api_key(session, project)


def digits_spec(**overrides: object) -> dict:
    spec: dict = {"name": "digits", "dataset": {"source": "sklearn:digits"}, "model": {"name": "cnn"},
                  "accelerator": {"type": "cpu", "replicas": 2}, "strategy": "mirrored", "training": {"epochs": 2}}
    spec.update(overrides)
    return spec


def wait_for_job(api, job_id: str, until: Callable[[dict[str, Any]], bool] | Collection[str],  # type: ignore[no-untyped-def]
                 timeout: float = 60) -> dict[str, Any]:
    """Poll the API until `until(job)` holds, or, given statuses, until the job has one of them; fail at
    once if the job ends another way, or after the (scaled) timeout. Returns the job as last read."""
    reached = until if callable(until) else (lambda job: job["status"] in until)

    def seen() -> dict[str, Any] | None:
        job: dict[str, Any] = api.get(f"/v1/jobs/{job_id}").json()
        if reached(job):
            return job
        assert job["status"] not in TERMINAL_STATUSES, job
        return None

    return eventually(seen, timeout, lambda: f"job {job_id}: {api.get(f'/v1/jobs/{job_id}').json()}", every=0.2)


@contextmanager
def module_jobs(database_url: str, api_url: str, project: str) -> Iterator[tuple[httpx.Client, Any, Any]]:
    """For a module whose jobs all run on one stack: the tables emptied, a bucket of its own as
    TRAINJOBS_BUCKET, an API client of `project`, and a MonkeyPatch for more of the environment the
    module's agents inherit; (client, session factory, monkeypatch), all undone at the end."""
    import pytest
    from sqlalchemy import text

    from service.db.session import get_engine, session_factory
    from tests.support import scaled
    from trainjobs import storage

    engine = get_engine(database_url)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {TABLES} CASCADE"))
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    storage.ensure_bucket(bucket)
    monkey = pytest.MonkeyPatch()
    monkey.setenv("TRAINJOBS_BUCKET", bucket)
    factory = session_factory(engine)
    client = httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {make_key(factory, project)}"},
                          timeout=scaled(30))
    try:
        yield client, factory, monkey
    finally:
        client.close()
        monkey.undo()


ModuleJobs = tuple[httpx.Client, dict[str, str]]  # a module's API client and its jobs' ids by name


def submit_all(client: httpx.Client, specs: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Each spec submitted as a job named by its key; the ids by name."""
    ids = {}
    for name, spec in specs.items():
        r = client.post("/v1/jobs", json={"name": name, **spec})
        assert r.status_code == 201, (name, r.text)
        ids[name] = r.json()["id"]
    return ids


def finished(jobs: ModuleJobs, name: str) -> dict[str, Any]:
    """Job `name` of the module, once it has ended (each test waits for the one it judges)."""
    from tests.support.local import AGENT_JOB_S

    client, ids = jobs
    return wait_for_job(client, ids[name], TERMINAL, timeout=AGENT_JOB_S)
