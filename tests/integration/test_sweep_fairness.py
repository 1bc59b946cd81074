"""Issue 36, findings 2 and 4: one project's sweeps cost the shared sweep engine a bounded amount, and every
active sweep of every project is stepped in its turn. The worker's real sweep engine against PostgreSQL,
Optuna's storage in it and the GCS emulator; the trials' jobs are played (tests/support/sweeps.py), and a
trial's metrics.json is written as the job's own code can write it."""

from __future__ import annotations

import gzip
import json
import threading
import uuid
from typing import Any

import pytest
from sqlalchemy import text

from service.db.quotas import set_quota
from service.db.session import transaction
from tests.support import eventually
from tests.support.sweeps import IRIS_JOB, engine, long_history, play, project_client, submit, sweep_spec, trials
from trainjobs import storage
from trainjobs.job_paths import JobPaths
from worker import sweeps as sweep_engine
from worker.sweep_curves import REPORTS_PER_STEP


def _intermediate_values(e: Any, sweep_id: str, number: int) -> dict[int, float]:
    import optuna

    study = optuna.load_study(study_name=f"sweep-{sweep_id}", storage=e._optuna_storage())
    return dict(study.trials[number].intermediate_values)


def _running(db: Any, job_id: str) -> None:
    with transaction(db) as session:
        session.execute(text("UPDATE jobs SET status = 'RUNNING', provisioning_at = now() WHERE id = :id"),
                        {"id": job_id})


def test_a_trials_60000_epoch_history_is_taken_to_its_last_epoch_a_bounded_number_a_step(
        api: Any, api_url: str, db: Any, database_url: str, bucket: str) -> None:
    """The review's attack: a trial's code writes a 60,000-epoch history (2.7 MB, under the 4 MiB cap).
    It held one step (and every other sweep) for 12 minutes, reporting each epoch to Optuna and copying
    the whole curve for each. Now another project's new sweep gets its trials at the same tick; the
    trial's curve grows by at most REPORTS_PER_STEP a step up to its job's training.epochs, never past;
    and while the job runs, its large document is not read again at every tick."""
    epochs = 200  # a document of 3.2 MiB is one such a job may write: the 2.7 MB one is read
    hostile = submit(api, max_trials=2, parallel_trials=1, job={**IRIS_JOB, "training": {"epochs": epochs}})
    e = engine(database_url, db)
    e.tick()
    [trial] = trials(api, hostile["id"])
    storage.write_json(JobPaths.for_job(trial["job_id"]).metrics, long_history(60_000))
    _running(db, trial["job_id"])
    with project_client(api_url, db, "beta") as beta:
        other = beta.post("/v1/sweeps", json=sweep_spec()).json()

        e.tick()

        assert len(beta.get(f"/v1/sweeps/{other['id']}/trials").json()["trials"]) == 2
    first = list(range(1, REPORTS_PER_STEP + 1))
    assert [epoch for epoch, _ in trials(api, hostile["id"])[0]["curve"]] == first
    assert sorted(_intermediate_values(e, hostile["id"], 0)) == first
    storage.write_json(JobPaths.for_job(trial["job_id"]).metrics, long_history(60_000))  # rewritten, again
    e.tick()
    assert len(trials(api, hostile["id"])[0]["curve"]) == REPORTS_PER_STEP  # not read again yet (LARGE_REREAD_S)

    with transaction(db) as session:  # the job ends: its epochs are taken in, a step at a time, and then its value
        session.execute(text("UPDATE jobs SET status = 'SUCCEEDED', finished_at = now(),"
                             " metrics = '{\"val_accuracy\": 0.6}' WHERE id = :id"), {"id": trial["job_id"]})
    for _ in range(epochs // REPORTS_PER_STEP - 2):
        e.tick()
        assert trials(api, hostile["id"])[0]["state"] == "RUNNING"
    e.tick()
    done = trials(api, hostile["id"])[0]
    assert [epoch for epoch, _ in done["curve"]] == list(range(1, epochs + 1))  # its last epoch, and none past it
    assert done["state"] == "COMPLETE" and done["value"] == 0.6
    assert sorted(_intermediate_values(e, hostile["id"], 0)) == list(range(1, epochs + 1))


def test_a_history_larger_than_its_trials_epochs_can_write_is_not_read_and_the_sweep_says_so(
        api: Any, db: Any, database_url: str, bucket: str) -> None:
    sweep = submit(api, max_trials=2, parallel_trials=1)  # 4 epochs: 128 KiB at most
    e = engine(database_url, db)
    e.tick()
    [trial] = trials(api, sweep["id"])
    storage.write_json(JobPaths.for_job(trial["job_id"]).metrics, long_history(60_000))
    _running(db, trial["job_id"])
    e.tick()
    assert trials(api, sweep["id"])[0]["curve"] == []
    note = api.get(f"/v1/sweeps/{sweep['id']}").json()["note"]
    assert note == ("trial 0: metrics.json is 2.5 MiB, over the 131072 bytes trainjobs reads of it: a job of 4 "
                    "epochs writes less; its epochs are not followed"), note
    play(db, trial["job_id"], [0.8, 0.9], done=True)  # the agent's own, small: taken in, and the trial ends
    e.tick()
    done = trials(api, sweep["id"])[0]
    assert done["state"] == "COMPLETE" and done["curve"] == [[1, 0.8], [2, 0.9]] and done["value"] == 0.9


def test_a_gzip_encoded_metrics_json_is_its_stored_bytes_not_json(api: Any, db: Any, database_url: str,
                                                                  bucket: str) -> None:
    """On GCS a job can store metrics.json with contentEncoding gzip: a reader that lets the client
    inflate it takes a small object as a large document. The engine reads it raw: not JSON."""
    sweep = submit(api, max_trials=2, parallel_trials=1)
    e = engine(database_url, db)
    e.tick()
    [trial] = trials(api, sweep["id"])
    uri = JobPaths.for_job(trial["job_id"]).metrics
    history = json.dumps({"history": [{"epoch": 1, "val_accuracy": 0.7}, {"epoch": 2, "val_accuracy": 0.8}]})
    stored = storage.blob(uri)
    stored.content_encoding = "gzip"
    stored.upload_from_string(gzip.compress(history.encode()), content_type="application/json")
    assert storage.blob(uri).download_as_bytes() == history.encode()  # what an inflating reader gets
    _running(db, trial["job_id"])
    e.tick()
    assert trials(api, sweep["id"])[0]["curve"] == []
    assert "metrics.json is not JSON" in api.get(f"/v1/sweeps/{sweep['id']}").json()["note"]


def test_a_stuck_step_holds_only_its_own_sweep(api: Any, api_url: str, db: Any, database_url: str, bucket: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever keeps one sweep's step (a slow read, a slow database), another project's sweep is stepped
    meanwhile, and the stuck sweep is not stepped twice at once."""
    stuck = submit(api, max_trials=2, parallel_trials=1)
    e = engine(database_url, db, tick_wait_s=0.1)
    e.tick()
    eventually(lambda: trials(api, stuck["id"]), 60, "the first trial")
    [trial] = trials(api, stuck["id"])
    _running(db, trial["job_id"])
    release, entered = threading.Event(), threading.Event()
    real, reads = sweep_engine.read_new_epochs, []

    def held(uri: str, *args: Any, **kwargs: Any) -> Any:
        if trial["job_id"] in uri:
            reads.append(uri)
            entered.set()
            release.wait()
        return real(uri, *args, **kwargs)

    monkeypatch.setattr(sweep_engine, "read_new_epochs", held)
    try:
        e.tick()
        eventually(entered.is_set, 60, "the stuck sweep's step")
        with project_client(api_url, db, "beta") as beta:
            other = beta.post("/v1/sweeps", json=sweep_spec()).json()
            for _ in range(2):
                e.tick()
            eventually(lambda: beta.get(f"/v1/sweeps/{other['id']}/trials").json()["trials"], 60,
                       "a trial of beta's sweep while alpha's step is stuck")
        assert len(reads) == 1  # its sweep was not stepped again meanwhile
        assert [k for k, f in e._in_flight.items() if not f.done()] == [uuid.UUID(stuck["id"])]
    finally:
        release.set()
    eventually(lambda: e._in_flight[uuid.UUID(stuck["id"])].done(), 60, "the stuck step's end")
    with transaction(db) as session:
        owner = session.execute(text("SELECT lease_owner FROM sweeps WHERE id = :id"), {"id": uuid.UUID(stuck["id"])}).scalar()
    assert owner is None


def test_idle_sweeps_of_one_project_do_not_keep_another_projects_new_sweep_waiting(
        api: Any, api_url: str, db: Any, database_url: str, bucket: str) -> None:
    """The review's starvation: 32 idle sweeps of one project (their trials waiting on its quota) held all
    32 leases of a worker, renewed forever. Scaled down: a worker leasing 4 sweeps a tick, 6 idle ones."""
    with transaction(db) as session:
        set_quota(session, "alpha", max_running_jobs=1)
    idle = [submit(api, max_trials=4, parallel_trials=1)["id"] for _ in range(6)]
    e = engine(database_url, db, max_sweeps=4)
    e.tick()
    e.tick()
    assert all(len(trials(api, s)) == 1 for s in idle)  # each of alpha's in its turn
    with project_client(api_url, db, "beta") as beta:
        other = beta.post("/v1/sweeps", json=sweep_spec())
        assert other.status_code == 201, other.text

        e.tick()

        assert len(beta.get(f"/v1/sweeps/{other.json()['id']}/trials").json()["trials"]) == 2
    with transaction(db) as session:
        held = session.execute(text("SELECT count(*) FROM sweeps WHERE lease_owner IS NOT NULL")).scalar()
    assert held == 0  # no sweep keeps a lease between its steps


def test_a_project_has_at_most_max_active_sweeps(api: Any, api_url: str, db: Any, database_url: str, bucket: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINJOBS_MAX_ACTIVE_SWEEPS", "2")  # the API runs in this process
    first, _ = submit(api), submit(api)
    refused = api.post("/v1/sweeps", json=sweep_spec())
    assert refused.status_code == 429, refused.text
    assert "2 active sweeps" in refused.json()["error"]["message"]
    assert "TRAINJOBS_MAX_ACTIVE_SWEEPS=2" in refused.json()["error"]["message"]
    with project_client(api_url, db, "beta") as beta:
        assert beta.post("/v1/sweeps", json=sweep_spec()).status_code == 201  # another project's own count
    api.post(f"/v1/sweeps/{first['id']}/cancel")
    engine(database_url, db).tick()  # the cancelled sweep ends (no trial of it ran)
    assert api.get(f"/v1/sweeps/{first['id']}").json()["status"] == "CANCELLED"
    assert api.post("/v1/sweeps", json=sweep_spec()).status_code == 201


def test_a_stored_sweep_no_step_can_drive_ends_failed_with_the_reason_and_its_trials_jobs_cancelled(
        api: Any, db: Any, database_url: str, bucket: str) -> None:
    """A sweep stored under rules since tightened (here its stored spec edited to one no submit accepts) would
    fail every step for ever, cancel included; it ends FAILED saying why, and its running trial's job is
    cancelled."""
    sweep = submit(api, max_trials=2, parallel_trials=1)
    e = engine(database_url, db)
    e.tick()
    [running] = trials(api, sweep["id"])
    with transaction(db) as session:
        session.execute(text("UPDATE sweeps SET spec = jsonb_set(spec, '{parallel_trials}', '0') WHERE id = :id"),
                        {"id": uuid.UUID(sweep["id"])})
    fresh = engine(database_url, db, "w2")  # parses the stored spec anew (w1 keeps it parsed)
    fresh.tick()
    read = api.get(f"/v1/sweeps/{sweep['id']}").json()
    assert read["status"] == "FAILED", read
    assert read["note"].startswith("the sweep's spec is no longer valid: parallel_trials"), read["note"]
    [trial] = trials(api, sweep["id"])
    assert trial["state"] == "FAIL" and trial["job_status"] in ("CANCELLED", "CANCELLING"), trial
    assert trial["job_id"] == running["job_id"]


def test_a_job_the_project_sent_under_a_trials_idempotency_key_fails_that_trial_not_the_sweep(
        api: Any, db: Any, database_url: str, bucket: str) -> None:
    """The project POSTs a job of its own with Idempotency-Key sweep-<id>-trial-0 before the engine makes
    trial 0's: that trial is told FAIL with a note and the next one runs (before, every step failed)."""
    sweep = submit(api, max_trials=2, parallel_trials=2)
    squat = api.post("/v1/jobs", json=IRIS_JOB, headers={"Idempotency-Key": f"sweep-{sweep['id']}-trial-0"})
    assert squat.status_code == 201, squat.text
    e = engine(database_url, db)
    e.tick()
    made = trials(api, sweep["id"])
    assert [t["number"] for t in made] == [1], made
    read = api.get(f"/v1/sweeps/{sweep['id']}").json()
    assert read["status"] == "RUNNING" and "trial 0" in read["note"] and "idempotency key" in read["note"], read
    play(db, made[0]["job_id"], [0.8], done=True)
    e.tick()
    assert api.get(f"/v1/sweeps/{sweep['id']}").json()["status"] == "SUCCEEDED"
