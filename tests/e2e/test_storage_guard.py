"""The local storage guard with real jobs: a job's code cannot overwrite another project's module
through its guard, the agent runs only the bytes that were uploaded, and a job that never reads its
download does not stall another job's storage (issue 18: findings 3 and 6). The attacks are
tests/support/guard_attacks.py, uploaded as the job's model module; the same requests against a guard
of the test's own: tests/integration/test_storage_guard.py."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from tests.support import eventually, guard_attacks
from tests.support.jobs import make_key, wait_for_job
from tests.support.local import AGENT_JOB_S
from tests.support.tenancy import ATTACKS, ORIGINAL, stored
from trainjobs import storage


@pytest.mark.tf
def test_a_jobs_code_cannot_overwrite_another_projects_module_through_its_guard(
        api, api_url, db, bucket, local_stack, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="trainjobs.worker")
    theirs = api.post("/v1/modules", files={"file": ("their_model.py", ORIGINAL)}).json()["module"]
    target = theirs.removeprefix(f"gs://{bucket}/")
    report = tmp_path / "report.json"
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {make_key(db, 'beta')}"}, timeout=30) as beta:
        module = beta.post("/v1/modules", files={"file": ("guard_attacks.py", ATTACKS)}).json()["module"]
        spec = {"dataset": {"source": "sklearn:digits"}, "accelerator": {"type": "cpu"}, "strategy": "default",
                "model": {"module": module, "params": {"target": target, "report": str(report)}},
                "training": {"epochs": 1}}
        job = wait_for_job(beta, beta.post("/v1/jobs", json=spec).json()["id"], {"SUCCEEDED"}, timeout=AGENT_JOB_S)

    assert json.loads(report.read_text()) == {what: 403 for what in guard_attacks.attempts("b", "own", "target")}
    assert stored(bucket, target) == ORIGINAL
    # The guard's log goes with the machine; the refusals reach the worker's, under the job's id.
    reasons = {"the content-type header is given twice", "the content-encoding header is given twice",
               "a query that names a parameter twice", "a multipart upload that is not exactly metadata and media"}
    eventually(lambda: reasons <= _forwarded_reasons(caplog, job["id"]), 30,
               lambda: f"the worker logged {reasons - _forwarded_reasons(caplog, job['id'])}", every=0.2)



def _forwarded_reasons(caplog: pytest.LogCaptureFixture, job_id: str) -> set[str]:
    prefix = f"job {job_id}: storage guard refused "
    return {r.getMessage().rsplit(": ", 1)[-1] for r in list(caplog.records)
            if r.name == "trainjobs.worker" and r.getMessage().startswith(prefix)}



@pytest.mark.tf
def test_an_uploaded_module_changed_in_storage_is_not_run(api, bucket, local_stack, tmp_path):
    ran = tmp_path / "forged-code-ran"
    module = api.post("/v1/modules", files={"file": ("my_model.py", ORIGINAL)}).json()["module"]
    # However it got there (a guard bypass, a wrong ACL), other bytes now lie under the upload's address.
    storage.blob(module).upload_from_string(f"open({str(ran)!r}, 'w').close()\n".encode() + ORIGINAL)
    spec = {"dataset": {"source": "sklearn:digits"}, "model": {"module": module}, "accelerator": {"type": "cpu"},
            "strategy": "default", "training": {"epochs": 1}}

    job = wait_for_job(api, api.post("/v1/jobs", json=spec).json()["id"], {"FAILED"}, timeout=AGENT_JOB_S)

    assert "is not the file that was uploaded" in job["error"]
    assert not ran.exists()



@pytest.mark.tf
def test_a_job_that_never_reads_its_download_does_not_stall_another_jobs_storage(
        api, api_url, db, bucket, local_stack, tmp_path):
    holding, release = tmp_path / "holding", tmp_path / "release"
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {make_key(db, 'beta')}"}, timeout=30) as beta:
        module = beta.post("/v1/modules", files={"file": ("guard_attacks.py", ATTACKS)}).json()["module"]
        params = {"size": 96 << 20, "holding": str(holding), "release": str(release)}
        spec = {"dataset": {"source": "sklearn:digits"}, "accelerator": {"type": "cpu"}, "strategy": "default",
                "model": {"module": module, "function": "hold_a_download", "params": params},
                "training": {"epochs": 1}}
        slow = beta.post("/v1/jobs", json=spec).json()["id"]
        try:
            eventually(holding.exists, 300, lambda: f"the slow job holds its download: {beta.get(f'/v1/jobs/{slow}').json()}",
                       every=0.2)

            other = {"dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp"}, "accelerator": {"type": "cpu"},
                     "strategy": "default", "training": {"epochs": 1}}
            assert wait_for_job(api, api.post("/v1/jobs", json=other).json()["id"], {"SUCCEEDED"}, timeout=240)
        finally:
            release.write_text("")
        wait_for_job(beta, slow, {"SUCCEEDED"}, timeout=AGENT_JOB_S)
