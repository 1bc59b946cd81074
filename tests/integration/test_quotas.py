"""Limits on what one project runs at once and on what one job may ask for (issue 8, section 3),
against the real API and PostgreSQL. A job over its project's quota waits in QUEUED, says why, and
starts by itself when a slot frees; other projects' jobs start past it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import select

from service.db.jobstate import JobStatus
from service.db.models import Job, Project
from service.db.queue import claim_next_job
from service.db.quotas import set_quota
from service.db.session import get_engine, transaction
from tests.support.jobs import digits_spec, make_key
from tests.support import eventually
from worker.driver import DriverConfig
from worker.loop import Worker, WorkerConfig
from worker.memory_cloud import MemoryCloud, memory_stager


def gpus(count: int, **overrides: Any) -> dict[str, Any]:
    return digits_spec(**{"accelerator": {"type": "gpu", "gpu_type": "nvidia-l4", "count": count},
                          "strategy": "mirrored" if count > 1 else "one_device", **overrides})


def submit(client: httpx.Client, spec: dict[str, Any] | None = None) -> str:
    r = client.post("/v1/jobs", json=spec or digits_spec())
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def limit(factory, project: str, **limits: int | None) -> None:  # type: ignore[no-untyped-def]
    with transaction(factory) as s:
        set_quota(s, project, **limits)


def claim_all(database_url: str) -> set[str]:
    """Claim until the claim finds nothing it may start, as a worker's claim loop does."""
    claimed = set()
    with get_engine(database_url).connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        while (claim := claim_next_job(conn, "w1", 60)) is not None:
            claimed.add(str(claim.job_id))
    return claimed


def status(factory, job_id: str) -> JobStatus:  # type: ignore[no-untyped-def]
    with transaction(factory) as s:
        return s.scalars(select(Job.status).where(Job.id == job_id)).one()


@pytest.fixture
def beta(db, api_url: str) -> Iterator[httpx.Client]:  # type: ignore[no-untyped-def]
    """A client for a second project."""
    key = make_key(db, "beta")
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
        yield client


@pytest.mark.parametrize(("accelerator", "workers", "held"), [
    ({"type": "gpu", "gpu_type": "nvidia-l4", "count": 4}, 2, 8),  # GPUs on every worker
    ({"type": "tpu", "tpu_type": "v4-8"}, 1, 4),  # v4 names TensorCores: 8 cores are 4 chips
    ({"type": "tpu", "tpu_type": "v5litepod-8"}, 1, 8),
])
def test_submit_records_the_accelerators_a_job_will_hold(api, db, accelerator, workers, held):
    # CPU replicas hold none: they are bounded per job (TRAINJOBS_MAX_CPU_REPLICAS) and by the job quota.
    job_id = submit(api, digits_spec(accelerator=accelerator, workers=workers, strategy="auto"))
    with transaction(db) as s:
        assert s.scalars(select(Job.accelerators).where(Job.id == job_id)).one() == held


def test_a_project_at_its_job_quota_waits_while_another_projects_job_starts(api, beta, db, database_url):
    limit(db, "alpha", max_running_jobs=1)
    first, second = submit(api), submit(api)
    other = submit(beta)
    assert claim_all(database_url) == {first, other}
    assert status(db, second) == JobStatus.QUEUED


def test_a_project_at_its_accelerator_quota_waits_while_another_projects_job_starts(api, beta, db, database_url):
    limit(db, "alpha", max_accelerators=6)
    first, second = submit(api, gpus(4)), submit(api, gpus(4))
    other = submit(beta, gpus(4))
    assert claim_all(database_url) == {first, other}
    assert status(db, second) == JobStatus.QUEUED


def test_workers_claiming_at_once_stay_within_the_quota(api, db, database_url):
    limit(db, "alpha", max_running_jobs=5)
    for _ in range(20):
        submit(api)
    claimed: list[set[str]] = []
    threads = [threading.Thread(target=lambda: claimed.append(claim_all(database_url))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(len(c) for c in claimed) == 5


def test_within_a_project_a_big_job_is_not_overtaken_by_smaller_ones(api, db, database_url):
    limit(db, "alpha", max_accelerators=8)
    first = submit(api, gpus(4))
    submit(api, gpus(8))  # waits for the 4 in use
    submit(api, gpus(1))  # would fit now, but starting it would keep the 8 waiting longer
    assert claim_all(database_url) == {first}


def test_a_project_without_its_own_quota_gets_the_deployment_default(api, db, database_url, monkeypatch):
    monkeypatch.setenv("TRAINJOBS_DEFAULT_MAX_RUNNING_JOBS", "2")
    jobs = [submit(api) for _ in range(3)]
    assert claim_all(database_url) == set(jobs[:2])


def test_a_waiting_job_says_which_quota_it_waits_for(api, db, database_url):
    limit(db, "alpha", max_running_jobs=1)
    first, second = submit(api), submit(api)
    claim_all(database_url)
    assert api.get(f"/v1/jobs/{first}").json()["wait_reason"] is None
    assert api.get(f"/v1/jobs/{second}").json()["wait_reason"] == "project at quota: 1 of 1 running jobs"
    listed = {j["id"]: j["wait_reason"] for j in api.get("/v1/jobs").json()["jobs"]}
    assert listed == {first: None, second: "project at quota: 1 of 1 running jobs"}


def test_a_job_queued_behind_its_projects_older_jobs_says_they_start_first(api, db):
    limit(db, "alpha", max_running_jobs=2)
    first, second, third = submit(api), submit(api), submit(api)
    reasons = {j["id"]: j["wait_reason"] for j in api.get("/v1/jobs").json()["jobs"]}
    assert reasons == {first: None, second: None,
                       third: "project at quota: 0 of 2 running jobs, 2 queued before this one"}


def test_a_small_job_behind_a_big_one_says_what_the_big_one_needs(api, db, database_url):
    limit(db, "alpha", max_accelerators=8)
    submit(api, gpus(4))
    claim_all(database_url)
    big, small = submit(api, gpus(8)), submit(api, gpus(1))
    assert api.get(f"/v1/jobs/{big}").json()["wait_reason"] == \
        "project at quota: 4 of 8 accelerators in use, this job needs 8"
    assert api.get(f"/v1/jobs/{small}").json()["wait_reason"] == \
        "project at quota: 4 of 8 accelerators in use, this job needs 1 after 8 for jobs queued before it"


def test_a_job_submitted_to_a_full_project_says_so_at_once(api, db, database_url):
    limit(db, "alpha", max_accelerators=6)
    submit(api, gpus(4))
    claim_all(database_url)
    r = api.post("/v1/jobs", json=gpus(4))
    assert r.json()["wait_reason"] == "project at quota: 4 of 6 accelerators in use, this job needs 4"


def test_a_waiting_job_starts_by_itself_when_a_slot_frees(api, db, database_url):
    limit(db, "alpha", max_running_jobs=1)
    first, second = submit(api), submit(api)
    cloud = MemoryCloud(boot_s=0.01, train_s=0.2)
    worker = Worker(get_engine(database_url), cloud, cloud, memory_stager,
                    WorkerConfig(concurrency=4, lease_s=5.0, heartbeat_s=0.5, poll_s=0.2, name="w1",
                                 driver=DriverConfig(poll_s=0.05)))
    worker.start()
    try:
        eventually(lambda: status(db, second) == JobStatus.SUCCEEDED, 20, "the second job succeeded", every=0.1)
    finally:
        worker.shutdown(timeout=5)
    with transaction(db) as s:
        done = {str(j.id): j for j in s.scalars(select(Job).where(Job.id.in_([first, second])))}
    assert done[first].status == done[second].status == JobStatus.SUCCEEDED
    assert done[second].staging_at >= done[first].finished_at  # it started only once the first had ended


def test_a_job_needing_more_accelerators_than_its_project_may_hold_is_refused(api, db):
    limit(db, "alpha", max_accelerators=4)
    r = api.post("/v1/jobs", json=gpus(8))
    assert r.status_code == 422
    assert r.json()["error"]["details"] == [{"field": "accelerator", "reason":
                                             "this job needs 8 accelerators; the project may hold at most 4 at once "
                                             "(its quota)"}]


@pytest.mark.parametrize(("overrides", "field"), [
    ({"workers": 64, "strategy": "auto"}, "workers"),
    ({"accelerator": {"type": "cpu", "replicas": 64}}, "accelerator.replicas"),
])
def test_sizes_beyond_what_the_deployment_runs_are_refused_naming_the_field(api, overrides, field):
    r = api.post("/v1/jobs", json=digits_spec(**overrides))
    assert r.status_code == 422
    assert [d["field"] for d in r.json()["error"]["details"]] == [field]
    assert api.get("/v1/jobs").json()["jobs"] == []


def test_an_operator_raises_the_size_limits_for_real_clouds(api, monkeypatch):
    monkeypatch.setenv("TRAINJOBS_MAX_WORKERS", "16")
    r = api.post("/v1/jobs", json=gpus(4, workers=16, strategy="auto"))  # 64 GPUs: the default project quota
    assert r.status_code == 201, r.text


def test_set_quota_verb_sets_and_resets_a_projects_limits(api, db, database_url, monkeypatch):
    from stack.cli import main

    monkeypatch.setenv("TRAINJOBS_DATABASE_URL", database_url)
    out = CliRunner().invoke(main, ["projects", "set-quota", "alpha", "--max-running-jobs", "3",
                                    "--max-accelerators", "16"])
    assert out.exit_code == 0, out.output
    assert "0 of 3 running jobs, 0 of 16 accelerators in use" in out.output
    CliRunner().invoke(main, ["projects", "set-quota", "alpha", "--max-running-jobs", "default"])
    with transaction(db) as s:
        project = s.scalars(select(Project).where(Project.name == "alpha")).one()
        assert (project.max_running_jobs, project.max_accelerators) == (None, 16)


def test_set_quota_verb_refuses_an_unknown_project(db, database_url, monkeypatch):
    from stack.cli import main

    monkeypatch.setenv("TRAINJOBS_DATABASE_URL", database_url)
    out = CliRunner().invoke(main, ["projects", "set-quota", "nobody", "--max-running-jobs", "3"])
    assert out.exit_code != 0 and "no project named 'nobody'" in out.output

