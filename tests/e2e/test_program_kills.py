"""A program killed twice loses nothing (issue 37): plain Keras with BackupAndRestore, as its documentation
writes it and knowing nothing of trainjobs (tests/programs/backup_and_restore.py), run through the whole
product (API, worker, the local provisioner's machines, the agent). Its agent is killed after epoch 2, and in
the next attempt its own process after epoch 4 (SIGKILL both, as the kernel's out-of-memory killer sends);
each time the backup of the epoch just finished is in storage by then, uploaded because the program wrote it
(the agent's timer alone would take a minute). The job succeeds in its third attempt, within max_retries 2,
and every epoch was trained once: the program's own lines in each attempt's log, and its CSVLogger history,
one row an epoch, in the artifacts. One job answers every assertion. And a program killed because its agent
is being stopped (a delete signals the machine's process group) is still a stop, not a retry."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from agent.checkpoint_sync import read_committed
from tests.support import eventually
from tests.support.agent import make_job, read, start_agent, wait_for
from tests.support.jobs import make_key, module_jobs, wait_for_job
from tests.support.local import AGENT_JOB_S, local_stack_running
from trainjobs import storage
from trainjobs.job_paths import JobPaths
from trainjobs.vm_metadata import LABEL_JOB
from worker.gcs_channel import GcsJobChannel
from worker.local.provisioner import LocalProvisioner

pytestmark = pytest.mark.tf

PROGRAM = Path(__file__).resolve().parents[1] / "programs" / "backup_and_restore.py"
EPOCHS = 8


def _log(paths: JobPaths, attempt: int) -> str:
    try:
        return str(storage.blob(paths.log(attempt, 0)).download_as_bytes().decode(errors="replace"))
    except Exception:  # not uploaded yet
        return ""


def _backed_up_epoch(paths: JobPaths) -> int | None:
    """The epoch the last whole set in storage resumes after."""
    data = read_committed(paths.checkpoints, "backup/training_metadata.json")
    return None if data is None else int(json.loads(data)["epoch"])


def _agent_pid(provisioner: LocalProvisioner, job_id: str, attempt: int) -> int:
    [machine] = [m for m in provisioner.list({LABEL_JOB: job_id}) if m.name.endswith(f"-a{attempt}")]
    record = json.loads((provisioner.root / f"{machine.name}.json").read_text())  # the machine's inventory record
    [pid] = record["pids"]
    return int(pid)


def _kill_when_backed_up(paths: JobPaths, attempt: int, epoch: int, pid: int) -> None:
    eventually(lambda: f"waiting to be killed after epoch {epoch}" in _log(paths, attempt), AGENT_JOB_S,
               lambda: f"attempt {attempt} paused after epoch {epoch}; its log ends:\n{_log(paths, attempt)[-3000:]}")
    eventually(lambda: _backed_up_epoch(paths) == epoch, 30,
               lambda: f"epoch {epoch}'s backup in storage; the last set resumes after {_backed_up_epoch(paths)}")
    os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def killed_twice(database_url: str, api_url: str, gcs_emulator: Any,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with module_jobs(database_url, api_url, "kills") as (client, factory, monkey):
        r = client.post("/v1/modules", files={"file": (PROGRAM.name, PROGRAM.read_bytes())})
        assert r.status_code == 201, r.text
        r = client.post("/v1/jobs", json={
            "name": "killed-twice", "accelerator": {"type": "cpu"}, "limits": {"max_retries": 2},
            "program": {"source": r.json()["module"], "env": {"KILL_AFTER_EPOCHS": "2,4"}}})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        paths = JobPaths(GcsJobChannel().job_dir(job_id))
        with local_stack_running(database_url, tmp_path_factory.mktemp("stack"), slots=1) as provisioner:
            wait_for_job(client, job_id, lambda job: job["attempt"] == 1 and job["status"] == "RUNNING", AGENT_JOB_S)
            _kill_when_backed_up(paths, 1, 2, _agent_pid(provisioner, job_id, 1))  # the agent, and its program with it
            wait_for_job(client, job_id, lambda job: job["attempt"] == 2 and job["status"] == "RUNNING", AGENT_JOB_S)
            program = eventually(lambda: next((p.pid for p in psutil.Process(_agent_pid(provisioner, job_id, 2)).children()
                                               if PROGRAM.name in " ".join(p.cmdline())), None),
                                 AGENT_JOB_S, "attempt 2's program running")
            _kill_when_backed_up(paths, 2, 4, program)  # the program alone: its agent reports it
            job = wait_for_job(client, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, AGENT_JOB_S)
            events = client.get(f"/v1/jobs/{job_id}/events").json()["events"]
            history = client.get(f"/v1/jobs/{job_id}/artifacts/history.csv")
            assert history.status_code == 200, history.text
            yield {"job": job, "events": events, "logs": [_log(paths, a) for a in (1, 2, 3)],
                   "history": list(csv.DictReader(io.StringIO(history.text)))}


def test_the_job_succeeds_in_its_third_attempt_within_max_retries(killed_twice: dict[str, Any]) -> None:
    job = killed_twice["job"]
    assert (job["status"], job["attempt"]) == ("SUCCEEDED", 3), job.get("error")
    reasons = [e["reason"] for e in killed_twice["events"] if e["to_status"] == "RECOVERING"]
    assert len(reasons) == 2, reasons
    assert "before the agent finished" in reasons[0]  # the killed agent: its machine gone
    # The killed program: the user reads why the attempt was retried.
    assert reasons[1].startswith("attempt 2 failed: the program was killed by signal 9 (SIGKILL: often the kernel's "
                                 "out-of-memory killer"), reasons[1]


def test_each_epoch_was_trained_exactly_once_across_the_three_attempts(killed_twice: dict[str, Any]) -> None:
    # The program's own lines as the agent logged them (its last output is also in the failed attempt's error).
    said = [re.findall(r"trainjobs\.program: (training|trained) epoch (\d+)$", log, re.M) for log in killed_twice["logs"]]
    begun = {a: [int(n) for what, n in lines if what == "training"] for a, lines in enumerate(said, start=1)}
    ended = {a: [int(n) for what, n in lines if what == "trained"] for a, lines in enumerate(said, start=1)}
    assert begun == ended == {1: [1, 2], 2: [3, 4], 3: [5, 6, 7, 8]}, (begun, ended)
    # The program's own history, restored with its backup each time: one row per epoch, in order.
    rows = killed_twice["history"]
    assert [int(r["epoch"]) for r in rows] == list(range(EPOCHS)), rows
    # Each attempt went on from the weights the last one saved: epoch 3's loss is not epoch 1's again.
    losses = [float(r["loss"]) for r in rows]
    assert losses[2] < losses[1] < losses[0] and losses[4] < losses[3], losses


SLEEPER = """
import time
print("sleeping", flush=True)
time.sleep(600)
"""


def test_a_program_killed_as_its_agent_is_stopped_is_a_stop_not_a_retry(bucket: str, tmp_path: Path) -> None:
    program = tmp_path / "sleeper.py"
    program.write_text(SLEEPER)
    job_dir = make_job(bucket, {"name": "stopped", "accelerator": {"type": "cpu"}, "program": {"source": str(program)}}, "")
    agent = start_agent(job_dir)
    try:
        wait_for(lambda: (read(JobPaths(job_dir).status) or {}).get("phase") == "training"
                 and psutil.Process(agent.pid).children(), agent)
        [child] = psutil.Process(agent.pid).children()
        # As a provisioner's delete signals the process group: the program dies of it at once (it has no
        # handler), its agent stops.
        os.kill(child.pid, signal.SIGTERM)
        agent.send_signal(signal.SIGTERM)
        out = agent.communicate(timeout=120)[0].decode(errors="replace")
    finally:
        if agent.poll() is None:
            agent.kill()
    status = read(JobPaths(job_dir).status)
    assert (agent.returncode, status["state"], status["error"]) == (143, "terminated", None), out[-3000:]
