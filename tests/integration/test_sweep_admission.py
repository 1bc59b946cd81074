"""Issue 36, 5: a sweep's trials are admitted as POST /v1/jobs admits a job (service/db/admission.py): the
deployment's sizes and the project's quota, for every value submit checks of every parameter, and again by
the sweep engine for every trial it draws. The review's sweep made trial jobs of 64 CPU replicas and of 64
workers, both of which POST /v1/jobs refuses."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from service.db.quotas import set_quota
from service.db.session import transaction
from tests.support.sweeps import IRIS_JOB, engine, play, submit, sweep_spec, trials

GPU_JOB = {**IRIS_JOB, "accelerator": {"type": "gpu", "gpu_type": "nvidia-tesla-v100", "count": 1}, "strategy": "auto"}


@pytest.mark.parametrize(("job", "parameter", "field", "reason"), [
    ({**IRIS_JOB, "strategy": "auto"}, {"accelerator.replicas": {"type": "categorical", "choices": [2, 64]}},
     "parameters.accelerator.replicas", "(at 64): accelerator.replicas: 64 CPU replicas: this deployment runs at most 8"),
    ({**IRIS_JOB, "strategy": "auto"}, {"workers": {"type": "int", "low": 1, "high": 64}},
     "parameters.workers", "(at 5): workers: 5 workers: this deployment runs at most 4 (TRAINJOBS_MAX_WORKERS)"),
    (GPU_JOB, {"accelerator.count": {"type": "categorical", "choices": [1, 8]}},
     "parameters.accelerator.count", "(at 8): accelerator: this job needs 8 accelerators; the project may hold at most 4"),
    ({**IRIS_JOB, "strategy": "auto", "workers": 64}, {"training.learning_rate": {"type": "float", "low": 0.01, "high": 0.1}},
     "job.workers", "64 workers: this deployment runs at most 4"),
], ids=["cpu replicas", "workers", "project quota", "the job itself"])
def test_a_parameter_whose_values_the_deployment_refuses_is_a_422_naming_it(
        api: Any, db: Any, job: dict[str, Any], parameter: dict[str, Any], field: str, reason: str) -> None:
    with transaction(db) as session:
        set_quota(session, "alpha", max_accelerators=4)
    r = api.post("/v1/sweeps", json=sweep_spec(job=job, parameters=parameter))
    assert r.status_code == 422, r.text
    details = {d["field"]: d["reason"] for d in r.json()["error"]["details"]}
    assert field in details and reason in details[field], details
    assert api.get("/v1/sweeps").json()["sweeps"] == []


def test_a_drawn_trial_the_deployment_refuses_makes_no_job_and_fails_with_a_note(
        api: Any, db: Any, database_url: str, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every value passed at submit; then the operator lowered TRAINJOBS_MAX_CPU_REPLICAS. The trial of 4
    replicas is told FAIL without a job, the sweep says why, and the trial of 2 runs."""
    sweep = submit(api, job={**IRIS_JOB, "strategy": "auto"}, algorithm="grid", max_trials=2,
                   parameters={"accelerator.replicas": {"type": "categorical", "choices": [2, 4]}})
    monkeypatch.setenv("TRAINJOBS_MAX_CPU_REPLICAS", "3")  # the engine runs in this process
    e = engine(database_url, db)
    e.tick()
    made = trials(api, sweep["id"])
    assert [(t["number"], t["params"]) for t in made] == [(0, {"accelerator.replicas": 2})]
    with transaction(db) as session:
        replicas = session.execute(text("SELECT spec->'accelerator'->>'replicas' FROM jobs")).scalars().all()
    assert replicas == ["2"]
    play(db, made[0]["job_id"], [0.8], done=True)
    e.tick()
    done = api.get(f"/v1/sweeps/{sweep['id']}").json()
    assert done["status"] == "SUCCEEDED", done
    assert "trial 1" in done["note"] and "is not admitted: accelerator.replicas: 4 CPU replicas" in done["note"]
    import optuna

    study = optuna.load_study(study_name=f"sweep-{sweep['id']}", storage=e._optuna_storage())
    assert [t.state.name for t in study.trials] == ["COMPLETE", "FAIL"]


def test_a_trial_asked_before_the_rules_changed_is_told_fail_when_its_job_is_made_at_last(
        api: Any, db: Any, database_url: str, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker asked Optuna for both trials and stopped before their jobs were made; the operator then
    lowered TRAINJOBS_MAX_CPU_REPLICAS. The next worker makes the job of the trial still admitted, tells the
    other FAIL with a note, and the sweep goes on (before, its every step failed on the refusal)."""
    import uuid

    import optuna

    sweep = submit(api, job={**IRIS_JOB, "strategy": "auto"}, algorithm="grid", max_trials=2,
                   parameters={"accelerator.replicas": {"type": "categorical", "choices": [2, 4]}})
    dying = engine(database_url, db, "w1")
    original, calls = dying._submit, []

    def submit_then_die(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[3])
        if len(calls) == 2:
            raise RuntimeError("worker killed")  # its transaction, with the first trial's job, rolls back
        return original(*args, **kwargs)

    dying._submit = submit_then_die  # type: ignore[method-assign]
    dying.tick()  # logged, not raised
    study = optuna.load_study(study_name=f"sweep-{sweep['id']}", storage=dying._optuna_storage())
    assert [t.state.name for t in study.trials] == ["RUNNING", "RUNNING"]  # asked, no job
    assert trials(api, sweep["id"]) == []
    monkeypatch.setenv("TRAINJOBS_MAX_CPU_REPLICAS", "3")  # the engine runs in this process
    with transaction(db) as session:  # w1's lease, if it kept one, has run out
        session.execute(text("UPDATE sweeps SET lease_owner = NULL, lease_expires_at = NULL, stepped_at = NULL "
                             "WHERE id = :id"), {"id": uuid.UUID(sweep["id"])})
    taker = engine(database_url, db, "w2")
    taker.tick()
    made = trials(api, sweep["id"])
    assert [(t["number"], t["params"]) for t in made] == [(0, {"accelerator.replicas": 2})]
    read = api.get(f"/v1/sweeps/{sweep['id']}").json()
    assert "trial 1" in read["note"] and "is not admitted: accelerator.replicas: 4 CPU replicas" in read["note"]
    study = optuna.load_study(study_name=f"sweep-{sweep['id']}", storage=taker._optuna_storage())
    assert [t.state.name for t in study.trials] == ["RUNNING", "FAIL"]
    play(db, made[0]["job_id"], [0.8], done=True)
    taker.tick()
    assert api.get(f"/v1/sweeps/{sweep['id']}").json()["status"] == "SUCCEEDED"


def test_a_sweep_whose_every_trial_is_refused_asks_a_bounded_number_a_step_and_fails(
        api: Any, db: Any, database_url: str, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every trial is refused once the operator lowers TRAINJOBS_MAX_CPU_REPLICAS: a step asks at most
    REFUSALS_PER_STEP of them (before, one step asked all of max_trials, ~20 ms each), and the sweep goes on
    at its next steps until each was asked, then FAILED with the reason."""
    import optuna

    from worker.sweeps import REFUSALS_PER_STEP

    sweep = submit(api, job={**IRIS_JOB, "strategy": "auto", "accelerator": {"type": "cpu", "replicas": 4}},
                   max_trials=REFUSALS_PER_STEP + 2, parallel_trials=1)
    monkeypatch.setenv("TRAINJOBS_MAX_CPU_REPLICAS", "3")  # the engine runs in this process
    e = engine(database_url, db)
    e.tick()
    study = optuna.load_study(study_name=f"sweep-{sweep['id']}", storage=e._optuna_storage())
    assert [t.state.name for t in study.trials] == ["FAIL"] * REFUSALS_PER_STEP
    assert api.get(f"/v1/sweeps/{sweep['id']}").json()["status"] == "RUNNING"
    e.tick()
    done = api.get(f"/v1/sweeps/{sweep['id']}").json()
    assert done["status"] == "FAILED", done
    assert "is not admitted: accelerator.replicas: 4 CPU replicas" in done["note"]
    assert len(study.trials) == REFUSALS_PER_STEP + 2 and trials(api, sweep["id"]) == []
