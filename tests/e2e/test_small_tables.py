"""Issue 37: on a small table, a user who sets nothing but the task gets a model about as good as scikit-learn's
linear baseline on rows the job never saw, judged from the downloaded SavedModel, and runtime.notes says
what was chosen for the table. A fifth of each table is held out here and never uploaded; the baseline is
fitted on every uploaded row (the job's training and validation splits together).

The margins: these held-out rows are bench/small_tables.py's split 0. There, with the defaults before issue
37 written out, diabetes at 60 epochs scored R² 0.17 below LinearRegression and iris at the default 10 epochs
0.23 below LogisticRegression in accuracy (7 rows of 30), far outside the margins; with the new defaults,
diabetes scored -0.006 to +0.023 from LinearRegression in five runs (training on a CPU is not bit-for-bit
repeatable, and early stopping on 71 validation rows can pick another epoch) and iris equalled
LogisticRegression in three. R² 0.05 covers that run-to-run spread; accuracy 0.04 is one row of iris' 30."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.jobs import ModuleJobs, finished, module_jobs, submit_all
from tests.support.local import local_stack_running

pytestmark = pytest.mark.tf

R2_MARGIN = 0.05  # diabetes: R² below LinearRegression's, at most
ACCURACY_MARGIN = 0.04  # iris: one held-out row of 30 is 0.033


def _held_out(table: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(uploaded x, y, held-out x, y) of a scikit-learn table as it ships, a fifth held out (by class)."""
    from sklearn import datasets
    from sklearn.model_selection import train_test_split

    if table == "diabetes":
        x, y = datasets.load_diabetes(return_X_y=True, scaled=False)
    else:
        x, y = getattr(datasets, f"load_{table}")(return_X_y=True)
    x_up, x_test, y_up, y_test = train_test_split(x, y, test_size=0.2, random_state=0,
                                                  stratify=None if table == "diabetes" else y)
    return x_up, x_test, y_up, y_test


def _csv(x: np.ndarray, y: np.ndarray) -> bytes:
    header = ",".join([*(f"f{i}" for i in range(x.shape[1])), "label"])
    return ("\n".join([header, *(",".join([*(f"{v:.8g}" for v in row), f"{t:.8g}"]) for row, t in zip(x, y, strict=True))])
            + "\n").encode()


@pytest.fixture(scope="module")
def jobs(database_url: str, api_url: str, gcs_emulator: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleJobs]:
    with module_jobs(database_url, api_url, "small-tables") as (client, _, _):
        sources = {}
        for table in ("diabetes", "iris"):
            x, _, y, _ = _held_out(table)
            r = client.post("/v1/datasets", files={"file": (f"{table}.csv", _csv(x, y))})
            assert r.status_code == 201, r.text
            sources[table] = f"dataset:{r.json()['sha256']}"
        cpu = {"accelerator": {"type": "cpu"}, "model": {"name": "mlp"}}
        ids = submit_all(client, {
            # The job: nothing set but the task and 60 epochs.
            "diabetes": {**cpu, "task": "regression", "dataset": {"source": sources["diabetes"]},
                         "training": {"epochs": 60}},
            "iris": {**cpu, "dataset": {"source": sources["iris"]}},  # nothing set at all: 10 epochs
        })
        with local_stack_running(database_url, tmp_path_factory.mktemp("stack")):
            yield client, ids


def _served(jobs: ModuleJobs, name: str, into: Path, x: np.ndarray) -> np.ndarray:
    import tensorflow as tf

    from trainjobs.client.api import Client

    client, ids = jobs
    Client(api_url=str(client.base_url), api_key=client.headers["authorization"].split()[1]).download_artifacts(
        ids[name], into)
    loaded = tf.saved_model.load(str(into / "saved_model"))  # held: its functions need its variables
    return np.asarray(loaded.serve(tf.constant(x.astype(np.float32))).numpy())


def _notes(job: dict[str, Any]) -> str:
    return "\n".join(job["runtime"]["notes"])


def test_diabetes_with_60_epochs_and_nothing_else_set_holds_against_linear_regression(jobs: ModuleJobs,
                                                                                        tmp_path: Path) -> None:
    from sklearn.linear_model import LinearRegression
    from sklearn.metrics import r2_score

    job = finished(jobs, "diabetes")
    assert job["status"] == "SUCCEEDED", job.get("error")
    x, x_test, y, y_test = _held_out("diabetes")
    ours = r2_score(y_test, _served(jobs, "diabetes", tmp_path, x_test)[:, 0])
    linear = r2_score(y_test, LinearRegression().fit(x, y).predict(x_test))
    print(f"diabetes, held-out R²: trainjobs mlp {ours:.3f}, LinearRegression {linear:.3f}")
    assert ours >= linear - R2_MARGIN, (ours, linear)
    notes = _notes(job)
    assert "small table (282 training rows)" in notes and "early stopping on val_loss" in notes, notes
    assert "best_epoch" in job["metrics"], job["metrics"]  # which epoch's weights the SavedModel holds


def test_iris_with_nothing_set_holds_against_logistic_regression(jobs: ModuleJobs, tmp_path: Path) -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    job = finished(jobs, "iris")
    assert job["status"] == "SUCCEEDED", job.get("error")
    x, x_test, y, y_test = _held_out("iris")
    ours = float(np.mean(_served(jobs, "iris", tmp_path, x_test).argmax(axis=-1) == y_test))
    linear = float(make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000)).fit(x, y).score(x_test, y_test))
    print(f"iris, held-out accuracy: trainjobs mlp {ours:.3f}, LogisticRegression {linear:.3f}")
    assert ours >= linear - ACCURACY_MARGIN, (ours, linear)
    assert "batch 4 a replica, not 32" in _notes(job), _notes(job)
