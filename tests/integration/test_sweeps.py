"""Sweeps (issue 22): the API's checks, and the worker's sweep engine against real PostgreSQL, Optuna's
RDB storage in it, and metrics.json in the storage emulator. The trials' jobs are played here (their
status and their epochs written as a worker and an agent would), so each decision of the engine is
judged on known curves; tests/e2e/test_sweeps.py runs sweeps of real jobs."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import pytest
from sqlalchemy import text

from service.db.session import transaction
from tests.support.sweeps import IRIS_JOB, engine, job_row, play, submit, sweep_spec, trials
from worker.sweeps import PRUNED_REASON

# --- the API's checks -------------------------------------------------------------------------------


@pytest.mark.parametrize(("overrides", "field", "reason"), [
    ({"parameters": {"training.learning_rat": {"type": "float", "low": 0.1, "high": 0.2}}},
     "parameters.training.learning_rat", "did you mean 'learning_rate'?"),
    ({"job": {**IRIS_JOB, "accelerator": {"type": "cpu", "replicas": 2}, "strategy": "mirrored"},
      "parameters": {"training.global_batch_size": {"type": "int", "low": 30, "high": 34}}},
     "parameters.training.global_batch_size", "(at 31)"),
    ({"parameters": {"strategy": {"type": "categorical", "choices": ["default", "tpu"]}}},
     "parameters.strategy", "(at 'tpu')"),
    ({"algorithm": "grid"}, "parameters.training.learning_rate", "a grid needs every value"),
    ({"parameters": {"model.params.dropout.x": {"type": "categorical", "choices": [1]},
                     "model.params.dropout": {"type": "float", "low": 0.1, "high": 0.2}}},
     "parameters.model.params.dropout", "model.params.dropout.x is inside it"),
    ({"objective": {"metric": "val_auc"}}, "objective.metric", "not a metric the trials report"),
    ({"parameters": {"dataset.source": {"type": "categorical", "choices": ["sklearn:iris", "sklearn:wine"]}}},
     "parameters.dataset.source", "the trials share the job's data, code and teacher"),
    ({"job": {**IRIS_JOB, "model": {"name": "nope"}}}, "job", "model.name"),
    ({"job": {**IRIS_JOB, "labels": {f"l{i}": "x" for i in range(31)}}}, "job.labels",
     "at most 30 labels: each trial adds its own sweep and trial"),
    ({"parameters": {"training.epochs": {"type": "int", "low": 5, "high": 2}}}, "parameters.training.epochs.low",
     "low (5) is above high (2)"),
])
def test_a_sweep_whose_trials_would_be_refused_is_a_422_naming_the_parameter(
        api: Any, overrides: dict[str, Any], field: str, reason: str) -> None:
    r = api.post("/v1/sweeps", json=sweep_spec(**overrides))
    assert r.status_code == 422, r.text
    details = {d["field"]: d["reason"] for d in r.json()["error"]["details"]}
    assert field in details and reason in details[field], details


def test_a_submitted_sweep_is_stored_resolved_and_read_back_only_by_its_project(api: Any, api_url: str, db: Any) -> None:
    import httpx

    from tests.support.jobs import make_key

    sweep = submit(api)
    assert sweep["status"] == "RUNNING" and sweep["objective"] == {"metric": "val_accuracy", "goal": "maximize"}
    assert sweep["trials"]["planned"] == 6 and sweep["best"] is None
    assert api.get(f"/v1/sweeps/{sweep['id']}").json()["id"] == sweep["id"]
    assert [s["id"] for s in api.get("/v1/sweeps").json()["sweeps"]] == [sweep["id"]]
    other = httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {make_key(db, 'beta')}"})
    assert other.get(f"/v1/sweeps/{sweep['id']}").status_code == 404
    assert other.get(f"/v1/sweeps/{sweep['id']}/trials").status_code == 404
    assert other.post(f"/v1/sweeps/{sweep['id']}/cancel").status_code == 404
    assert other.get("/v1/sweeps").json()["sweeps"] == []


# --- the engine ---------------------------------------------------------------------------------------


def test_trials_are_jobs_of_the_project_and_a_trial_far_behind_is_pruned_and_its_job_cancelled(
        api: Any, db: Any, database_url: str, bucket: str) -> None:
    sweep = submit(api, max_trials=5, early_stopping={"type": "median", "min_epochs": 1})
    e = engine(database_url, db)
    e.tick()
    first = trials(api, sweep["id"])
    assert [t["number"] for t in first] == [0, 1] and all(t["job_status"] == "QUEUED" for t in first)
    job = job_row(db, first[0]["job_id"])
    assert job.labels["sweep"] == sweep["id"] and job.labels["trial"] == "0"
    assert job.spec["training"]["learning_rate"] == pytest.approx(first[0]["params"]["training.learning_rate"])
    assert job.spec["name"] == "lr-trial-0"
    e.tick()
    assert len(trials(api, sweep["id"])) == 2  # two at a time

    for t in first:  # startup_trials(5) = 1 finishes before any is pruned; two here
        play(db, t["job_id"], [0.7, 0.85, 0.9], done=True)
    e.tick()
    now = trials(api, sweep["id"])
    assert [t["state"] for t in now[:2]] == ["COMPLETE", "COMPLETE"] and len(now) == 4
    assert now[0]["value"] == 0.9 and now[0]["curve"] == [[1, 0.7], [2, 0.85], [3, 0.9]]
    behind, level = now[2], now[3]
    play(db, behind["job_id"], [0.1, 0.12], done=False)
    play(db, level["job_id"], [0.75, 0.88], done=False)
    e.tick()
    now = {t["number"]: t for t in trials(api, sweep["id"])}
    assert now[2]["state"] == "PRUNED" and now[2]["curve"] == [[1, 0.1], [2, 0.12]]
    assert now[3]["state"] == "RUNNING"
    pruned = job_row(db, behind["job_id"])
    assert pruned.status == "CANCELLING" and pruned.error == PRUNED_REASON  # its worker tears it down
    assert len(now) == 5  # the pruned trial's place went to the next

    play(db, level["job_id"], [0.75, 0.88, 0.95], done=True)
    play(db, now[4]["job_id"], [0.5], done=True)
    e.tick()
    assert api.get(f"/v1/sweeps/{sweep['id']}").json()["status"] == "RUNNING"  # the pruned job still tears down
    with transaction(db) as session:
        session.execute(text("UPDATE jobs SET status = 'CANCELLED', finished_at = now() WHERE id = :id"),
                        {"id": behind["job_id"]})
    e.tick()
    done = api.get(f"/v1/sweeps/{sweep['id']}").json()
    assert done["status"] == "SUCCEEDED", done
    assert done["best"]["number"] == 3 and done["best"]["value"] == 0.95
    assert done["trials"] == {"RUNNING": 0, "COMPLETE": 4, "PRUNED": 1, "FAIL": 0, "planned": 5}


def test_a_worker_that_stops_between_asking_and_submitting_loses_no_trial_and_runs_none_twice(
        api: Any, db: Any, database_url: str, bucket: str) -> None:
    """Worker w1 asks Optuna for three trials and dies before its transaction commits (so no job of
    them exists); w2 takes the sweep over once w1's lease lapses and submits exactly those three."""
    sweep = submit(api, max_trials=4, parallel_trials=3)
    dying = engine(database_url, db, "w1")
    original = dying._submit
    calls = []

    def submit_then_die(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[3])
        if len(calls) == 3:
            raise RuntimeError("worker killed")
        return original(*args, **kwargs)

    dying._submit = submit_then_die  # type: ignore[method-assign]
    dying.tick()  # logged, not raised: a tick's failure is retried
    assert trials(api, sweep["id"]) == []  # nothing committed
    with transaction(db) as session:  # a living worker gives back a failed step's lease; a dead one keeps it
        session.execute(text("UPDATE sweeps SET lease_owner = 'w1', lease_expires_at = now() + interval '1 hour'"
                             " WHERE id = :id"), {"id": uuid.UUID(sweep["id"])})
    import optuna

    study = optuna.load_study(study_name=f"sweep-{sweep['id']}", storage=dying._optuna_storage())
    asked = {t.number: t.params for t in study.trials}
    assert sorted(asked) == [0, 1, 2]

    taker = engine(database_url, db, "w2")
    taker.tick()
    assert trials(api, sweep["id"]) == [], "w1's lease has not lapsed yet"
    with transaction(db) as session:  # w1 never renews it: its lease runs out
        session.execute(text("UPDATE sweeps SET lease_expires_at = now() - interval '1 second' WHERE id = :id"),
                        {"id": uuid.UUID(sweep["id"])})
    taker.tick()
    adopted = trials(api, sweep["id"])
    assert [t["number"] for t in adopted] == [0, 1, 2]
    assert {t["number"]: t["params"] for t in adopted} == asked
    for t in adopted:
        play(db, t["job_id"], [0.8], done=True)
    taker.tick()
    last = [t for t in trials(api, sweep["id"]) if t["number"] == 3]
    play(db, last[0]["job_id"], [0.6], done=True)
    taker.tick()
    assert api.get(f"/v1/sweeps/{sweep['id']}").json()["status"] == "SUCCEEDED"
    with transaction(db) as session:
        jobs = session.execute(text("SELECT labels->>'trial' FROM jobs WHERE labels->>'sweep' = :s"),
                               {"s": sweep["id"]}).scalars().all()
    assert sorted(jobs) == ["0", "1", "2", "3"]  # one job per trial


def test_a_grid_runs_exactly_its_combinations(api: Any, db: Any, database_url: str, bucket: str) -> None:
    sweep = submit(api, algorithm="grid", max_trials=None, parallel_trials=3, parameters={
        "training.optimizer": {"type": "categorical", "choices": ["adam", "sgd"]},
        "model.params.hidden_units": {"type": "int", "low": 8, "high": 24, "step": 8}})
    assert sweep["trials"]["planned"] == 6
    e = engine(database_url, db)
    for _ in range(6):
        e.tick()
        for t in trials(api, sweep["id"]):
            if t["state"] == "RUNNING":
                play(db, t["job_id"], [0.5 + t["number"] / 100], done=True)
    e.tick()
    seen = trials(api, sweep["id"])
    combos = {(t["params"]["training.optimizer"], t["params"]["model.params.hidden_units"]) for t in seen}
    assert len(seen) == 6 and combos == set(itertools.product(["adam", "sgd"], [8, 16, 24]))
    assert api.get(f"/v1/sweeps/{sweep['id']}").json()["status"] == "SUCCEEDED"


def test_cancel_stops_every_running_trial_and_ends_the_sweep(api: Any, db: Any, database_url: str, bucket: str) -> None:
    sweep = submit(api, parallel_trials=3)
    e = engine(database_url, db)
    e.tick()
    running = trials(api, sweep["id"])
    play(db, running[0]["job_id"], [0.5], done=False)  # one trains, two are queued
    assert api.post(f"/v1/sweeps/{sweep['id']}/cancel").json()["status"] == "CANCELLING"
    e.tick()
    statuses = [job_row(db, t["job_id"]).status for t in trials(api, sweep["id"])]
    assert statuses == ["CANCELLING", "CANCELLED", "CANCELLED"]
    assert all(t["state"] == "FAIL" for t in trials(api, sweep["id"]))
    assert api.get(f"/v1/sweeps/{sweep['id']}").json()["status"] == "CANCELLING"  # a machine is still held
    with transaction(db) as session:  # its worker tore the machine down
        session.execute(text("UPDATE jobs SET status = 'CANCELLED', finished_at = now() WHERE id = :id"),
                        {"id": running[0]["job_id"]})
    e.tick()
    ended = api.get(f"/v1/sweeps/{sweep['id']}").json()
    assert ended["status"] == "CANCELLED" and ended["note"] == "cancel requested by user"
    e.tick()
    assert len(trials(api, sweep["id"])) == 3  # nothing more is asked


def test_the_sweeps_cost_limit_bounds_what_its_trials_may_spend(api: Any, db: Any, database_url: str, bucket: str) -> None:
    sweep = submit(api, parallel_trials=3, limits={"max_cost_usd": 0.05})
    e = engine(database_url, db)
    e.tick()
    first = trials(api, sweep["id"])
    assert len(first) == 1, "the first trial may spend it all"
    assert job_row(db, first[0]["job_id"]).spec["limits"]["max_cost_usd"] == pytest.approx(0.05)
    assert "limits.max_cost_usd is spent" in api.get(f"/v1/sweeps/{sweep['id']}").json()["note"]
    play(db, first[0]["job_id"], [0.9], done=True)  # it ended having spent (almost) nothing
    e.tick()
    assert len(trials(api, sweep["id"])) == 2
    assert "limits.max_cost_usd is spent" in api.get(f"/v1/sweeps/{sweep['id']}").json()["note"]  # again, beside it


def test_a_sweep_is_stepped_by_one_worker_at_a_time_and_its_lease_lasts_one_step(
        api: Any, db: Any, database_url: str, bucket: str) -> None:
    from service.db import sweeps as sweep_data

    sweep = submit(api)
    a, b = engine(database_url, db, "a"), engine(database_url, db, "b")
    with transaction(db) as session:  # a leased it: its step is on its way
        assert sweep_data.lease_sweeps(session, "a", 30.0, 32) == [uuid.UUID(sweep["id"])]
    b.tick()
    assert trials(api, sweep["id"]) == []  # b leaves a sweep a holds
    a.step(uuid.UUID(sweep["id"]))
    assert len(trials(api, sweep["id"])) == 2
    with transaction(db) as session:
        owner, stepped = session.execute(text("SELECT lease_owner, stepped_at FROM sweeps WHERE id = :id"),
                                         {"id": uuid.UUID(sweep["id"])}).one()
    assert owner is None and stepped is not None  # given back with the step: any worker takes the next
    b.tick()
    assert len(trials(api, sweep["id"])) == 2  # b stepped it next, and asked nothing twice


def test_a_sweep_whose_trials_wait_on_the_projects_quota_says_so(api: Any, db: Any, database_url: str, bucket: str) -> None:
    from service.db.quotas import set_quota

    with transaction(db) as session:
        set_quota(session, "alpha", max_running_jobs=1)
    sweep = submit(api, parallel_trials=2)
    e = engine(database_url, db)
    e.tick()
    first, second = trials(api, sweep["id"])
    play(db, first["job_id"], [0.5], done=False)  # one trains; the project may run one job at a time
    shown = api.get(f"/v1/sweeps/{sweep['id']}").json()
    assert shown["wait_reason"] and "1 of 1 running jobs" in shown["wait_reason"], shown
    assert trials(api, sweep["id"])[1]["wait_reason"] == shown["wait_reason"]


def test_hyperband_stops_trials_behind_in_their_bracket(api: Any, db: Any, database_url: str, bucket: str) -> None:
    """Hyperband's brackets with ask-and-tell: trials that report good epochs run on; one far behind the
    rest of its bracket at an epoch where the bracket compares is stopped."""
    sweep = submit(api, max_trials=8, parallel_trials=1, early_stopping={"type": "hyperband", "min_epochs": 1})
    e = engine(database_url, db)
    states = []
    for n in range(8):
        e.tick()
        t = [t for t in trials(api, sweep["id"]) if t["state"] == "RUNNING"][0]
        bad = n % 2 == 1
        curve = [0.1, 0.1, 0.1, 0.1] if bad else [0.8, 0.85, 0.9, 0.92]
        for epoch in range(1, 5):
            play(db, t["job_id"], curve[:epoch], done=False)
            e.tick()
            now = {x["number"]: x for x in trials(api, sweep["id"])}[t["number"]]
            if now["state"] != "RUNNING":
                break
        else:
            play(db, t["job_id"], curve, done=True)
            e.tick()
        with transaction(db) as session:  # a pruned job's machine torn down
            session.execute(text("UPDATE jobs SET status = 'CANCELLED', finished_at = now() WHERE id = :id AND "
                                 "status = 'CANCELLING'"), {"id": t["job_id"]})
        states.append(({x["number"]: x for x in trials(api, sweep["id"])}[t["number"]]["state"], bad))
    e.tick()
    assert api.get(f"/v1/sweeps/{sweep['id']}").json()["status"] == "SUCCEEDED"
    assert all(state == "COMPLETE" for state, bad in states if not bad), states
    assert any(state == "PRUNED" for state, bad in states if bad), states


def test_a_trial_whose_values_make_no_valid_job_fails_and_counts_against_max_trials(
        api: Any, db: Any, database_url: str, bucket: str) -> None:
    """Submit checks a continuous range at its ends and middle; a value in between that a rule refuses
    (here: made to) is told FAIL without a job, said in the sweep's note, and not asked again forever."""
    from trainjobs.spec import JobSpec

    sweep = submit(api, max_trials=3, parallel_trials=1)
    e = engine(database_url, db)
    original = e._submit

    def refuse_trial_one(*args: Any, **kwargs: Any) -> Any:
        if args[3] == 1:
            JobSpec.model_validate({"training": {"epochs": 0}})  # raises, as the trial's spec would
        return original(*args, **kwargs)

    e._submit = refuse_trial_one  # type: ignore[method-assign]
    for _ in range(6):
        e.tick()
        for t in trials(api, sweep["id"]):
            if t["state"] == "RUNNING":
                play(db, t["job_id"], [0.7], done=True)
    e.tick()
    done = api.get(f"/v1/sweeps/{sweep['id']}").json()
    assert done["status"] == "SUCCEEDED", done
    assert [t["number"] for t in trials(api, sweep["id"])] == [0, 2]  # three asked, one refused
    assert "trial 1" in done["note"] and "is not a valid job" in done["note"]
    import optuna

    study = optuna.load_study(study_name=f"sweep-{sweep['id']}", storage=e._optuna_storage())
    assert [t.state.name for t in study.trials] == ["COMPLETE", "FAIL", "COMPLETE"]
