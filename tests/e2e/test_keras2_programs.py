"""`program.keras: 2` (issue 37): a script written for TensorFlow <= 2.15 runs with tf_keras as `tf.keras`,
and the runtime hands it tf_keras' own strategy set-up, precision policy and callbacks (a Keras 3 callback
in a tf_keras fit is refused). Through the agent as tests/e2e/test_program_runs.py runs it; the same
stop and resume as there, in tf_keras' terms: stopped by a SIGTERM, a program that backs up every N steps
saves at the next step and the next attempt begins at the step after it; one that backs up every epoch
(the default) begins the epoch it was stopped in again, from the backup of the one before (tf_keras reads
any backup taken with save_freq="epoch" as a finished epoch)."""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent import make_job, read, run_agent, start_agent, wait_for
from trainjobs import storage
from trainjobs.job_paths import JobPaths

pytestmark = pytest.mark.tf

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
EPOCHS = 4


def _keras_2_job(bucket: str, job_id: str, attempt: int, every_steps: int | None, strategy: str) -> str:
    # Batch 16 over 1,797 digits: 113 steps an epoch, four a call. The first attempt pauses after epoch 2
    # until it is stopped.
    env = {**({"CHECKPOINT_EVERY_STEPS": str(every_steps)} if every_steps else {}),
           **({"PAUSE_AFTER_EPOCH": "2"} if attempt == 1 else {})}
    spec: dict[str, Any] = {
        "name": "keras-2", "accelerator": {"type": "cpu", "replicas": 2 if strategy == "mirrored" else 1},
        "strategy": strategy,
        "steps_per_execution": 4, "precision": "mixed_bfloat16",
        "program": {"source": str(PROGRAMS / "keras2_fit.py"), "keras": 2, "env": env},
        "training": {"epochs": EPOCHS, "global_batch_size": 16}}
    return make_job(bucket, spec, "", attempt=attempt, job_id=job_id)


def _epochs_in_metrics(job_dir: str) -> list[int]:
    return [e["epoch"] for e in (read(JobPaths(job_dir).metrics) or {}).get("history", [])]


# (backup every N calls, where the second attempt begins): saved after the first call of epoch 3 (its
# steps 0-3), or at the end of epoch 2. On two replicas, and on one device (a strategy tf_keras' own
# BackupAndRestore refuses).
@pytest.mark.parametrize(("every_steps", "resumed_at", "strategy"), [
    (10, "epoch 3, step 4", "mirrored"), (None, "epoch 3, step 0", "one_device")])
def test_a_keras_2_program_trains_with_the_runtime_and_resumes_from_where_it_saved(
        bucket: str, monkeypatch: pytest.MonkeyPatch, every_steps: int | None, resumed_at: str, strategy: str) -> None:
    monkeypatch.setenv("TRAINJOBS_PROGRAM_SYNC_S", "1")
    job_id = str(uuid.uuid4())
    job_dir = _keras_2_job(bucket, job_id, attempt=1, every_steps=every_steps, strategy=strategy)
    paths = JobPaths(job_dir)

    first = start_agent(job_dir, TRAINJOBS_TERM_GRACE_S="60")
    try:
        wait_for(lambda: _epochs_in_metrics(job_dir) == [1, 2], first)
        first.send_signal(signal.SIGTERM)  # a preemption notice: save at the next step, then stop
        out = first.communicate(timeout=120)[0].decode(errors="replace")
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 143, out[-3000:]
    assert read(paths.status)["state"] == "terminated"
    # tf_keras' own checkpoint (a CheckpointManager's files under chief/), uploaded as the program saved it.
    assert any("/chief/" in uri for uri in storage.list_uris(f"{paths.checkpoints}/")), out[-3000:]

    _keras_2_job(bucket, job_id, attempt=2, every_steps=every_steps, strategy=strategy)
    rc, out = run_agent(job_dir)
    assert rc == 0, out[-5000:]
    status = read(paths.status)
    assert (status["state"], status["attempt"], status["runtime"]["initial_epoch"]) == ("succeeded", 2, 2), status
    assert (status["runtime"]["strategy"], status["runtime"]["precision"]) == (strategy, "mixed_bfloat16")
    log = storage.blob(paths.log(2, 0)).download_as_bytes().decode()
    assert f"this attempt began at {resumed_at}" in log, log[-3000:]
    history = read(paths.metrics)["history"]
    assert [e["epoch"] for e in history] == list(range(1, EPOCHS + 1))
    assert [e["attempt"] for e in history] == [1, 1, 2, 2]
    # Keras 2's save: a folder without an extension is a SavedModel; the policy is tf_keras' own.
    manifest = read(paths.artifact_manifest)
    assert "saved_model/saved_model.pb" in json.dumps(manifest), manifest
    used = json.loads(storage.blob(f"{paths.artifacts}/keras.json").download_as_bytes())
    assert used["keras"].startswith("tf_keras") and used["policy"] == "mixed_bfloat16", used
