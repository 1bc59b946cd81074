"""What the control plane does the same way on both Google clouds, Cloud TPU and Compute Engine: one
test per behaviour, parametrised over the clouds (tests/support/gcp.py: CLOUDS). Each cloud's own
behaviour: test_gcp_tpu_jobs.py, test_gcp_gpu_jobs.py; jobs that train, the whole way:
tests/e2e/test_gcp_jobs.py."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.gcp import CLOUDS, Cloud
from tests.support.jobs import TERMINAL_STATUSES as TERMINAL
from tests.support.jobs import wait_for_job
from trainjobs.spec import JobSpec
from worker.gcs_channel import GcsJobChannel
from worker.ports import MachineRequest
from worker.reaper import reap_orphans

clouds = pytest.mark.parametrize("cloud", CLOUDS.values(), ids=CLOUDS.keys())


def creates(fake: Any) -> list[Any]:
    """The create requests the fake received (a node's or an instance's)."""
    return [r for r in fake.requests if r.method == "POST" and r.path.endswith(("/nodes", "/instances"))]


@clouds
def test_a_quota_refusal_fails_the_job_with_the_clouds_message(cloud: Cloud, request: pytest.FixtureRequest, api: Any,
                                                               database_url: str, tmp_path: Path) -> None:
    gcp = request.getfixturevalue(cloud.stack)()
    cloud.refuse_quota(gcp.fake)
    gcp.start_worker(database_url, tmp_path / "staging")
    job = api.post("/v1/jobs", json=cloud.spec()).json()
    done = wait_for_job(api, job["id"], TERMINAL)
    assert done["status"] == "FAILED"
    assert done["error"].startswith(cloud.quota_error), done["error"]
    assert len(creates(gcp.fake)) == 1  # a refusal is final: not asked again, nor in another zone
    assert cloud.machines(gcp.fake) == []


@clouds
def test_the_reaper_deletes_machines_of_ended_and_unknown_jobs_only(cloud: Cloud, request: pytest.FixtureRequest,
                                                                    api: Any, db: Any) -> None:
    gcp = request.getfixturevalue(cloud.stack)()
    live = api.post("/v1/jobs", json=cloud.spec()).json()
    ended = api.post("/v1/jobs", json=cloud.spec()).json()
    api.post(f"/v1/jobs/{ended['id']}/cancel")
    spec = JobSpec.model_validate(live["spec"])
    for job_id in (live["id"], ended["id"], str(uuid.uuid4())):
        gcp.provisioner.create(MachineRequest(job_id, 1, spec, GcsJobChannel().job_dir(job_id)))
    assert reap_orphans(gcp.provisioner, db) == 2
    assert cloud.machines(gcp.fake) == cloud.names_of(MachineRequest(live["id"], 1, spec, "").name)
