"""Sweeps played without machines (issue 22): a sweep submitted through the API, the worker's real sweep
engine ticked by the test, and its trials' jobs played: their status and their epochs written as a
worker and an agent would, so each of the engine's decisions is judged on known curves."""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import text

from service.db.session import get_engine, transaction
from tests.support import scaled
from trainjobs import storage
from trainjobs.job_paths import JobPaths
from worker.sweeps import SweepConfig, SweepEngine

IRIS_JOB = {"dataset": {"source": "sklearn:iris"}, "model": {"name": "mlp"}, "accelerator": {"type": "cpu"},
            "strategy": "default", "training": {"epochs": 4}}


def sweep_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "lr", "job": IRIS_JOB,
        "parameters": {"training.learning_rate": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True}},
        "objective": {"metric": "val_accuracy"}, "algorithm": "random", "max_trials": 6, "parallel_trials": 2}
    spec.update(overrides)
    return spec


def submit(api: Any, **overrides: Any) -> dict[str, Any]:
    r = api.post("/v1/sweeps", json=sweep_spec(**overrides))
    assert r.status_code == 201, r.text
    return dict(r.json())


def engine(database_url: str, db: Any, name: str = "w1", lease_s: float = 30.0, **config: Any) -> SweepEngine:
    """The worker's sweep engine; a tick waits for its steps (scaled: a test judges what a step did)."""
    config.setdefault("tick_wait_s", scaled(120))
    config.setdefault("step_every_s", 0.0)  # each tick steps every sweep it has room for
    return SweepEngine(get_engine(database_url), db, name, threading.Event(), SweepConfig(lease_s=lease_s, **config))


def project_client(api_url: str, db: Any, project: str) -> Any:
    """An API client of another project than the `api` fixture's alpha."""
    import httpx

    from tests.support.jobs import make_key

    return httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {make_key(db, project)}"},
                        timeout=scaled(30))


def long_history(epochs: int) -> dict[str, Any]:
    """A metrics.json of `epochs` epochs, as a job's own code can write it (60,000: 2.7 MB)."""
    return {"history": [{"epoch": i, "val_accuracy": round(0.5 + i / (4 * epochs), 6)} for i in range(1, epochs + 1)]}


def trials(api: Any, sweep_id: str) -> list[dict[str, Any]]:
    return list(api.get(f"/v1/sweeps/{sweep_id}/trials").json()["trials"])


def play(db: Any, job_id: str, curve: list[float], *, done: bool) -> None:
    """The job trained len(curve) epochs with these val_accuracy values (metrics.json, as the agent
    writes it), and is RUNNING, or SUCCEEDED with the last as its final metric."""
    history = [{"epoch": i + 1, "val_accuracy": v, "loss": 1 - v} for i, v in enumerate(curve)]
    storage.write_json(JobPaths.for_job(job_id).metrics, {"history": history})
    status = "SUCCEEDED" if done else "RUNNING"
    with transaction(db) as session:
        session.execute(text(
            "UPDATE jobs SET status = CAST(:s AS job_status), provisioning_at = COALESCE(provisioning_at, now()),"
            " finished_at = CASE WHEN :done THEN now() END, metrics = CAST(:m AS jsonb) WHERE id = :id"),
            {"s": status, "done": done, "id": job_id, "m": f'{{"val_accuracy": {curve[-1]}}}' if done else None})


def job_row(db: Any, job_id: str) -> Any:
    with transaction(db) as session:
        return session.execute(text("SELECT status, error, spec, labels FROM jobs WHERE id = :id"), {"id": job_id}).one()
