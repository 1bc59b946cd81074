"""The fake Compute Engine API itself, where tests elsewhere rely on it being faithful: what it refuses,
operations that finish over time, each VM's metadata server and startup script, and a VM deleting its
own instance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from stack.fakecloud import FakeComputeApi
from tests.support import eventually, scaled
from trainjobs.job_paths import JobPaths
from trainjobs.spec import JobSpec
from trainjobs.vm_metadata import (
    GUEST_ATTRIBUTES_KEY, HOST_KEY, PUBLIC_KEY_ATTRIBUTE, PUBLIC_KEY_NAMESPACE, PUBLIC_KEY_PATH)
from agent.watchdog import delete_own_instance, delete_own_tpu_node
from worker.gcp.config import GcpConfig
from worker.ports import MachineRequest
from worker.gcp.compute import GceVmProvisioner

ZONE_PATH = "/compute/v1/projects/proj/zones/us-central1-a"
IMAGE = {"boot": True, "initializeParams": {"sourceImage": "projects/p/global/images/i"}}


FAKE, FAKE_BOOTS = FakeComputeApi, True  # the `fake` fixture (tests/conftest.py): its VMs run their startup script


def create(fake: FakeComputeApi, script: str, workers: int = 1) -> str:
    spec = JobSpec.model_validate({"dataset": {"source": "sklearn:digits"}, "model": {"name": "cnn"}, "workers": workers,
                                   "accelerator": {"type": "gpu", "gpu_type": "nvidia-l4"}})
    p = GceVmProvisioner(GcpConfig(project="proj", zone="us-central1-a", compute_api_endpoint=fake.url),
                         startup=lambda r: script, create_wait_s=scaled(30), poll_s=0.02)
    request = MachineRequest("job-1", 1, spec, JobPaths.for_job("job-1", "b").root)
    p.create_wait_s = scaled(30)
    p._clustered.add(request.name)  # no storage here: the cluster file is test_gcp_gpu's business
    return p.create(request).name


def vm(**overrides: Any) -> dict[str, Any]:
    return {"name": "vm-1", "machineType": "zones/us-central1-a/machineTypes/n1-standard-4", "disks": [IMAGE],
            "scheduling": {"onHostMaintenance": "TERMINATE"}, **overrides}


T4 = [{"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 1}]


@pytest.mark.parametrize("body, message", [
    (vm(name="Bad_Name"), "Invalid value for field 'resource.name'"),
    (vm(guestAccelerators=T4, scheduling={"onHostMaintenance": "MIGRATE"}), "do not support live migration"),
    (vm(guestAccelerators=T4, scheduling={"onHostMaintenance": "TERMINATE", "provisioningModel": "SPOT"}),
     "Spot VMs cannot be automatically restarted"),
    (vm(machineType="zones/z/machineTypes/g2-standard-4", guestAccelerators=T4), "does not take other guest accelerators"),
    (vm(disks=[]), "a boot disk with a source image is required"),
], ids=["name", "live-migration", "spot-restart", "bundled-gpus", "no-image"])
def test_an_instance_compute_engine_would_refuse_is_a_400(fake: FakeComputeApi, body: dict, message: str) -> None:
    r = httpx.post(f"{fake.url}{ZONE_PATH}/instances", json=body)
    assert r.status_code == 400 and message in r.json()["error"]["message"]


def test_an_insert_is_an_operation_that_finishes_when_the_vm_runs(fake: FakeComputeApi) -> None:
    op = httpx.post(f"{fake.url}{ZONE_PATH}/instances", json=vm()).json()
    assert (op["kind"], op["operationType"], op["status"]) == ("compute#operation", "insert", "RUNNING")
    eventually(lambda: httpx.get(f"{fake.url}{ZONE_PATH}/operations/{op['name']}").json()["status"] == "DONE", 10,
               "the insert operation is DONE")
    assert httpx.get(f"{fake.url}{ZONE_PATH}/instances/vm-1").json()["status"] == "RUNNING"
    again = httpx.post(f"{fake.url}{ZONE_PATH}/instances", json=vm())
    assert again.status_code == 409


def test_each_vm_runs_the_script_and_learns_its_number_from_its_metadata_server(fake: FakeComputeApi,
                                                                                  tmp_path: Path) -> None:
    script = ('#!/bin/bash\ncurl -sf -H "Metadata-Flavor: Google" '
              f'"$TRAINJOBS_METADATA_URL/instance/attributes/{HOST_KEY}" > worker-number\n')
    name = create(fake, script, workers=2)
    files = [tmp_path / f"{name}-{i}" / "host-0" / "worker-number" for i in range(2)]
    eventually(lambda: all(f.exists() and f.read_text() for f in files), 30, "the VMs ran the startup script",
               every=0.1)
    assert [f.read_text() for f in files] == ["0", "1"]


def test_a_vm_deletes_its_own_instance_with_what_the_metadata_server_tells_it(fake: FakeComputeApi) -> None:
    name = create(fake, "#!/bin/bash\n")
    metadata = f"{fake.url}/metadata/{name}-0/0/computeMetadata/v1"
    assert delete_own_tpu_node(metadata) is None  # no TPU node here
    assert delete_own_instance(metadata) == f"projects/proj/zones/us-central1-a/instances/{name}-0"
    eventually(lambda: not fake.instance_names(), 10, "the instance is gone")


# --- guest attributes and metadata updates: how a VM's first storage token reaches it (tests/test_sealed_tokens.py)

def test_a_vm_writes_a_guest_attribute_that_the_compute_api_reads(fake: FakeComputeApi) -> None:
    from google.api_core import exceptions as gexc

    from worker.gcp.compute import compute_clients

    body = vm(metadata={"items": [{"key": GUEST_ATTRIBUTES_KEY, "value": "TRUE"}]})
    assert httpx.post(f"{fake.url}{ZONE_PATH}/instances", json=body).status_code == 200
    clients = compute_clients(GcpConfig(project="proj", zone="us-central1-a", compute_api_endpoint=fake.url))
    with pytest.raises(gexc.NotFound):  # nothing written yet
        clients.instances.get_guest_attributes(request={"project": "proj", "zone": "us-central1-a", "instance": "vm-1",
                                                        "variable_key": PUBLIC_KEY_PATH})
    put = httpx.put(f"{fake.metadata_url('vm-1', 0)}/instance/guest-attributes/{PUBLIC_KEY_PATH}", content="k1",
                    headers={"Metadata-Flavor": "Google"})
    assert put.status_code == 200
    found = clients.instances.get_guest_attributes(request={
        "project": "proj", "zone": "us-central1-a", "instance": "vm-1", "variable_key": PUBLIC_KEY_PATH})
    assert found.variable_value == "k1"
    listed = clients.instances.get_guest_attributes(request={
        "project": "proj", "zone": "us-central1-a", "instance": "vm-1", "query_path": "trainjobs/"})
    assert [(i.namespace, i.key, i.value) for i in listed.query_value.items] == [(PUBLIC_KEY_NAMESPACE, PUBLIC_KEY_ATTRIBUTE, "k1")]


def test_set_metadata_needs_the_fingerprint_of_the_metadata_it_replaces(fake: FakeComputeApi) -> None:
    from google.api_core import exceptions as gexc
    from google.cloud import compute_v1

    from worker.gcp.compute import compute_clients

    assert httpx.post(f"{fake.url}{ZONE_PATH}/instances", json=vm(metadata={"items": [
        {"key": "a", "value": "1"}]})).status_code == 200
    clients = compute_clients(GcpConfig(project="proj", zone="us-central1-a", compute_api_endpoint=fake.url))
    seen = clients.instances.get(project="proj", zone="us-central1-a", instance="vm-1").metadata
    assert seen.fingerprint
    items = [*seen.items, compute_v1.Items(key="b", value="2")]
    clients.instances.set_metadata_unary(project="proj", zone="us-central1-a", instance="vm-1",
                                         metadata_resource=compute_v1.Metadata(fingerprint=seen.fingerprint, items=items))
    served = httpx.get(f"{fake.metadata_url('vm-1', 0)}/instance/attributes/b", headers={"Metadata-Flavor": "Google"})
    assert served.text == "2"
    with pytest.raises(gexc.PreconditionFailed):  # a writer that read before that change would undo it
        clients.instances.set_metadata_unary(project="proj", zone="us-central1-a", instance="vm-1",
                                             metadata_resource=compute_v1.Metadata(fingerprint=seen.fingerprint,
                                                                                   items=list(seen.items)))
