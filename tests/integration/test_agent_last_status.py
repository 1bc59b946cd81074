"""The agent's last resort (agent/__main__.py `_exit_now`): when the cleanup after SIGTERM outlives its
grace (the main thread stuck in a TensorFlow call, say), the grace timer writes the terminal status
itself, so the job's record says terminated and why instead of running. Against the GCS emulator."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest

from agent.job import AgentJob
from agent.status import StatusReporter, _TailHandler
from trainjobs import storage
from trainjobs.job_paths import JobPaths
from trainjobs.messages import AgentState
from trainjobs.spec import JobSpec


def _reporter(bucket: str, tmp_path: Path) -> StatusReporter:
    job_id = str(uuid.uuid4())
    spec = JobSpec.model_validate({"program": {"source": "train.py"}})
    job = AgentJob(job_id, 1, spec, "", JobPaths.for_job(job_id, bucket).root, 0)
    tail = _TailHandler(10)
    tail.lines.append("the last line the agent logged")
    return StatusReporter(job, tmp_path / "agent.log", tail, heartbeat_s=3600)


def test_the_last_resort_writes_terminated_with_the_reason_once(bucket: str, tmp_path: Path) -> None:
    reporter = _reporter(bucket, tmp_path)
    reporter.set_phase("training")
    reporter.write_last_resort(AgentState.TERMINATED, "stopped: the cleanup did not finish within 30s")
    status = storage.read_json(reporter.job.status_uri)
    assert (status["state"], status["phase"]) == ("terminated", "training")
    assert status["error"]["message"] == "stopped: the cleanup did not finish within 30s"
    assert status["error"]["logs"] == ["the last line the agent logged"]
    # Final: the main thread's own write, arriving late, changes nothing.
    reporter.set_phase("exporting")
    assert storage.read_json(reporter.job.status_uri) == status


def test_the_last_resort_gives_up_on_a_write_held_in_flight(bucket: str, tmp_path: Path) -> None:
    reporter = _reporter(bucket, tmp_path)
    reporter.set_phase("training")
    held, release = threading.Event(), threading.Event()

    def stuck_writer() -> None:
        with reporter._lock:
            held.set()
            release.wait(30)

    thread = threading.Thread(target=stuck_writer)
    thread.start()
    try:
        assert held.wait(30)
        with pytest.raises(TimeoutError):
            reporter.write_last_resort(AgentState.TERMINATED, "stopped", lock_timeout_s=0.2)
    finally:
        release.set()
        thread.join()
    assert storage.read_json(reporter.job.status_uri)["state"] == "running"
