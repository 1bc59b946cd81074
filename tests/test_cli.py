"""The `trainjobs` CLI as a user runs it: `up` in one process, client commands in others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from trainjobs.ports import free_port


def cli(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([sys.executable, "-m", "stack.cli", *args], env=env, capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"trainjobs {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


@pytest.fixture
def stack(db, database_url, gcs_emulator, tmp_path):
    """`trainjobs up` with the memory provisioner, against the test database."""
    env = {**os.environ, "TRAINJOBS_HOME": str(tmp_path / "home"), "TRAINJOBS_DATABASE_URL": database_url}
    port = free_port()
    log = tmp_path / "up.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "stack.cli", "up", "--port", str(port), "--data-dir",
                                 str(tmp_path / "data"), "--provisioner", "memory"], env=env, stdout=out, stderr=out)
    deadline = time.monotonic() + 60
    while "\nready\n" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    yield env, port
    proc.terminate()
    proc.wait(30)


def test_up_writes_client_config(stack, tmp_path):
    env, port = stack
    config = json.loads((tmp_path / "home" / "config.json").read_text())
    assert config["api_url"] == f"http://127.0.0.1:{port}" and config["api_key"].startswith("tj_")
    assert oct((tmp_path / "home" / "config.json").stat().st_mode)[-3:] == "600"


def test_submit_wait_status_list_and_cancel(stack, tmp_path):
    env, _ = stack
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "cli", "dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp"},
                                    "labels": {"team": "cli"}}))
    r = cli("submit", str(spec), "--wait", env=env)
    job_id = r.stdout.split()[0]
    assert "SUCCEEDED" in r.stdout
    assert "SUCCEEDED" in cli("status", job_id, env=env).stdout
    events = cli("status", job_id, "--events", env=env).stdout
    assert "STAGING" in events and "PROVISIONING" in events
    assert json.loads(cli("status", job_id, "--json", env=env).stdout)["id"] == job_id
    assert job_id in cli("list", "--label", "team=cli", env=env).stdout
    assert cli("list", "--label", "team=other", env=env).stdout == ""
    r = cli("cancel", job_id, env=env, check=False)
    assert r.returncode == 1 and "cannot be cancelled" in r.stderr


def test_bad_spec_prints_field_and_reason(stack, tmp_path):
    env, _ = stack
    spec = tmp_path / "bad.yaml"
    spec.write_text(yaml.safe_dump({"dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp"}, "strategy": "tpu"}))
    r = cli("submit", str(spec), env=env, check=False)
    assert r.returncode == 1 and "strategy: strategy 'tpu' needs a TPU accelerator" in r.stderr


def test_env_overrides_config_file(stack, tmp_path):
    env, _ = stack
    r = cli("list", env={**env, "TRAINJOBS_API_KEY": "tj_wrong"}, check=False)
    assert r.returncode == 1 and "unknown or revoked API key" in r.stderr


def test_keys_create_gives_a_working_key_for_a_new_project(stack, database_url):
    env, port = stack
    key = cli("keys", "create", "--project", "other", env=env).stdout.strip()
    other = {**env, "TRAINJOBS_API_KEY": key, "TRAINJOBS_API_URL": f"http://127.0.0.1:{port}"}
    assert cli("list", env=other).stdout == ""


def test_api_refuses_unmigrated_database_with_the_fix_in_the_message(database_url, tmp_path):
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(database_url)
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    empty = f"{url.database}_cli"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{empty}"')
        conn.execute(f'CREATE DATABASE "{empty}"')
    env = {**os.environ, "TRAINJOBS_DATABASE_URL": url.set(database=empty).render_as_string(hide_password=False),
           "TRAINJOBS_HOME": str(tmp_path)}
    try:
        r = cli("worker", "--provisioner", "memory", env=env, check=False)
        assert r.returncode == 1 and "trainjobs db upgrade" in r.stderr
        assert "database at revision" in cli("db", "upgrade", env=env).stdout
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{empty}" WITH (FORCE)')


def test_worker_sigterm_hands_running_jobs_back_at_once(db, database_url, tmp_path, api):
    import signal
    import uuid

    from sqlalchemy import text

    from service.db.models import Job
    from service.db.session import transaction

    env = {**os.environ, "TRAINJOBS_HOME": str(tmp_path), "TRAINJOBS_DATABASE_URL": database_url}
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "stack.cli", "worker", "--provisioner", "memory",
                                 "--data-dir", str(tmp_path / "data")], env=env, stdout=out, stderr=out)
    job_id = api.post("/v1/jobs", json={"dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp"}}).json()["id"]
    deadline = time.monotonic() + 30
    while api.get(f"/v1/jobs/{job_id}").json()["status"] != "RUNNING":
        assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0, log.read_text()
    with transaction(db) as s:
        job = s.get(Job, uuid.UUID(job_id))
        expired = s.execute(text("SELECT lease_expires_at < now() FROM jobs WHERE id = :id"),
                            {"id": job.id}).scalar()
    assert job.status.value == "RUNNING" and expired  # still running, and any worker may take it over now
