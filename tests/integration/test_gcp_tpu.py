"""The Cloud TPU provisioner, through the real google-cloud-tpu client, against the fake TPU API.

What the client sent is read back from the fake's request log, so these assert the requests Google
would get, not what our code meant to send.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stack.fakecloud import FakeTpuApi
from stack.fakecloud.tpu_inventory import Timing
from tests.support import eventually, scaled
from trainjobs.job_paths import JobPaths
from trainjobs.spec import JobSpec
from trainjobs.vm_metadata import (
    JOB_DIR_KEY, LABEL_ATTEMPT, LABEL_JOB, LABEL_MANAGED, NODE_NAME_KEY, STARTUP_SCRIPT_KEY, TPU_API_KEY)
from worker.gcp.config import GcpConfig
from worker.gcp.errors import MachineRefused
from worker.ports import MachineRequest, MachineState, RateLimited
from worker.gcp.tpu import TpuVmProvisioner

ZONE, FALLBACK = "us-central1-a", "us-central1-b"
SCRIPT = f"#!/bin/bash\nexec python3 -m agent --job-dir {JobPaths.for_job('j', 'b').root}\n"
JOB = "6f1c2a9e-0d4b-4c1e-9a7f-3b2d1e0f9a8c"


FAKE = FakeTpuApi  # the `fake` fixture (tests/conftest.py): its VMs do not boot


def provisioner(fake: FakeTpuApi, **config: object) -> TpuVmProvisioner:
    settings: dict = {"project": "proj", "zone": ZONE, "tpu_api_endpoint": fake.url, **config}
    return TpuVmProvisioner(GcpConfig(**settings), startup=lambda r: SCRIPT, create_wait_s=scaled(30), backoff_s=0.01)


def tpu_request(attempt: int = 1, **accelerator: object) -> MachineRequest:
    spec = JobSpec.model_validate({
        "dataset": {"source": "sklearn:digits"}, "model": {"name": "cnn"}, "labels": {"team": "vision"},
        "accelerator": {"type": "tpu", "tpu_type": "v5litepod-8", "runtime_version": "tpu-vm-tf-2.18.0-pjrt",
                        **accelerator}})
    return MachineRequest(JOB, attempt, spec, JobPaths.for_job(JOB, "bucket").root)


def sent(fake: FakeTpuApi, method: str, collection: str) -> list[dict]:
    return [r.body or {} for r in fake.requests if r.method == method and r.path.endswith(f"/{collection}")]


def wait_state(p: TpuVmProvisioner, request: MachineRequest, state: MachineState | None, timeout: float = 10.0) -> None:
    def reached() -> bool:
        info = p.get(request)
        return info is None and state is None or info is not None and info.state == state

    eventually(reached, timeout, lambda: f"{request.name} is {p.get(request)}, expected {state}")


# --- what is asked for ---------------------------------------------------------------------------

def test_create_sends_the_node_the_spec_and_configuration_ask_for(fake: FakeTpuApi) -> None:
    p = provisioner(fake, network="projects/proj/global/networks/train", subnetwork="regions/us-central1/subnetworks/s",
                    service_account="vm@proj.iam.gserviceaccount.com", tags=("trainjobs", "no-ssh"))
    request = tpu_request(spot=True)
    p.create(request)
    [create] = [r for r in fake.requests if r.method == "POST"]
    assert create.path == f"/v2/projects/proj/locations/{ZONE}/nodes"
    assert create.query["nodeId"] == request.name
    body = create.body or {}
    assert body["acceleratorType"] == "v5litepod-8"
    assert body["runtimeVersion"] == "tpu-vm-tf-2.18.0-pjrt"
    assert body["schedulingConfig"] == {"spot": True}
    assert body["labels"] == {"team": "vision", LABEL_MANAGED: "true", LABEL_JOB: JOB, LABEL_ATTEMPT: "1"}
    assert body["metadata"] == {STARTUP_SCRIPT_KEY: SCRIPT, JOB_DIR_KEY: request.job_dir,
                                NODE_NAME_KEY: f"projects/proj/locations/{ZONE}/nodes/{request.name}",
                                TPU_API_KEY: fake.url}
    assert body["networkConfig"] == {"network": "projects/proj/global/networks/train",
                                     "subnetwork": "regions/us-central1/subnetworks/s", "enableExternalIps": True}
    assert body["serviceAccount"] == {"email": "vm@proj.iam.gserviceaccount.com",
                                      "scope": ["https://www.googleapis.com/auth/cloud-platform"]}
    assert body["tags"] == ["trainjobs", "no-ssh"]


def test_on_demand_node_asks_for_no_spot(fake: FakeTpuApi) -> None:
    provisioner(fake).create(tpu_request())
    [body] = sent(fake, "POST", "nodes")
    assert body.get("schedulingConfig", {}).get("spot", False) is False


def test_topology_is_sent_as_an_accelerator_config(fake: FakeTpuApi) -> None:
    provisioner(fake).create(tpu_request(tpu_type="v4-32", topology="2x2x4", runtime_version="tpu-vm-tf-2.18.0-pod-pjrt"))
    [body] = sent(fake, "POST", "nodes")
    assert "acceleratorType" not in body
    assert body["acceleratorConfig"]["topology"] == "2x2x4"


# --- walks ---------------------------------------------------------------------------------------

def test_a_created_node_becomes_ready_and_delete_leaves_nothing(fake: FakeTpuApi) -> None:
    p, request = provisioner(fake), tpu_request()
    assert p.create(request).state == MachineState.READY
    p.delete(request.name)
    assert p.get(request) is None
    assert fake.node_names() == []


def test_a_node_deleted_while_creating_is_gone_and_never_boots(tmp_path: Path) -> None:
    with FakeTpuApi(sandbox=tmp_path, timing=Timing(boot_s=scaled(60), delete_s=0.1)) as fake:
        p = provisioner(fake)
        p.create_wait_s = 0  # hand the create operation to get(), as a long TPU boot would
        request = tpu_request()
        assert p.create(request).state == MachineState.CREATING
        p.delete(request.name)
        assert p.get(request) is None and fake.node_names() == []
        assert not (tmp_path / request.name).exists()  # the startup script never ran


def test_a_preempted_node_reports_preempted_until_deleted(fake: FakeTpuApi) -> None:
    p, request = provisioner(fake), tpu_request(spot=True)
    p.create(request)
    fake.preempt(request.name)
    assert p.get(request).state == MachineState.PREEMPTED  # type: ignore[union-attr]
    p.delete(request.name)
    assert fake.node_names() == []


def test_a_new_worker_finds_the_node_by_label_and_does_not_create_it_twice(fake: FakeTpuApi) -> None:
    request = tpu_request()
    provisioner(fake).create(request)  # this worker dies before recording anything
    successor = provisioner(fake)
    [found] = successor.list({LABEL_JOB: JOB})
    assert found.name == request.name and found.state == MachineState.READY
    assert successor.create(request).name == request.name
    assert len(sent(fake, "POST", "nodes")) == 1


# --- errors --------------------------------------------------------------------------------------

QUOTA = f"Quota limit 'TPUS-per-project-per-zone' has been exceeded. Limit: 4 in zone {ZONE}. Requested: 8, in use: 0."


@pytest.mark.parametrize("inject, message", [
    (None, QUOTA),
    ((403, "PERMISSION_DENIED", "Permission 'tpu.nodes.create' denied on 'projects/proj/locations/us-central1-a'"),
     "Permission 'tpu.nodes.create' denied on 'projects/proj/locations/us-central1-a'"),
    ((400, "INVALID_ARGUMENT", "Runtime version tpu-vm-tf-2.18.0-pjrt is not supported for v5litepod-8"),
     "Runtime version tpu-vm-tf-2.18.0-pjrt is not supported for v5litepod-8"),
], ids=["quota", "permission", "invalid-argument"])
def test_a_refusal_raises_the_clouds_own_message_at_once(fake: FakeTpuApi, inject: tuple | None, message: str) -> None:
    fake.set_quota(ZONE, 4)
    if inject:
        fake.set_quota(ZONE, 1000)
        fake.fail_next("POST", "/nodes", *inject)
    with pytest.raises(MachineRefused) as refused:
        provisioner(fake).create(tpu_request())
    assert str(refused.value) == message
    assert len(sent(fake, "POST", "nodes")) == 1  # not retried


def test_rate_limits_and_server_errors_are_retried(fake: FakeTpuApi) -> None:
    fake.fail_next("POST", "/nodes", 429, "RESOURCE_EXHAUSTED", "Quota exceeded for quota metric 'Create requests' "
                   "and limit 'Create requests per minute'", reason="RATE_LIMIT_EXCEEDED")
    fake.fail_next("POST", "/nodes", 503, "UNAVAILABLE", "The service is currently unavailable.")
    fake.fail_next("GET", "/nodes/", 500, "INTERNAL", "Internal error.")
    assert provisioner(fake).create(tpu_request()).state == MachineState.READY
    assert len(sent(fake, "POST", "nodes")) == 3


def test_a_stockout_in_the_first_zone_creates_in_the_fallback_zone(fake: FakeTpuApi) -> None:
    fake.stock_out(ZONE)
    p, request = provisioner(fake, fallback_zones=(FALLBACK,)), tpu_request()
    assert p.create(request).state == MachineState.READY
    node = fake.node(request.name) or {}
    assert node["name"] == f"projects/proj/locations/{FALLBACK}/nodes/{request.name}"
    assert node["metadata"][NODE_NAME_KEY] == node["name"]  # what the VM's watchdog deletes


def test_with_every_zone_stocked_out_the_node_is_queued_until_capacity_returns(fake: FakeTpuApi) -> None:
    fake.stock_out(ZONE)
    p, request = provisioner(fake, capacity_wait_s=1800.0), tpu_request(spot=True)
    assert p.create(request).state == MachineState.CREATING
    [queued] = sent(fake, "POST", "queuedResources")
    assert queued["queueingPolicy"] == {"validUntilDuration": "1800s"}
    assert queued["spot"] == {}
    [spec] = queued["tpu"]["nodeSpec"]
    assert spec["nodeId"] == request.name and spec["parent"] == f"projects/proj/locations/{ZONE}"
    assert spec["node"]["acceleratorType"] == "v5litepod-8" and "schedulingConfig" not in spec["node"]
    fake.stock_out(ZONE, False)
    wait_state(p, request, MachineState.READY)
    p.delete(request.name)
    assert fake.node_names() == [] and fake.queued_names() == []


def test_a_queued_node_whose_wait_runs_out_says_there_was_no_capacity(fake: FakeTpuApi) -> None:
    fake.stock_out(ZONE)
    p, request = provisioner(fake, capacity_wait_s=1.0), tpu_request()
    p.create(request)
    wait_state(p, request, MachineState.STOPPED)
    assert p.get(request).detail == f"no capacity in {ZONE} for v5litepod-8 after 1 seconds"  # type: ignore[union-attr]


def test_a_gpu_job_is_refused_by_the_tpu_provisioner(fake: FakeTpuApi) -> None:
    spec = JobSpec.model_validate({"dataset": {"source": "sklearn:digits"}, "model": {"name": "cnn"},
                                   "accelerator": {"type": "gpu", "gpu_type": "nvidia-l4"}})
    with pytest.raises(MachineRefused, match="runs TPU jobs, not gpu"):
        provisioner(fake).create(MachineRequest(JOB, 1, spec, JobPaths.for_job("j", "b").root))
    assert fake.requests == []


def test_a_rate_limit_that_outlasts_the_retries_is_not_a_refusal(fake: FakeTpuApi) -> None:
    fake.fail_next("POST", "/nodes", 429, "RESOURCE_EXHAUSTED", "Quota exceeded for quota metric 'Create requests' "
                   "and limit 'Create requests per minute'", reason="RATE_LIMIT_EXCEEDED", times=100)
    with pytest.raises(RateLimited):  # the job waits for the driver's next step, it does not fail
        provisioner(fake).create(tpu_request())
