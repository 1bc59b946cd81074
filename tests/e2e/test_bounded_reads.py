"""What a job's code writes is read within a cap, never whole (issue 18, finding 5), judged with a real
job's code: a status.json over its cap fails the job with a note, not an out-of-memory worker. The
API's bounded reads: tests/integration/test_bounded_reads.py."""

from __future__ import annotations

import json

import pytest

from tests.support.jobs import digits_spec
from tests.support.jobs import wait_for_job
from tests.support.local import AGENT_JOB_S
from trainjobs import storage
from trainjobs.job_paths import JobPaths


OVERSIZED_STATUS = '''
import json
import threading
import time
from datetime import datetime, timezone

import keras

from trainjobs import storage
from trainjobs.job_paths import JobPaths


def build_model(input_shape, num_classes, params):
    # The job's own status.json, valid but for its size, written over the agent's for a while.
    with open(params["job_dir_file"]) as f:  # the test wrote it once it knew the job's id
        status = JobPaths(f.read()).status
    junk = {"state": "running", "attempt": 1, "metrics": {"junk": "x" * (2 << 20)}}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        junk["heartbeat_at"] = datetime.now(timezone.utc).isoformat()
        storage.blob(status).upload_from_string(json.dumps(junk))
        time.sleep(0.2)
    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                             keras.layers.Dense(num_classes, activation="softmax")])
'''



@pytest.mark.tf
def test_a_job_that_writes_a_huge_status_fails_with_a_note_not_an_oom(api, bucket, local_stack, tmp_path):
    module = api.post("/v1/modules", files={"file": ("huge_status.py", OVERSIZED_STATUS.encode())}).json()["module"]
    job_dir_file = tmp_path / "job_dir"
    spec = digits_spec(model={"module": module, "params": {"job_dir_file": str(job_dir_file)}},
                       accelerator={"type": "cpu"}, strategy="default")
    job = api.post("/v1/jobs", json=spec).json()
    job_dir_file.write_text(JobPaths.for_job(job["id"]).root)

    failed = wait_for_job(api, job["id"], {"FAILED"}, timeout=AGENT_JOB_S)

    assert "status.json is 2.0 MiB, over the 1.0 MiB trainjobs reads of it" in failed["error"]
    assert len(json.dumps(failed.get("metrics") or {})) < storage.STATUS_MAX_BYTES
