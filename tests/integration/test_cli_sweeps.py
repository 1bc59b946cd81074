"""`trainjobs sweep` (issue 22) as a user runs it, against the real API and PostgreSQL. No worker runs:
the trials are made by the worker's sweep engine, ticked here, and their jobs played (status and
epochs written as a worker and an agent would), as in tests/integration/test_sweeps.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from stack.cli import main
from tests.support.sweeps import engine, play, sweep_spec, trials
from tests.support import scaled


@pytest.fixture
def env(api: Any, api_url: str, tmp_path: Path) -> dict[str, str]:
    """The CLI's environment: the test API, and project alpha's key (the `api` fixture's)."""
    return {"TRAINJOBS_HOME": str(tmp_path / "home"), "TRAINJOBS_API_URL": api_url,
            "TRAINJOBS_API_KEY": api.headers["authorization"].split()[1]}


def cli(env: dict[str, str], *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(main, list(args), env=env)
    assert result.exit_code == code, f"trainjobs {' '.join(args)} -> {result.exit_code}\n{result.output}"
    return result


def write_sweep(path: Path, **overrides: Any) -> Path:
    path.write_text(yaml.safe_dump(sweep_spec(**overrides)))
    return path


def submitted(api: Any, **overrides: Any) -> dict[str, Any]:
    r = api.post("/v1/sweeps", json=sweep_spec(**overrides))
    assert r.status_code == 201, r.text
    return dict(r.json())


def trial_rows(table: str) -> list[int]:
    """The trial numbers of the status table's rows, top to bottom."""
    rows = table.split("\nTRIAL", 1)[1].splitlines()[1:]
    return [int(row.split()[0]) for row in rows if row.strip()]


def test_submit_prints_the_sweeps_id_and_list_shows_it(api: Any, env: dict[str, str], tmp_path: Path) -> None:
    out = cli(env, "sweep", "submit", str(write_sweep(tmp_path / "sweep.yaml", name="lr-search"))).stdout
    sweep_id = out.split()[0]
    assert api.get(f"/v1/sweeps/{sweep_id}").json()["name"] == "lr-search"
    listed = cli(env, "sweep", "list").stdout
    assert re.search(rf"^{sweep_id}\s+lr-search\s+RUNNING\s+0/6\s", listed, re.M), listed


def test_list_without_sweeps_says_so(env: dict[str, str]) -> None:
    assert cli(env, "sweep", "list").stdout == "no sweeps\n"


@pytest.mark.parametrize(("goal", "order"), [("maximize", [1, 0, 2, 3]), ("minimize", [0, 1, 2, 3])])
def test_status_lists_the_trials_best_first_for_the_goal_and_those_without_a_value_last(
        api: Any, db: Any, database_url: str, bucket: str, env: dict[str, str], goal: str, order: list[int]) -> None:
    sweep = submitted(api, objective={"metric": "val_accuracy", "goal": goal}, max_trials=4)
    e = engine(database_url, db)
    e.tick()
    first, second = trials(api, sweep["id"])
    play(db, first["job_id"], [0.4, 0.5], done=True)
    play(db, second["job_id"], [0.7, 0.9], done=True)
    e.tick()  # both COMPLETE, trials 2 and 3 queued in their place
    out = cli(env, "sweep", "status", sweep["id"]).stdout
    assert trial_rows(out) == order, out
    header = re.search(r"^TRIAL\s+STATE\s+VAL_ACCURACY\s+training\.learning_rate\s+EPOCHS\s+JOB STATUS\s+COST$",
                       out, re.M)
    assert header, out
    assert re.search(r"^1\s+COMPLETE\s+0\.9\s+\S+\s+2\s+SUCCEEDED\s+\$0\.0000$", out, re.M), out
    assert re.search(r"^2\s+RUNNING\s+-\s+\S+\s+0\s+QUEUED\s", out, re.M), out


def test_status_heads_the_table_with_the_objective_the_counts_and_the_best_trial(
        api: Any, db: Any, database_url: str, bucket: str, env: dict[str, str]) -> None:
    sweep = submitted(api, max_trials=4)
    e = engine(database_url, db)
    e.tick()
    first, second = trials(api, sweep["id"])
    play(db, first["job_id"], [0.5], done=True)
    play(db, second["job_id"], [0.9], done=True)
    e.tick()
    out = cli(env, "sweep", "status", sweep["id"]).stdout
    assert re.search(r"^status\s+RUNNING$", out, re.M), out
    assert re.search(r"^objective\s+val_accuracy, maximize$", out, re.M), out
    assert re.search(r"^trials\s+2 complete, 0 pruned, 0 failed, 2 running of 4 planned$", out, re.M), out
    lr = second["params"]["training.learning_rate"]
    best = re.search(r"^best\s+trial 1  val_accuracy 0\.9  training\.learning_rate=(\S+)  job (\S+)$", out, re.M)
    assert best and float(best[1]) == pytest.approx(lr, rel=1e-3) and best[2] == second["job_id"], out


@pytest.mark.parametrize("args", [("sweep", "status", "{id}"), ("sweep", "list"), ("sweep", "cancel", "{id}")])
def test_json_output_is_the_apis_json(api: Any, env: dict[str, str], args: tuple[str, ...]) -> None:
    sweep = submitted(api)
    printed = json.loads(cli(env, *(a.format(id=sweep["id"]) for a in args), "--json").stdout)
    answer = api.get("/v1/sweeps").json() if args[1] == "list" else api.get(f"/v1/sweeps/{sweep['id']}").json()
    assert printed == answer


def test_cancel_moves_the_sweep_to_cancelling(api: Any, env: dict[str, str]) -> None:
    sweep = submitted(api)
    out = cli(env, "sweep", "cancel", sweep["id"]).stdout
    assert out.startswith(f"{sweep['id']}  CANCELLING") and "(cancel requested by user)" in out, out
    assert api.get(f"/v1/sweeps/{sweep['id']}").json()["status"] == "CANCELLING"


@pytest.mark.parametrize(("overrides", "field", "reason"), [
    ({"parameters": {"training.learning_rat": {"type": "float", "low": 0.1, "high": 0.2}}},
     "parameters.training.learning_rat", "did you mean 'learning_rate'?"),
    ({"objective": {"metric": "val_auc"}}, "objective.metric", "'val_auc' is not a metric the trials report"),
])
def test_an_invalid_sweep_file_prints_the_field_and_reason_and_exits_1(
        api: Any, env: dict[str, str], tmp_path: Path, overrides: dict[str, Any], field: str, reason: str) -> None:
    result = cli(env, "sweep", "submit", str(write_sweep(tmp_path / "sweep.yaml", **overrides)), code=1)
    said = [line for line in result.stderr.splitlines() if line.startswith(f"  {field}: ")]
    assert len(said) == 1 and reason in said[0] and result.stdout == "", result.output
    assert api.get("/v1/sweeps").json()["sweeps"] == []


def test_an_unknown_sweep_is_a_404_message_and_exit_1(env: dict[str, str]) -> None:
    result = cli(env, "sweep", "status", "00000000-0000-0000-0000-000000000000", code=1)
    assert "sweep 00000000-0000-0000-0000-000000000000 not found" in result.stderr


def test_a_local_dataset_the_sweeps_job_names_is_uploaded_relative_to_the_sweep_file(
        api: Any, env: dict[str, str], bucket: str, tmp_path: Path) -> None:
    folder = tmp_path / "search"
    folder.mkdir()
    rows = "label,a,b\n" + "".join(f"{i % 3},{i},{i * 2}\n" for i in range(30))
    (folder / "iris.csv").write_text(rows)
    job = {"dataset": {"source": "iris.csv"}, "model": {"name": "mlp"}, "training": {"epochs": 2}}
    out = cli(env, "sweep", "submit", str(write_sweep(folder / "sweep.yaml", job=job)))
    stored = api.get(f"/v1/sweeps/{out.stdout.split()[0]}").json()["spec"]["job"]["dataset"]["source"]
    assert stored == f"dataset:{hashlib.sha256(rows.encode()).hexdigest()}"
    assert f"uploaded dataset iris.csv -> {stored}" in out.stderr


def test_submit_wait_polls_until_the_sweep_ends_then_shows_its_trials(
        api: Any, db: Any, database_url: str, bucket: str, env: dict[str, str], tmp_path: Path) -> None:
    spec = write_sweep(tmp_path / "sweep.yaml", max_trials=2, parallel_trials=2)
    waiting = subprocess.Popen([sys.executable, "-m", "stack.cli", "sweep", "submit", str(spec), "--wait"],
                               env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert waiting.stdout is not None
    sweep_id = waiting.stdout.readline().split()[0]
    e = engine(database_url, db)
    e.tick()
    for t, value in zip(trials(api, sweep_id), (0.6, 0.8), strict=True):
        play(db, t["job_id"], [value], done=True)
    e.tick()
    out, err = waiting.communicate(timeout=scaled(60))
    assert waiting.returncode == 0, out + err
    assert re.search(r"^status\s+SUCCEEDED$", out, re.M) and trial_rows(out) == [1, 0], out
