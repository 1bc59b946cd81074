"""The fake Cloud TPU API itself, where tests elsewhere rely on it being faithful: error bodies, the
hosts of a multi-host slice, each host's metadata server, and a VM deleting its own node."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from stack.fakecloud import FakeTpuApi
from tests.support import eventually, scaled
from trainjobs.job_paths import JobPaths
from trainjobs.spec import JobSpec
from trainjobs.vm_metadata import (
    GUEST_ATTRIBUTES_KEY, HOST_KEY, PUBLIC_KEY_ATTRIBUTE, PUBLIC_KEY_NAMESPACE, PUBLIC_KEY_PATH)
from agent.watchdog import delete_own_tpu_node
from worker.gcp.config import GcpConfig
from worker.ports import MachineRequest
from worker.gcp.tpu import TpuVmProvisioner

PARENT = "/v2/projects/proj/locations/us-central1-a"


FAKE, FAKE_BOOTS = FakeTpuApi, True  # the `fake` fixture (tests/conftest.py): its hosts run their startup script


def create(fake: FakeTpuApi, tpu_type: str, script: str) -> str:
    spec = JobSpec.model_validate({"dataset": {"source": "sklearn:digits"}, "model": {"name": "cnn"},
                                   "accelerator": {"type": "tpu", "tpu_type": tpu_type}})
    p = TpuVmProvisioner(GcpConfig(project="proj", zone="us-central1-a", tpu_api_endpoint=fake.url),
                         startup=lambda r: script, create_wait_s=scaled(30))
    return p.create(MachineRequest("job-1", 1, spec, JobPaths.for_job("job-1", "b").root)).name


@pytest.mark.parametrize("method, path, body, code, status", [
    ("GET", f"{PARENT}/nodes/missing", None, 404, "NOT_FOUND"),
    ("POST", f"{PARENT}/nodes?nodeId=n1", {"acceleratorType": "v9-8", "runtimeVersion": "r"}, 400, "INVALID_ARGUMENT"),
    ("POST", f"{PARENT}/nodes", {"acceleratorType": "v5litepod-8", "runtimeVersion": "r"}, 400, "INVALID_ARGUMENT"),
], ids=["not-found", "unknown-type", "no-node-id"])
def test_errors_are_google_rpc_bodies(fake: FakeTpuApi, method: str, path: str, body: dict | None, code: int,
                                      status: str) -> None:
    r = httpx.request(method, fake.url + path, json=body)
    assert r.status_code == code
    error = r.json()["error"]
    assert (error["code"], error["status"]) == (code, status) and error["message"]


def test_creating_an_existing_node_is_a_409(fake: FakeTpuApi) -> None:
    node = {"acceleratorType": "v5litepod-8", "runtimeVersion": "tpu-vm-tf-2.18.0-pjrt"}
    assert httpx.post(f"{fake.url}{PARENT}/nodes?nodeId=n1", json=node).status_code == 200
    again = httpx.post(f"{fake.url}{PARENT}/nodes?nodeId=n1", json=node)
    assert (again.status_code, again.json()["error"]["status"]) == (409, "ALREADY_EXISTS")


def test_each_host_of_a_slice_runs_the_script_and_learns_its_number_from_the_metadata_server(
        fake: FakeTpuApi, tmp_path: Path) -> None:
    script = ('#!/bin/bash\ncurl -sf -H "Metadata-Flavor: Google" '
              f'"$TRAINJOBS_METADATA_URL/instance/attributes/{HOST_KEY}" > worker-number\n')
    name = create(fake, "v4-16", script)  # 8 TensorCores' worth of replicas over 2 hosts
    files = [tmp_path / name / f"host-{i}" / "worker-number" for i in range(2)]
    eventually(lambda: all(f.exists() and f.read_text() for f in files), 30, "the hosts ran the startup script",
               every=0.1)
    assert [f.read_text() for f in files] == ["0", "1"]


def test_the_metadata_server_refuses_requests_without_the_flavor_header(fake: FakeTpuApi) -> None:
    name = create(fake, "v5litepod-8", "#!/bin/bash\n")
    url = f"{fake.url}/metadata/{name}/0/computeMetadata/v1/instance/attributes/{HOST_KEY}"
    assert httpx.get(url).status_code == 403
    assert httpx.get(url, headers={"Metadata-Flavor": "Google"}).text == "0"


def test_a_vm_deletes_its_own_node_with_what_the_metadata_server_tells_it(fake: FakeTpuApi) -> None:
    name = create(fake, "v5litepod-8", "#!/bin/bash\n")
    deleted = delete_own_tpu_node(f"{fake.url}/metadata/{name}/0/computeMetadata/v1")
    assert deleted == f"projects/proj/locations/us-central1-a/nodes/{name}"
    eventually(lambda: not fake.node_names(), 10, "the node is gone")


def test_off_a_cloud_vm_there_is_no_node_to_delete() -> None:
    assert delete_own_tpu_node("http://127.0.0.1:9/computeMetadata/v1") is None


# --- guest attributes and metadata updates: how a VM's first storage token reaches it (tests/test_sealed_tokens.py)

def _node_with_hosts(fake: FakeTpuApi, node_id: str, tpu_type: str, guest_attributes: bool = True) -> str:
    metadata = {GUEST_ATTRIBUTES_KEY: "TRUE"} if guest_attributes else {}
    node = {"acceleratorType": tpu_type, "runtimeVersion": "tpu-vm-tf-2.18.0-pjrt", "metadata": metadata}
    assert httpx.post(f"{fake.url}{PARENT}/nodes?nodeId={node_id}", json=node).status_code == 200
    return f"projects/proj/locations/us-central1-a/nodes/{node_id}"


def _put(fake: FakeTpuApi, node_id: str, host: int, value: str) -> httpx.Response:
    return httpx.put(f"{fake.metadata_url(node_id, host)}/instance/guest-attributes/{PUBLIC_KEY_PATH}",
                     content=value, headers={"Metadata-Flavor": "Google"})


def test_each_host_writes_its_own_guest_attributes_and_the_tpu_api_reads_them_per_worker(fake: FakeTpuApi) -> None:
    from worker.gcp.tpu import tpu_client

    name = _node_with_hosts(fake, "n1", "v4-16")  # two hosts
    assert _put(fake, "n1", 0, "key-of-host-0").status_code == 200
    assert _put(fake, "n1", 1, "key-of-host-1").status_code == 200
    client = tpu_client(GcpConfig(project="proj", zone="us-central1-a", tpu_api_endpoint=fake.url))
    every = client.get_guest_attributes(request={"name": name, "query_path": PUBLIC_KEY_PATH})
    assert [[(i.namespace, i.key, i.value) for i in g.query_value.items] for g in every.guest_attributes] == [
        [(PUBLIC_KEY_NAMESPACE, PUBLIC_KEY_ATTRIBUTE, "key-of-host-0")], [(PUBLIC_KEY_NAMESPACE, PUBLIC_KEY_ATTRIBUTE, "key-of-host-1")]]
    second = client.get_guest_attributes(request={"name": name, "query_path": "trainjobs/", "worker_ids": ["1"]})
    assert [i.value for g in second.guest_attributes for i in g.query_value.items] == ["key-of-host-1"]


def test_guest_attributes_are_refused_unless_the_node_enables_them(fake: FakeTpuApi) -> None:
    _node_with_hosts(fake, "n1", "v5litepod-8", guest_attributes=False)
    refused = _put(fake, "n1", 0, "key")
    assert refused.status_code == 403 and b"disabled" in refused.content


def test_a_metadata_update_through_the_client_wakes_a_host_waiting_for_change(fake: FakeTpuApi) -> None:
    import threading

    from google.api_core import exceptions as gexc
    from google.cloud import tpu_v2
    from google.protobuf import field_mask_pb2

    from worker.gcp.tpu import tpu_client

    name = _node_with_hosts(fake, "n1", "v5litepod-8")
    meta, flavor = fake.metadata_url("n1", 0), {"Metadata-Flavor": "Google"}
    first = httpx.get(f"{meta}/instance/attributes/", params={"recursive": "true"}, headers=flavor)
    assert first.json()[GUEST_ATTRIBUTES_KEY] == "TRUE" and first.headers["ETag"]
    seen: list[dict[str, str]] = []
    waiter = threading.Thread(target=lambda: seen.append(httpx.get(
        f"{meta}/instance/attributes/", headers=flavor, timeout=scaled(30), params={
            "recursive": "true", "wait_for_change": "true", "last_etag": first.headers["ETag"],
            "timeout_sec": str(int(scaled(20)))}).json()))
    waiter.start()
    time.sleep(0.2)
    assert not seen  # nothing changed yet: the request is held
    client = tpu_client(GcpConfig(project="proj", zone="us-central1-a", tpu_api_endpoint=fake.url))
    node = client.get_node(name=name)
    client.update_node(node=tpu_v2.Node(name=name, metadata={**node.metadata, "new-key": "new value"}),
                       update_mask=field_mask_pb2.FieldMask(paths=["metadata"])).result(timeout=scaled(10))
    waiter.join(scaled(10))
    assert seen and seen[0]["new-key"] == "new value" and seen[0][GUEST_ATTRIBUTES_KEY] == "TRUE"
    with pytest.raises(gexc.BadRequest):  # only description, tags, labels, metadata, external IPs may change
        client.update_node(node=tpu_v2.Node(name=name, runtime_version="other"),
                           update_mask=field_mask_pb2.FieldMask(paths=["runtime_version"]))


def test_a_vm_whose_identity_may_not_delete_nodes_says_so_and_leaves_the_node_to_the_reaper(fake: FakeTpuApi) -> None:
    name = create(fake, "v5litepod-8", "#!/bin/bash\n")
    fake.fail_next("DELETE", f"/nodes/{name}", 403, "PERMISSION_DENIED",
                   f"Permission 'tpu.nodes.delete' denied on 'projects/proj/locations/us-central1-a/nodes/{name}'")
    with pytest.raises(PermissionError, match="the worker's reaper deletes it"):
        delete_own_tpu_node(f"{fake.url}/metadata/{name}/0/computeMetadata/v1")
    assert fake.node_names() == [name]
