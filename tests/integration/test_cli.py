"""The `trainjobs` CLI as a user runs it: `up` in one process, client commands in others."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.tmp import outside_pytest_tmp
from tests.support import eventually, scaled
from trainjobs.loopback import free_port


def cli(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([sys.executable, "-m", "stack.cli", *args], env=env, capture_output=True, text=True,
                       timeout=scaled(120))
    if check and r.returncode != 0:
        raise AssertionError(f"trainjobs {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def start_up(env: dict[str, str], data_dir: Path, log: Path, *options: str) -> tuple[subprocess.Popen[bytes], int]:
    """`trainjobs up` with the memory provisioner, once it has said `ready`."""
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "stack.cli", *options, "up", "--port", str(port), "--data-dir",
                                 str(data_dir), "--provisioner", "memory"], env=env, stdout=out, stderr=out)
    def ready() -> bool:
        assert proc.poll() is None, log.read_text()
        return "\nready\n" in log.read_text() or '"message": "ready"' in log.read_text()

    eventually(ready, 60, lambda: f"`up` said ready; its log: {log.read_text()}", every=0.1)
    return proc, port


@pytest.fixture
def stack(db, database_url, gcs_emulator, tmp_path):
    """`trainjobs up` with the memory provisioner, against the test database, logging JSON lines."""
    env = {**os.environ, "TRAINJOBS_HOME": str(tmp_path / "home"), "TRAINJOBS_DATABASE_URL": database_url}
    proc, port = start_up(env, tmp_path / "data", tmp_path / "up.log", "--log-format", "json")
    yield env, port
    proc.terminate()
    proc.wait(scaled(30))


def write_spec(path: Path, **fields: object) -> Path:
    path.write_text(yaml.safe_dump({"name": "cli", "dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp"},
                                    **fields}))
    return path


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
    assert cli("list", "--label", "team=other", env=env).stdout == "no jobs\n"
    r = cli("cancel", job_id, env=env, check=False)
    assert r.returncode == 1 and "cannot be cancelled" in r.stderr


def test_bad_spec_prints_field_and_reason(stack, tmp_path):
    env, _ = stack
    spec = tmp_path / "bad.yaml"
    spec.write_text(yaml.safe_dump({"dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp"}, "strategy": "tpu"}))
    r = cli("submit", str(spec), env=env, check=False)
    assert r.returncode == 1 and "strategy: strategy 'tpu' needs a TPU accelerator" in r.stderr
    assert r.stderr.count("needs a TPU accelerator") == 1 and r.stdout == ""  # said once


def test_env_overrides_config_file(stack, tmp_path):
    env, _ = stack
    r = cli("list", env={**env, "TRAINJOBS_API_KEY": "tj_wrong"}, check=False)
    assert r.returncode == 1 and "unknown or revoked API key" in r.stderr


def test_keys_create_gives_a_working_key_for_a_new_project(stack, database_url):
    env, port = stack
    key = cli("keys", "create", "--project", "other", env=env).stdout.strip()
    other = {**env, "TRAINJOBS_API_KEY": key, "TRAINJOBS_API_URL": f"http://127.0.0.1:{port}"}
    assert cli("list", env=other).stdout == "no jobs\n"


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


def test_submit_follow_shows_each_status_then_the_result_without_http_log_lines(stack, tmp_path):
    env, _ = stack
    r = cli("submit", str(write_spec(tmp_path / "job.yaml")), "--follow", env=env)
    job_id = r.stdout.split()[0]
    statuses = [line.split()[1] for line in r.stdout.splitlines()[1:] if line[:2].isdigit()]
    assert statuses[-1] == "SUCCEEDED" and len(statuses) >= 2, r.stdout
    assert re.search(rf"^job\s+{job_id}", r.stdout, re.M) and "val_accuracy 0.99" in r.stdout  # the result
    assert "HTTP Request" not in r.stdout + r.stderr and "INFO" not in r.stderr


def test_submit_follow_on_a_terminal_draws_a_live_progress_bar(stack, tmp_path):
    import pty
    import select

    env, _ = stack
    master, child_side = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "stack.cli", "submit", str(write_spec(tmp_path / "job.yaml")),
                             "--follow"], env={**env, "COLUMNS": "160"}, stdout=child_side, stderr=child_side)
    os.close(child_side)
    out, deadline = b"", time.monotonic() + scaled(60)
    while time.monotonic() < deadline:
        if select.select([master], [], [], 0.5)[0]:
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # EIO: the process closed the terminal
                break
            if not chunk:
                break
            out += chunk
    os.close(master)
    assert proc.wait(scaled(30)) == 0, out
    text = out.decode(errors="replace")
    assert "ETA" in text and "\x1b[" in text and "SUCCEEDED" in text  # redrawn in place, then the result


def test_submit_follow_json_prints_one_object_per_line_ending_with_the_job(stack, tmp_path):
    env, _ = stack
    r = cli("submit", str(write_spec(tmp_path / "job.yaml")), "--follow", "--output", "json", env=env)
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert lines[0]["status"] == "QUEUED" and lines[-1]["event"] == "end"
    assert lines[-1]["job"]["id"] == lines[0]["id"] and lines[-1]["job"]["status"] == "SUCCEEDED"
    assert {"status"} <= {line.get("event") for line in lines[1:-1]}


def hold_jobs(env: dict[str, str]) -> None:
    """Jobs of the stack's project wait in QUEUED (a quota of 0): nothing ends them but a cancel."""
    cli("projects", "set-quota", "local", "--max-running-jobs", "0", env=env)


def test_submit_follow_exits_3_when_the_job_is_cancelled(stack, tmp_path):
    env, _ = stack
    hold_jobs(env)
    follow = subprocess.Popen([sys.executable, "-m", "stack.cli", "submit", str(write_spec(tmp_path / "job.yaml")),
                               "--follow"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert follow.stdout is not None
    job_id = follow.stdout.readline().split()[0]
    cli("cancel", job_id, env=env)
    assert follow.wait(scaled(60)) == 3
    assert json.loads(cli("status", job_id, "-o", "json", env=env).stdout)["status"] == "CANCELLED"


def start_interruptible(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """`trainjobs ARGS` hearing Ctrl-C as it does when started from a terminal, however the suite was started.

    A suite run as a background job of a script (`make test > log &` in a non-interactive shell) hands
    its children SIGINT ignored, and Python keeps an inherited ignore, as a Unix program should: a
    SIGINT sent to such a child is never heard, and the follow went on (issue 19). A handler of
    Python's own is what exec resets to the default, so the child starts with SIGINT as a terminal's."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen([sys.executable, "-m", "stack.cli", *args], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_stops_following_and_leaves_the_job_running(stack, tmp_path):
    env, _ = stack
    hold_jobs(env)
    follow = start_interruptible("submit", str(write_spec(tmp_path / "job.yaml")), "--follow", env=env)
    assert follow.stdout is not None and follow.stderr is not None
    job_id = follow.stdout.readline().split()[0]
    follow.stdout.readline()  # the first status line: it is following now
    follow.send_signal(signal.SIGINT)
    assert follow.wait(scaled(30)) == 130
    assert f"job {job_id} keeps running" in follow.stderr.read()
    assert json.loads(cli("status", job_id, "--output", "json", env=env).stdout)["status"] == "QUEUED"


def test_ctrl_c_while_submitting_exits_130_before_following(stack, tmp_path, database_url):
    """The submit's request waits for the API (held at the idempotency-key lookup, which only a
    submit makes); Ctrl-C then ends the command at once, with nothing about a job it never heard of."""
    import psycopg
    from sqlalchemy.engine import make_url

    env, _ = stack
    url = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
    # A second connection watches: pg_stat_activity read inside the locking transaction is a snapshot.
    with psycopg.connect(url, autocommit=True) as lock, lock.transaction(), \
            psycopg.connect(url, autocommit=True) as watch:
        lock.execute("LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE")
        follow = start_interruptible("submit", str(write_spec(tmp_path / "job.yaml")), "--follow", env=env)
        assert follow.stdout is not None and follow.stderr is not None
        waiting = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                   "AND wait_event_type = 'Lock' AND query LIKE '%idempotency_keys%'")
        def blocked() -> bool:
            assert follow.poll() is None, follow.communicate()
            return watch.execute(waiting).fetchone() != (0,)

        eventually(blocked, 60, "the submit waits on the locked table")
        follow.send_signal(signal.SIGINT)
        assert follow.wait(scaled(30)) == 130
    assert follow.stdout.read() == "" and follow.stderr.read() == "interrupted\n"


def test_logs_and_metrics_follow_the_event_stream_to_the_jobs_end(stack, tmp_path):
    env, _ = stack
    job_id = cli("submit", str(write_spec(tmp_path / "job.yaml")), env=env).stdout.split()[0]
    logs = [json.loads(line) for line in cli("logs", job_id, "--follow", "-o", "json", env=env).stdout.splitlines()]
    assert logs[0] == {"event": "status", "status": logs[0]["status"]} and logs[-1] == {"event": "end", "status": "SUCCEEDED"}
    r = cli("metrics", job_id, "--follow", env=env)
    assert r.stderr.strip() == "-- job ended SUCCEEDED"


class ApiBeforeStreaming:
    """An API from before streaming: `?follow=true` is ignored and answered with the JSON of a plain read.
    The job runs for its first three reads, then SUCCEEDED; its log grows a line per read."""

    def __init__(self) -> None:
        import http.server
        import threading

        reads = {"job": 0}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                path = self.path.split("?")[0]
                if path.endswith("/logs"):
                    body = {"text": "".join(f"line {i}\n" for i in range(reads["job"]))}
                elif path.endswith("/metrics"):
                    body = {"epochs": [{"epoch": i + 1, "loss": 1.0 / (i + 1)} for i in range(min(reads["job"], 2))]}
                else:
                    reads["job"] += 1
                    body = {"id": "j1", "status": "SUCCEEDED" if reads["job"] > 3 else "RUNNING"}
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


def test_follow_polls_an_api_that_does_not_stream(tmp_path):
    old = ApiBeforeStreaming()
    try:
        env = {**os.environ, "TRAINJOBS_HOME": str(tmp_path), "TRAINJOBS_API_URL": old.url}
        r = cli("logs", "j1", "--follow", env=env)
        assert r.stdout.splitlines() == ["line 0", "line 1", "line 2", "line 3"] and "ended SUCCEEDED" in r.stderr
    finally:
        old.server.shutdown()


def test_status_shows_phases_runtime_and_metrics_without_flags(stack, tmp_path):
    env, _ = stack
    job_id = cli("submit", str(write_spec(tmp_path / "job.yaml")), "--follow", env=env).stdout.split()[0]
    out = cli("status", job_id, env=env).stdout
    for phase in ("created", "staging", "provisioning", "running", "finished"):
        assert f"{phase} " in out, out
    assert "val_accuracy 0.99" in out and "event" not in out, out


def test_status_shows_the_runtime_the_agent_chose_and_its_notes():
    from trainjobs.client.terminal import job_detail, show

    job = {"id": "j1", "name": "n", "status": "RUNNING", "attempt": 1, "spec": {}, "progress": 0.5,
           "created_at": "2026-01-01T00:00:00+00:00", "running_at": "2026-01-01T00:00:05+00:00",
           "metrics": {"loss": 0.25}, "runtime": {"strategy": "MirroredStrategy", "replicas": 2,
                                                  "precision": "mixed_bfloat16", "global_batch_size": 64,
                                                  "learning_rate": 0.002, "steps_per_execution": 4,
                                                  "steps_per_epoch": 22, "notes": ["batch scaled to 64"]}}
    with capture_stdout() as out:
        show(job_detail(job))
    text = out.getvalue()
    for shown in ("strategy MirroredStrategy", "2 replicas", "precision mixed_bfloat16", "global batch 64",
                  "learning rate 0.002", "steps_per_execution 4", "note: batch scaled to 64", "loss 0.25",
                  "running 00:00:05"):
        assert shown in text, text


def test_status_shows_a_programs_runtime_without_what_the_program_did_not_say():
    from trainjobs.client.terminal import job_detail, show

    job = {"id": "j2", "name": "p", "status": "SUCCEEDED", "attempt": 1, "spec": {}, "progress": 1.0,
           "created_at": "2026-01-01T00:00:00+00:00", "runtime": {
               "program": True, "entrypoint": "trainer/task.py", "install_s": 12.5, "strategy": "mirrored",
               "replicas": 2, "precision": "float32", "global_batch_size": 64, "learning_rate": 0.001,
               "steps_per_execution": 4, "notes": ["keras multi-worker repair: symbolic build from the local batch"]}}
    with capture_stdout() as out:
        show(job_detail(job))
    text = out.getvalue()
    for shown in ("program trainer/task.py", "requirements installed in 12.5s", "steps_per_execution 4",
                  "note: keras multi-worker repair"):
        assert shown in text, text
    assert "None" not in text, text  # a program counts its own steps: no "None steps/epoch"


def test_a_regressions_epochs_show_its_own_metrics_not_empty_accuracy_columns():
    from trainjobs.client.terminal import epoch_line, epochs_table, show

    epochs = [{"epoch": 1, "loss": 0.9, "mae": 48.2, "r2": 0.31, "val_loss": 0.8, "val_mae": 45.0, "val_r2": 0.42,
               "accuracy": None, "val_accuracy": None, "examples_per_sec": 900.0}]
    with capture_stdout() as out:
        show(epochs_table(epochs))
    header = out.getvalue().splitlines()[0].split()
    assert {"MAE", "R2", "VAL", "EPOCH"} <= set(header) and "ACCURACY" not in header, header
    assert "val r2 0.4200" in epoch_line(epochs[0], 10) and "acc" not in epoch_line(epochs[0], 10)


@contextlib.contextmanager
def capture_stdout() -> Iterator[io.StringIO]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        yield buf


def test_server_sent_events_are_parsed_with_ids_comments_and_multiline_data():
    from trainjobs.client.api import StreamEvent, parse_sse

    raw = [": ping", "", "event: log", "id: 7", 'data: {"line":', 'data: "a"}', "", "event: end",
           'data: {"status": "SUCCEEDED"}', ""]
    assert list(parse_sse(iter(raw))) == [StreamEvent("log", {"line": "a"}, "7"),
                                          StreamEvent("end", {"status": "SUCCEEDED"}, "7")]


def test_json_log_lines_name_the_job_from_the_message_arguments():
    import logging
    import uuid

    from trainjobs.client.log_format import JsonFormatter

    job = uuid.uuid4()
    record = logging.LogRecord("trainjobs.worker", logging.INFO, __file__, 1, "job %s: %s -> %s", (job, "A", "B"), None)
    line = json.loads(JsonFormatter().format(record))
    assert line["job_id"] == str(job) and line["message"] == f"job {job}: A -> B" and line["level"] == "info"
    other = logging.LogRecord("trainjobs.worker", logging.INFO, __file__, 1, "worker %s stopped", ("w1",), None)
    assert "job_id" not in json.loads(JsonFormatter().format(other))


def test_list_is_a_table_with_headers(stack, tmp_path):
    env, _ = stack
    job_id = cli("submit", str(write_spec(tmp_path / "job.yaml")), env=env).stdout.split()[0]
    header, row = cli("list", "--status", "queued", "--status", "Staging", "--status", "PROVISIONING",
                      "--status", "running", "--status", "succeeded", env=env).stdout.splitlines()[:2]
    assert header.split() == ["ID", "NAME", "STATUS", "ACCELERATOR", "PROGRESS", "AGE", "VAL", "METRIC"]
    assert row.split()[:2] == [job_id, "cli"] and "cpu x1" in row


def test_an_unknown_field_is_answered_with_the_closest_valid_one(stack, tmp_path):
    env, _ = stack
    r = cli("submit", str(write_spec(tmp_path / "job.yaml", trainig={"epochs": 1})), env=env, check=False)
    assert r.returncode == 1 and "trainig: Extra inputs are not permitted; did you mean 'training'?" in r.stderr


def test_log_lines_about_a_job_carry_its_id_in_json(stack, tmp_path):
    env, _ = stack
    job_id = cli("submit", str(write_spec(tmp_path / "job.yaml")), "--follow", env=env).stdout.split()[0]
    lines = [json.loads(line) for line in (tmp_path / "up.log").read_text().splitlines()]  # every line is JSON
    about_job = [line for line in lines if job_id in line["message"]]
    assert about_job and all(line["job_id"] == job_id for line in about_job)


def test_a_refused_connection_names_the_url_and_suggests_up(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, "TRAINJOBS_HOME": str(tmp_path), "TRAINJOBS_API_URL": url}
    r = cli("list", env=env, check=False)
    assert r.returncode == 1 and url in r.stderr and "trainjobs up" in r.stderr and "Traceback" not in r.stderr


def test_help_shows_defaults_and_choices_and_usage_errors_exit_2(tmp_path):
    env = {**os.environ, "TRAINJOBS_HOME": str(tmp_path)}
    help_text = cli("list", "--help", env=env).stdout
    assert "default: 50" in help_text and "succeeded" in help_text.lower() and "--output" in help_text
    assert cli("list", "--status", "DONE", env=env, check=False).returncode == 2


def stack_processes(data_dir: Path) -> dict[str, int]:
    record = json.loads((data_dir / "stack.json").read_text())
    pg = int((data_dir / "postgres" / "postmaster.pid").read_text().split()[0])
    return {"up": record["up"]["pid"], "emulator": record["emulator"]["pid"], "postgres": pg}


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def own_stack_env(tmp_path: Path) -> dict[str, str]:
    """No database or storage configured: `up` starts its embedded PostgreSQL and GCS emulator."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRAINJOBS_DATABASE_URL", "STORAGE_EMULATOR_HOST", "TRAINJOBS_BUCKET")}
    return {**env, "TRAINJOBS_HOME": str(tmp_path / "home")}


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A data dir for an embedded PostgreSQL (see tests/support/tmp.py::outside_pytest_tmp). Whatever a
    failed test left running there is stopped first: an `up` outlives its test otherwise."""
    path = outside_pytest_tmp("up")
    yield path
    subprocess.run([sys.executable, "-m", "stack.cli", "down", "--data-dir", str(path), "--wait", "10"],
                   capture_output=True, timeout=scaled(120))
    shutil.rmtree(path, ignore_errors=True)


def test_up_stops_its_embedded_postgres_and_emulator_when_it_stops(tmp_path, data_dir):
    proc, _ = start_up(own_stack_env(tmp_path), data_dir, tmp_path / "up.log")
    started = stack_processes(data_dir)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(scaled(60)) == 0, (tmp_path / "up.log").read_text()
    assert not any(alive(pid) for pid in started.values()), started
    assert not (data_dir / "stack.json").exists()


def kill_with_its_lifeline(proc: subprocess.Popen[bytes], data_dir: Path) -> None:
    """SIGKILL `up` and the lifeline that would end its stack (stack/lifeline.py): what a later `down` or
    `up` must end by itself."""
    [lifeline] = [int(p) for p in os.listdir("/proc") if p.isdigit() and alive(int(p))
                  and f"stack.lifeline\0--data-dir\0{data_dir}\0".encode() in _cmdline(int(p))]
    os.kill(lifeline, signal.SIGKILL)
    proc.kill()
    proc.wait()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_a_killed_up_s_lifeline_ends_its_postgres_and_emulator(tmp_path, data_dir):
    proc, _ = start_up(own_stack_env(tmp_path), data_dir, tmp_path / "up.log")
    started = stack_processes(data_dir)
    proc.kill()
    proc.wait()
    eventually(lambda: not any(alive(pid) for pid in started.values()) and not (data_dir / "stack.json").exists(),
               60, f"all of {started} ended and stack.json went")


def test_down_stops_a_stack_whose_up_was_killed(tmp_path, data_dir):
    env = own_stack_env(tmp_path)
    proc, _ = start_up(env, data_dir, tmp_path / "up.log")
    started = stack_processes(data_dir)
    kill_with_its_lifeline(proc, data_dir)
    assert alive(started["postgres"]) and alive(started["emulator"])  # what a crash leaves behind
    r = cli("down", "--data-dir", str(data_dir), env=env)
    assert "embedded PostgreSQL" in r.stdout and "GCS emulator" in r.stdout
    assert not any(alive(pid) for pid in started.values())
    assert "nothing of trainjobs was running" in cli("down", "--data-dir", str(data_dir), env=env).stdout


def test_down_leaves_alone_a_process_whose_pid_an_older_stack_json_names_and_makes_no_data_dir(tmp_path):
    # A stack.json from before start times were recorded, left by a crash: its pids may be anyone's by now.
    env = own_stack_env(tmp_path)
    stranger = subprocess.Popen(["sleep", "600"])
    try:
        data_dir = tmp_path / "data"
        data_dir.mkdir()
        (data_dir / "stack.json").write_text(json.dumps({"pid": stranger.pid, "api_url": "http://127.0.0.1:1",
                                                         "emulator_pid": stranger.pid, "postgres": None}))
        r = cli("down", "--data-dir", str(data_dir), "--wait", "1", env=env)
        assert "nothing of trainjobs was running" in r.stdout, r.stdout
        assert stranger.poll() is None, "down signalled a process that is not trainjobs'"
        assert not (data_dir / "stack.json").exists()
    finally:
        stranger.kill()
        stranger.wait()
    typo = tmp_path / "no-such-dir"
    assert "nothing of trainjobs was running" in cli("down", "--data-dir", str(typo), env=env).stdout
    assert not typo.exists()


def test_up_after_a_crashed_up_stops_the_postgres_that_one_left(tmp_path, data_dir):
    env = own_stack_env(tmp_path)
    crashed, _ = start_up(env, data_dir, tmp_path / "crashed.log")
    left = stack_processes(data_dir)
    kill_with_its_lifeline(crashed, data_dir)
    proc, _ = start_up(env, data_dir, tmp_path / "up.log")
    started = stack_processes(data_dir)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(scaled(60)) == 0, (tmp_path / "up.log").read_text()
    assert not any(alive(pid) for pid in (*left.values(), *started.values()))


def test_up_on_an_operator_s_database_stops_the_postgres_a_crashed_up_left(tmp_path, data_dir, db, database_url):
    # The crashed `up`'s own server, which this one, given TRAINJOBS_DATABASE_URL, will not use: nothing
    # would stop it otherwise (this `up` owns none, and its stack.json names none).
    env = own_stack_env(tmp_path)
    crashed, _ = start_up(env, data_dir, tmp_path / "crashed.log")
    left = stack_processes(data_dir)
    kill_with_its_lifeline(crashed, data_dir)
    proc, _ = start_up({**env, "TRAINJOBS_DATABASE_URL": database_url}, data_dir, tmp_path / "up.log")
    try:
        assert not any(alive(pid) for pid in left.values()), left
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(scaled(60)) == 0, (tmp_path / "up.log").read_text()


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
    def running() -> bool:
        assert proc.poll() is None, log.read_text()
        return bool(api.get(f"/v1/jobs/{job_id}").json()["status"] == "RUNNING")

    eventually(running, 30, "the worker runs the job", every=0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(scaled(15)) == 0, log.read_text()
    with transaction(db) as s:
        job = s.get(Job, uuid.UUID(job_id))
        expired = s.execute(text("SELECT lease_expires_at < now() FROM jobs WHERE id = :id"),
                            {"id": job.id}).scalar()
    assert job.status.value == "RUNNING" and expired  # still running, and any worker may take it over now


def test_api_workers_runs_that_many_server_processes_on_one_port(db, database_url, tmp_path):
    import httpx

    from tests.support.jobs import make_key

    key = make_key(db, "alpha")
    port = free_port()
    env = {**os.environ, "TRAINJOBS_DATABASE_URL": database_url, "TRAINJOBS_HOME": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "stack.cli", "api", "--port", str(port), "--workers", "2"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def answered() -> httpx.Response | None:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.get(f"http://127.0.0.1:{port}/v1/jobs", headers={"Authorization": f"Bearer {key}"})
                if r.status_code == 200:
                    return r
            return None

        r = eventually(answered, 60, "the API answers on its port", every=0.2)
        assert r.json()["jobs"] == []

        def children() -> list[int]:
            found = []
            for stat in Path("/proc").glob("[0-9]*/stat"):
                with contextlib.suppress(OSError):
                    if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == proc.pid:
                        found.append(int(stat.parent.name))
            return found

        # uvicorn's supervisor starts the servers (and multiprocessing may add a resource tracker).
        servers = [pid for pid in children() if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(servers) == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(scaled(30)) == 0


class AnswerLostOnce:
    """A proxy in front of the API that passes the first POST /v1/jobs on and drops the connection
    instead of answering it, as a network can after the API made the job; later requests go through."""

    def __init__(self, api_url: str) -> None:
        import http.server
        import threading

        import httpx

        self.keys: list[str | None] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type",
                                                                                   "idempotency-key")}
                proxy.keys.append(self.headers.get("Idempotency-Key"))
                answer = httpx.post(f"{api_url}{self.path}", content=body, headers=headers)
                if len(proxy.keys) == 1:
                    self.close_connection = True  # made the job, lost the answer
                    return
                self.send_response(answer.status_code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            def log_message(self, *args: object) -> None:
                pass

        proxy = self
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


def test_submit_retries_a_lost_answer_with_the_same_idempotency_key_and_makes_one_job(api, api_url, tmp_path,
                                                                                      monkeypatch):
    from click.testing import CliRunner

    from stack.cli import main

    proxy = AnswerLostOnce(api_url)
    try:
        monkeypatch.setenv("TRAINJOBS_API_URL", proxy.url)
        monkeypatch.setenv("TRAINJOBS_API_KEY", api.headers["authorization"].split()[1])
        result = CliRunner().invoke(main, ["submit", str(write_spec(tmp_path / "job.yaml"))])
    finally:
        proxy.server.shutdown()

    assert result.exit_code == 0, result.output
    [job] = api.get("/v1/jobs").json()["jobs"]
    assert result.output.split()[0] == job["id"]
    assert len(proxy.keys) == 2 and proxy.keys[0] is not None and proxy.keys[0] == proxy.keys[1]


def test_status_compares_the_exported_models_in_a_table_not_a_dump():
    """metrics.optimization (agent/optimization.py: summary; a real job's: tests/e2e/test_dashboard.py)."""
    from trainjobs.client.terminal import job_detail, show

    rows = [{"name": "saved_model", "format": "saved_model", "quantization": "none", "accuracy": 0.9861,
             "bytes": 367315, "gzip_bytes": 98498, "params": 35914, "sparsity": 0.782, "latency_ms_1": 0.6628,
             "latency_ms_32": 1.1132},
            {"name": "tflite_int8", "format": "tflite", "quantization": "int8", "accuracy": 0.9833, "bytes": 45000,
             "gzip_bytes": 14000, "params": 35914, "sparsity": 0.782, "latency_ms_1": 0.0262, "latency_ms_32": 0.1267}]
    job = {"id": "j3", "name": "m", "status": "SUCCEEDED", "attempt": 1, "spec": {}, "progress": 1.0,
           "created_at": "2026-01-01T00:00:00+00:00", "metrics": {"val_accuracy": 0.98, "optimization": rows}}
    with capture_stdout() as out:
        show(job_detail(job))
    text = out.getvalue()
    assert "'name'" not in text and "val_accuracy 0.98" in text, text
    header = next(line for line in text.splitlines() if "MODEL" in line)
    assert header.split()[1:] == ["MODEL", "QUANT", "ACCURACY", "SIZE", "GZIP", "PARAMS", "SPARSITY", "1", "EX", "32", "EX"]
    int8 = next(line for line in text.splitlines() if "tflite_int8" in line).split()
    assert int8 == ["tflite_int8", "int8", "0.9833", "43.9", "KiB", "13.7", "KiB", "35914", "78.2%", "0.0262", "ms",
                    "0.127", "ms"], text
    assert "358.7 KiB" in text and "0.663 ms" in text, text


BREAKDOWN = {"compile_seconds": 3.807, "input_wait_seconds": 0.047, "host_seconds": 1.305, "device_seconds": 0.648,
             "pause_seconds": 0.172, "validation_seconds": 3.668, "train_seconds": 5.807, "device_ms_per_step": 7.366,
             "host_ms_per_step": 14.83, "input_wait_ms_per_step": 0.532}


@pytest.mark.parametrize(("profile", "shown"), [
    ({"epoch": 2, "steps": 22, "seconds": 0.446, "overhead_seconds": 0.138,
      "files": ["plugins/profile/2026_12_06_15_18_38/vm.xplane.pb"]},
     "epoch 2, 22 steps in 0.446 s (overhead 0.138 s): tensorboard/plugins/profile/2026_12_06_15_18_38/vm.xplane.pb"),
    ({"epoch": 3, "steps": 20, "error": "not traced: training ended before epoch 3"},
     "epoch 3, 20 steps: not traced: training ended before epoch 3"),
], ids=["traced", "not traced"])
def test_status_shows_the_step_time_breakdown_as_a_table_and_the_profile_in_a_line(profile, shown):
    """metrics.step_time_breakdown and metrics.profile (agent/step_time.py, agent/profiling.py; a real job's:
    tests/e2e/test_agent.py)."""
    from trainjobs.client.terminal import job_detail, show

    job = {"id": "j4", "name": "p", "status": "SUCCEEDED", "attempt": 1, "spec": {}, "progress": 1.0,
           "created_at": "2026-01-01T00:00:00+00:00",
           "metrics": {"val_accuracy": 0.98, "step_time_breakdown": BREAKDOWN, "profile": profile}}
    with capture_stdout() as out:
        show(job_detail(job))
    text = out.getvalue()
    assert "'compile_seconds'" not in text and "'epoch'" not in text and "val_accuracy 0.98" in text, text
    parts = {part: next(line.split()[-3:] for line in text.splitlines() if f" {part} " in line)
             for part in ("compile", "input wait", "host", "device")}
    assert parts == {"compile": ["3.807", "-", "66%"], "input wait": ["0.047", "0.532", "1%"],
                     "host": ["1.305", "14.8", "22%"], "device": ["0.648", "7.37", "11%"]}, text
    assert "= training      5.807" in text and "+ validation    3.668" in text, text
    assert f"profile      {shown}" in text, text


def test_status_shows_no_step_time_for_a_job_without_one():
    from trainjobs.client.terminal import job_detail, show

    job = {"id": "j5", "name": "q", "status": "RUNNING", "attempt": 1, "spec": {}, "progress": 0.5,
           "created_at": "2026-01-01T00:00:00+00:00", "metrics": {"loss": 0.25}}
    with capture_stdout() as out:
        show(job_detail(job))
    assert "step time" not in out.getvalue() and "profile" not in out.getvalue(), out.getvalue()
