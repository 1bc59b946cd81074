"""A program job's agent without the control plane (tests/support/agent.py starts `python -m agent` as
the local provisioner does): killed, or stopped with SIGTERM as a preemption does, a program that uses
the runtime's callbacks goes on in the next attempt from the checkpoint it saved, and the epoch count
continues instead of starting over. Through the whole product: tests/e2e/test_programs.py."""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from agent.checkpoint_sync import read_committed
from tests.support.agent import make_job, read, run_agent, start_agent, wait_for
from trainjobs import storage
from trainjobs.job_paths import JobPaths

pytestmark = pytest.mark.tf

PROGRAM = Path(__file__).resolve().parents[1] / "programs" / "long_fit.py"
EPOCHS = 6


def _job(bucket: str, job_id: str, attempt: int) -> str:
    # Batch 16, four steps per call: 28 calls an epoch. The first attempt pauses after epoch 2 until it
    # is stopped; a SIGTERM then saves at the next step, in epoch 3.
    spec = {"name": "long", "accelerator": {"type": "cpu", "replicas": 2}, "strategy": "mirrored",
            "steps_per_execution": 4,
            # Only the first attempt pauses: a second that resumed before epoch 2 would wait out the pause.
            "program": {"source": str(PROGRAM), "env": {"PAUSE_AFTER_EPOCH": "2"} if attempt == 1 else {}},
            "training": {"epochs": EPOCHS, "global_batch_size": 16}}
    return make_job(bucket, spec, "", attempt=attempt, job_id=job_id)


def _backup(job_dir: str) -> dict[str, Any] | None:
    """The runtime's BackupAndRestore metadata in the last whole checkpoint set uploaded (agent/checkpoint_sync.py)."""
    data = read_committed(JobPaths(job_dir).checkpoints, "training_metadata.json")
    return None if data is None else dict(json.loads(data))


def _epochs_in_metrics(job_dir: str) -> list[int]:
    doc = read(JobPaths(job_dir).metrics) or {}
    return [e["epoch"] for e in doc.get("history", [])]


@pytest.mark.parametrize("how", ["killed", "sigterm"])
def test_a_stopped_program_resumes_from_its_checkpoint_and_counts_on(bucket: str, how: str) -> None:
    job_id = str(uuid.uuid4())
    job_dir = _job(bucket, job_id, attempt=1)
    checkpoints = f"{JobPaths(job_dir).checkpoints}/"

    first = start_agent(job_dir, TRAINJOBS_TERM_GRACE_S="60")
    try:
        # Two epochs in the job's metrics and their checkpoint in storage: the program is paused there.
        # The backup taken at the end of epoch 2 (Keras records the epoch to resume at), not epoch 1's: the sync
        # that uploads it may come after the metrics say epoch 2 ended.
        wait_for(lambda: _epochs_in_metrics(job_dir) == [1, 2] and (_backup(job_dir) or {}).get("epoch") == 2, first)
        if how == "killed":
            first.kill()  # nothing gets to clean up, as when a VM vanishes
        else:
            first.send_signal(signal.SIGTERM)  # a preemption notice: save at the next step, then stop
        out = first.communicate(timeout=120)[0].decode(errors="replace")
    finally:
        if first.poll() is None:
            first.kill()
    status = read(JobPaths(job_dir).status)
    done_before = _epochs_in_metrics(job_dir)
    if how == "sigterm":
        assert first.returncode == 143, out[-3000:]
        assert status["state"] == "terminated", status
        assert "asking the program to checkpoint and stop" in out
        # Saved at the next step after the signal: in epoch 3, one call of four steps in.
        saved = _backup(job_dir)
        assert saved == {"epoch": 2, "batch": 3}, (saved, "\n".join(l for l in out.splitlines() if "I0000" not in l)[-3000:])
    else:
        assert status["state"] == "running"  # it never got to say otherwise
    assert storage.list_uris(checkpoints)

    _job(bucket, job_id, attempt=2)
    rc, out = run_agent(job_dir)
    assert rc == 0, out[-5000:]
    status = read(JobPaths(job_dir).status)
    assert (status["state"], status["attempt"]) == ("succeeded", 2), status
    resumed_at = status["runtime"]["initial_epoch"]
    assert done_before == [1, 2] and resumed_at == 2, (resumed_at, done_before)
    assert status["runtime"]["restored_checkpoint"] is True
    history = read(JobPaths(job_dir).metrics)["history"]
    assert [e["epoch"] for e in history] == list(range(1, EPOCHS + 1))
    assert {e["attempt"] for e in history if e["epoch"] > resumed_at} == {2}
    assert f"epochs run by this attempt: {EPOCHS - resumed_at}" in storage.blob(
        JobPaths(job_dir).log(2, 0)).download_as_bytes().decode()
    assert read(JobPaths(job_dir).artifact_manifest)
