"""The worker against real PostgreSQL with the in-memory cloud standing in for GCP."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

from sqlalchemy import text

from service.db.jobstate import JobStatus
from service.db.session import transaction
from tests.support.jobs import digits_spec
from tests.support import scaled
from tests.support import eventually
from tests.support.worker import make_worker, path, submit, wait_for
from worker import prometheus
from trainjobs.spec import JobSpec
from trainjobs.states import ACTIVE
from worker.loop import Worker
from trainjobs.vm_metadata import LABEL_JOB
from worker.ports import DatasetError
from worker.memory_cloud import MemoryCloud

S = JobStatus
def test_job_runs_through_every_phase(db, database_url, running_workers):
    cloud = MemoryCloud()
    w = make_worker(database_url, cloud, "w1")
    running_workers.append(w)
    w.start()
    [job_id] = submit(db)
    job = wait_for(db, job_id, {S.SUCCEEDED})
    assert path(db, job_id) == ["QUEUED", "STAGING", "PROVISIONING", "RUNNING", "SUCCEEDED"]
    assert job.attempt == 1 and job.metrics == {"val_accuracy": 0.99}
    assert job.staging_at <= job.provisioning_at <= job.running_at <= job.finished_at
    assert job.lease_owner is None
    assert cloud.list({LABEL_JOB: str(job_id)}) == []  # machine torn down


def test_two_workers_claim_100_jobs_exactly_once(db, database_url, monkeypatch):
    monkeypatch.setenv("TRAINJOBS_DEFAULT_MAX_RUNNING_JOBS", "100")  # none finish here; quotas are test_quotas'
    ids = submit(db, 100)
    owners: Counter[str] = Counter()
    lock = threading.Lock()
    workers = [make_worker(database_url, MemoryCloud(), f"w{i}") for i in range(2)]

    def drain(w: Worker) -> None:
        while True:
            with transaction(w.factory) as s:
                from service.db.queue import claim_next_job

                claim = claim_next_job(s, w.name, 60)
            if claim is None:
                return
            with lock:
                owners[str(claim.job_id)] += 1

    threads = [threading.Thread(target=drain, args=(w,)) for w in workers for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(owners) == sorted(map(str, ids)) and set(owners.values()) == {1}
    with transaction(db) as s:
        claimed_events = s.execute(text("SELECT count(*) FROM job_events WHERE reason = 'claimed'")).scalar()
        by_owner = dict(s.execute(text("SELECT lease_owner, count(*) FROM jobs GROUP BY lease_owner")).all())
    assert claimed_events == 100
    assert sum(by_owner.values()) == 100 and all(by_owner.values())


def claims_made() -> float:
    """Claim statements run by the workers of this process (found a job or not)."""
    return prometheus.REGISTRY.get_sample_value("trainjobs_worker_claim_seconds_count") or 0.0


def test_notify_wakes_an_idle_worker_quickly(db, database_url, running_workers):
    # Polling every hour, far beyond any wait here: only the submit's NOTIFY can explain a prompt claim.
    before = claims_made()
    w = make_worker(database_url, MemoryCloud(train_s=5), "w1", poll_s=3600)
    running_workers.append(w)
    w.start()
    # Idle: it looked once at start and once more when its LISTEN came up (for what was queued while
    # it was not listening); a job queued before then would be claimed without any NOTIFY.
    eventually(lambda: claims_made() - before >= 2, 10, "the worker looked for work at start and once listening")
    [job_id] = submit(db)
    claimed = wait_for(db, job_id, ACTIVE, timeout=3)
    assert claimed.lease_owner == "w1"


def test_lease_expiry_hands_the_job_to_another_worker_which_adopts_the_machine(db, database_url, running_workers):
    cloud = MemoryCloud(train_s=6.0)  # still training when the heir takes over (a finished one just succeeds)
    dead = make_worker(database_url, cloud, "dead")
    dead.start()
    [job_id] = submit(db)
    wait_for(db, job_id, {S.RUNNING})
    # Simulate a crash: threads stop without releasing anything; the lease just runs out (the heir can
    # take the job only once it has, well after the dead worker's threads noticed `stopping`).
    dead.stopping.set()
    heir = make_worker(database_url, cloud, "heir")
    running_workers.append(heir)
    heir.start()
    job = wait_for(db, job_id, {S.SUCCEEDED}, timeout=20)
    assert path(db, job_id)[-3:] == ["RECOVERING", "RUNNING", "SUCCEEDED"]
    assert cloud.created == [f"tj-{str(job_id).replace('-', '')[:20]}-a1"]  # adopted, not re-created
    assert job.attempt == 1


def test_sigterm_shutdown_releases_jobs_for_immediate_takeover(db, database_url, running_workers):
    # Leases of an hour, far beyond any wait here: only the release explains the takeover.
    cloud = MemoryCloud(train_s=3.0)
    first = make_worker(database_url, cloud, "first", lease_s=3600)
    first.start()
    [job_id] = submit(db)
    wait_for(db, job_id, {S.RUNNING})
    t0 = time.monotonic()
    first.shutdown(timeout=scaled(5))
    assert time.monotonic() - t0 < scaled(5)
    second = make_worker(database_url, cloud, "second", lease_s=3600)
    running_workers.append(second)
    second.start()
    wait_for(db, job_id, {S.SUCCEEDED}, timeout=10)
    assert path(db, job_id)[-3:] == ["RECOVERING", "RUNNING", "SUCCEEDED"]  # taken over, not run again


def test_cancel_of_running_job_deletes_machine(db, database_url, running_workers, api):
    cloud = MemoryCloud(train_s=30)
    w = make_worker(database_url, cloud, "w1")
    running_workers.append(w)
    w.start()
    job_id = api.post("/v1/jobs", json=digits_spec()).json()["id"]
    wait_for(db, uuid.UUID(job_id), {S.RUNNING})
    assert api.post(f"/v1/jobs/{job_id}/cancel").json()["status"] == "CANCELLING"
    wait_for(db, uuid.UUID(job_id), {S.CANCELLED}, timeout=5)
    assert path(db, uuid.UUID(job_id))[-2:] == ["CANCELLING", "CANCELLED"]
    assert cloud.list({LABEL_JOB: job_id}) == []
    # ... and its agent was told to stop, in case the delete does not reach it (its watchdog reads this)
    assert (job_id, 1, "the job was cancelled") in cloud.stop_requests


def test_preempted_machine_is_replaced_with_a_new_attempt(db, database_url, running_workers):
    cloud = MemoryCloud(train_s=1.0)
    w = make_worker(database_url, cloud, "w1")
    running_workers.append(w)
    w.start()
    [job_id] = submit(db)
    wait_for(db, job_id, {S.RUNNING})
    cloud.preempt(cloud.created[0])
    job = wait_for(db, job_id, {S.SUCCEEDED}, timeout=10)
    assert job.attempt == 2 and len(cloud.created) == 2
    assert "RECOVERING" in path(db, job_id)
    # The first attempt's agents were told to stop; the second attempt's were not until it ended.
    asked = [(attempt, reason) for j, attempt, reason in cloud.stop_requests if j == str(job_id)]
    assert asked == [(1, "attempt 1 was given up"), (2, "the job succeeded")]


def test_retries_exhausted_fails_the_job(db, database_url, running_workers):
    cloud = MemoryCloud(train_s=30)
    w = make_worker(database_url, cloud, "w1")
    running_workers.append(w)
    w.start()
    [job_id] = submit(db, limits={"max_retries": 1})
    for attempt in (1, 2):
        eventually(lambda: len(cloud.created) >= attempt, 10, f"the machine of attempt {attempt} created")
        wait_for(db, job_id, {S.RUNNING})
        cloud.preempt(cloud.created[attempt - 1])
    job = wait_for(db, job_id, {S.FAILED})
    assert "max_retries is 1" in job.error


def test_agent_failure_is_reported_and_machine_deleted(db, database_url, running_workers):
    cloud = MemoryCloud(fail_next=["ValueError: shapes (3,) and (4,) not aligned"])
    w = make_worker(database_url, cloud, "w1")
    running_workers.append(w)
    w.start()
    [job_id] = submit(db)
    job = wait_for(db, job_id, {S.FAILED})
    assert "shapes (3,) and (4,) not aligned" in job.error
    assert cloud.list({}) == []


def test_bad_dataset_fails_before_any_machine(db, database_url, running_workers):
    def reject(spec, job_id, **_):
        raise DatasetError("column 'label' not found; columns are a, b")

    cloud = MemoryCloud()
    w = make_worker(database_url, cloud, "w1", stager=reject)
    running_workers.append(w)
    w.start()
    [job_id] = submit(db)
    job = wait_for(db, job_id, {S.FAILED})
    assert "column 'label' not found" in job.error and cloud.created == []
    assert path(db, job_id) == ["QUEUED", "STAGING", "FAILED"]


def test_max_runtime_stops_the_job(db, database_url, running_workers):
    cloud = MemoryCloud(train_s=30)
    w = make_worker(database_url, cloud, "w1")
    running_workers.append(w)
    w.start()
    [job_id] = submit(db, limits={"max_runtime": "1s"})
    job = wait_for(db, job_id, {S.FAILED})
    assert "max_runtime" in job.error and cloud.list({}) == []


def test_worker_drives_several_jobs_at_once(db, database_url, running_workers):
    cloud = MemoryCloud(train_s=1.0)
    w = make_worker(database_url, cloud, "w1", concurrency=4)
    running_workers.append(w)
    w.start()
    ids = submit(db, 4)
    jobs = [wait_for(db, job_id, {S.SUCCEEDED}) for job_id in ids]
    # All four were running at one moment: the last to start began before the first finished.
    assert max(j.running_at for j in jobs) < min(j.finished_at for j in jobs)


def test_cost_limit_stops_an_expensive_job(db, database_url, running_workers):
    cloud = MemoryCloud(train_s=30)
    w = make_worker(database_url, cloud, "w1")
    running_workers.append(w)
    w.start()
    # 8 x H100 at list price is about 2.5 cents a second: a 1-cent budget lasts well under a second.
    [job_id] = submit(db, accelerator={"type": "gpu", "gpu_type": "nvidia-h100-80gb", "count": 8},
                      limits={"max_cost_usd": 0.01})
    job = wait_for(db, job_id, {S.FAILED})
    assert "max_cost_usd" in job.error and cloud.list({}) == []


def test_a_worker_with_a_reaper_deletes_machines_whose_job_is_unknown(db, database_url, running_workers):
    """A machine labelled as ours whose job the database does not know (a worker died between create
    and record, then the job row was deleted) is deleted by the worker's reaper pass, not left billing."""
    from worker.ports import MachineRequest

    cloud = MemoryCloud()
    stray = MachineRequest(str(uuid.uuid4()), 1, JobSpec.model_validate(digits_spec()), "mem://nowhere")
    cloud.create(stray)
    w = make_worker(database_url, cloud, "reaper", reap_every_s=0.05)
    running_workers.append(w)
    w.start()
    eventually(lambda: cloud.get(stray) is None, 10, "the reaper deleted the stray machine")
