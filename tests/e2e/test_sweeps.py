"""A sweep of real jobs (issue 22): the README's example, twelve trials of the managed trainer on
scikit-learn's digits, three at a time on local machines, TPE with median pruning, through the API and
the worker as a user runs one. Its epochs take a good part of a second (batches of 8 through two
layers of 256): a trial's epochs are seen, and a trial behind stopped, before it ends by itself. The engine's decisions on known curves (pruning, a worker stopping mid-ask, grids, cancel, the
cost limit) are tests/integration/test_sweeps.py's."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support import eventually
from tests.support.jobs import module_jobs
from tests.support.local import AGENT_JOB_S, local_stack_running

pytestmark = pytest.mark.tf


def _readme_sweep() -> dict[str, Any]:
    """README, Sweeps: the example as written is what runs here."""
    import yaml

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    doc: dict[str, Any] = yaml.safe_load(readme.split("## Sweeps", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0])
    return doc


SWEEP = _readme_sweep()


@pytest.fixture(scope="module")
def sweep(database_url: str, api_url: str, gcs_emulator: Any,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, dict[str, Any], list[dict[str, Any]]]]:
    """The sweep run to its end: (API client, the sweep, its trials)."""
    with module_jobs(database_url, api_url, "sweeps") as (client, _, _):
        r = client.post("/v1/sweeps", json=SWEEP)
        assert r.status_code == 201, r.text
        sweep_id = r.json()["id"]
        source = client.post("/v1/modules", files={"file": ("regression_loop.py", PROGRAMS.joinpath(
            "regression_loop.py").read_bytes())}).json()["module"]
        r = client.post("/v1/sweeps", json=program_sweep(source))
        assert r.status_code == 201, r.text
        SWEEPS["program"] = r.json()["id"]
        with local_stack_running(database_url, tmp_path_factory.mktemp("stack"), slots=3):
            done = _ended(client, sweep_id)
            trials = client.get(f"/v1/sweeps/{sweep_id}/trials").json()["trials"]
            _ended(client, SWEEPS["program"])
            yield client, done, trials


SWEEPS: dict[str, str] = {}
PROGRAMS = Path(__file__).resolve().parents[1] / "programs"


def program_sweep(source: str) -> dict[str, Any]:
    """A grid over the learning rate the runtime hands the user's own training loop (tests/programs/
    regression_loop.py, which reports test_mae each epoch)."""
    return {"name": "loop-lr", "job": {"program": {"source": source, "args": ["--units", "16"]},
                                       "accelerator": {"type": "cpu"}, "training": {"epochs": 3, "global_batch_size": 32}},
            "parameters": {"training.learning_rate": {"type": "categorical", "choices": [1e-5, 3e-3]}},
            "objective": {"metric": "test_mae", "goal": "minimize"}, "algorithm": "grid", "parallel_trials": 2}


def _ended(client: Any, sweep_id: str) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        s: dict[str, Any] = client.get(f"/v1/sweeps/{sweep_id}").json()
        return s if s["status"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None

    return eventually(ended, 4 * AGENT_JOB_S, lambda: str(client.get(f"/v1/sweeps/{sweep_id}/trials").json()), every=1.0)


def test_twelve_trials_three_at_a_time_end_with_a_best_trial(sweep: tuple[Any, dict[str, Any], list[dict[str, Any]]]) -> None:
    client, done, trials = sweep
    assert done["status"] == "SUCCEEDED", done
    assert [t["number"] for t in trials] == list(range(12))
    assert {t["state"] for t in trials} <= {"COMPLETE", "PRUNED"}, [(t["state"], t["job_error"]) for t in trials]
    assert all(t["curve"] for t in trials)  # every trial reported its epochs
    values = [t["value"] for t in trials if t["state"] == "COMPLETE"]
    assert done["best"]["value"] == max(values) and done["best"]["value"] >= 0.9
    # Three at a time, never more: the trials' jobs' spans on their machines, overlapped.
    spans = []
    for t in trials:
        job = client.get(f"/v1/jobs/{t['job_id']}").json()
        assert job["labels"]["sweep"] == done["id"] and job["labels"]["trial"] == str(t["number"])
        spans.append((datetime.fromisoformat(job["staging_at"]), datetime.fromisoformat(job["finished_at"])))
    most = max(sum(1 for s, e in spans if s <= at < e) for at, _ in spans)
    assert 2 <= most <= 3, most
    print(f"digits sweep: best val_accuracy {done['best']['value']:.3f}; "
          f"{sum(t['state'] == 'PRUNED' for t in trials)} of 12 pruned; "
          f"{done['accelerator_seconds']:.0f} accelerator-seconds")


def test_pruned_trials_are_cancelled_jobs_that_say_why(sweep: tuple[Any, dict[str, Any], list[dict[str, Any]]]) -> None:
    client, _, trials = sweep
    pruned = [t for t in trials if t["state"] == "PRUNED"]
    assert pruned, [(t["number"], t["params"], t["curve"]) for t in trials]  # a learning rate of 1e-6 trails
    cancelled = 0
    for t in pruned:
        job = client.get(f"/v1/jobs/{t['job_id']}").json()
        events = client.get(f"/v1/jobs/{t['job_id']}/events").json()["events"]
        assert "pruned by the sweep" in [e["reason"] for e in events], events  # its cancel, and why
        assert len(t["curve"]) < SWEEP["job"]["training"]["epochs"]  # stopped before its last epoch
        # A job whose agent finished its last epoch and export while the cancel travelled ends
        # SUCCEEDED all the same (seen once in five runs on a loaded machine); the others are CANCELLED.
        assert job["status"] in ("CANCELLED", "SUCCEEDED"), job
        if job["status"] == "CANCELLED":
            assert job["error"] == "pruned by the sweep", job
            cancelled += 1
    assert cancelled >= len(pruned) / 2, [(t["number"], t["job_status"]) for t in pruned]


def test_the_best_trials_model_downloads_and_classifies_digits(sweep: tuple[Any, dict[str, Any], list[dict[str, Any]]],
                                                                tmp_path: Path) -> None:
    import tensorflow as tf
    from sklearn.datasets import load_digits

    from trainjobs.client.api import Client

    client, done, _ = sweep
    key = client.headers["authorization"].split()[1]
    Client(api_url=str(client.base_url), api_key=key).download_artifacts(done["best"]["job_id"], tmp_path)
    served = tf.saved_model.load(str(tmp_path / "saved_model"))
    x, y = load_digits(return_X_y=True)  # as staging makes them: 8x8 grey images in [0, 1]
    predicted = np.argmax(served.serve(tf.constant((x / 16.0).reshape(-1, 8, 8, 1).astype(np.float32))).numpy(), axis=1)
    assert np.mean(predicted == y) >= 0.9


def test_a_grid_over_a_programs_learning_rate_finds_the_one_that_learns(
        sweep: tuple[Any, dict[str, Any], list[dict[str, Any]]]) -> None:
    """A sweep of the user's own program: the objective is what the program reports with tj.report."""
    client, _, _ = sweep
    done = client.get(f"/v1/sweeps/{SWEEPS['program']}").json()
    assert done["status"] == "SUCCEEDED", done
    trials = client.get(f"/v1/sweeps/{SWEEPS['program']}/trials").json()["trials"]
    assert sorted(t["params"]["training.learning_rate"] for t in trials) == [1e-5, 3e-3]
    assert all(len(t["curve"]) == 3 and t["state"] == "COMPLETE" for t in trials), trials
    assert done["best"]["params"]["training.learning_rate"] == 3e-3  # 1e-5 barely moves in three epochs
    assert done["best"]["value"] == min(t["value"] for t in trials)
