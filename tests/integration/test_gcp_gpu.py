"""The Compute Engine provisioner, through the real google-cloud-compute client, against the fake Compute
Engine API. What the client sent is read back from the fake's request log, so these assert the requests
Google would get, not what our code meant to send."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from stack.fakecloud import FakeComputeApi, FakeTpuApi
from stack.fakecloud.tpu_inventory import Timing
from tests.support import eventually, scaled
from trainjobs import storage
from trainjobs.job_paths import JobPaths
from trainjobs.spec import JobSpec
from trainjobs.vm_metadata import (
    COMPUTE_API_KEY, HOST_KEY, INSTALL_GPU_DRIVER_KEY, INSTANCE_KEY, JOB_DIR_KEY, LABEL_ATTEMPT, LABEL_HOSTS, LABEL_JOB,
    LABEL_MACHINE, LABEL_MANAGED, STARTUP_SCRIPT_KEY)
from worker.boundary.access import JobBoundary, Scope
from worker.gcp.config import GcpConfig
from worker.gcp.errors import MachineRefused
from worker.ports import MachineRequest, MachineState
from worker.gcp.router import GcpProvisioner
from worker.gcp.compute import GceVmProvisioner, compute_clients
from worker.gcp.tpu import TpuVmProvisioner

ZONE, FALLBACK = "us-central1-a", "us-central1-b"
SCRIPT = f"#!/bin/bash\nexec python3 -m agent --job-dir {JobPaths.for_job('j', 'b').root}\n"
JOB = "6f1c2a9e-0d4b-4c1e-9a7f-3b2d1e0f9a8c"


FAKE = FakeComputeApi  # the `fake` fixture (tests/conftest.py): its VMs do not boot


def provisioner(fake: FakeComputeApi, **config: Any) -> GceVmProvisioner:
    settings: dict[str, Any] = {"project": "proj", "zone": ZONE, "compute_api_endpoint": fake.url, **config}
    return GceVmProvisioner(GcpConfig(**settings), startup=lambda r: SCRIPT, create_wait_s=scaled(30),
                            backoff_s=0.01, poll_s=0.02)


def request(job_dir: str = JobPaths.for_job(JOB, "bucket").root, workers: int = 1, **accelerator: Any) -> MachineRequest:
    spec = JobSpec.model_validate({
        "dataset": {"source": "sklearn:digits"}, "model": {"name": "cnn"}, "labels": {"team": "vision"},
        "workers": workers, "accelerator": {"type": "gpu", "gpu_type": "nvidia-tesla-t4", **accelerator}})
    return MachineRequest(JOB, 1, spec, job_dir)


def inserts(fake: FakeComputeApi) -> list[Any]:
    return [r for r in fake.requests if r.method == "POST" and r.path.endswith("/instances")]


def metadata(body: dict[str, Any]) -> dict[str, str]:
    return {i["key"]: i["value"] for i in body["metadata"]["items"]}


# --- what is asked for ---------------------------------------------------------------------------

def test_create_sends_the_vm_the_spec_and_configuration_ask_for(fake: FakeComputeApi) -> None:
    p = provisioner(fake, network="projects/proj/global/networks/train", subnetwork="regions/us-central1/subnetworks/s",
                    service_account="vm@proj.iam.gserviceaccount.com", tags=("trainjobs", "no-ssh"))
    r = request(count=2, spot=True)
    p.create(r)
    [insert] = inserts(fake)
    body = insert.body
    assert insert.path == f"/compute/v1/projects/proj/zones/{ZONE}/instances"
    assert body["name"] == f"{r.name}-0"
    assert body["machineType"] == f"zones/{ZONE}/machineTypes/n1-standard-8"
    assert body["guestAccelerators"] == [{"acceleratorType": f"projects/proj/zones/{ZONE}/acceleratorTypes/nvidia-tesla-t4",
                                          "acceleratorCount": 2}]
    assert body["scheduling"] == {"onHostMaintenance": "TERMINATE", "automaticRestart": False,
                                  "provisioningModel": "SPOT", "instanceTerminationAction": "DELETE"}
    [disk] = body["disks"]
    assert disk["boot"] and disk["autoDelete"]
    # The image family is resolved at create time: the VM boots the image the family named then.
    assert disk["initializeParams"]["sourceImage"] == (
        f"{fake.url}/compute/v1/projects/deeplearning-platform-release/global/images/tf-2-17-cu121-ubuntu-2204-py310-v20250101")
    assert body["labels"] == {"team": "vision", LABEL_MANAGED: "true", LABEL_JOB: JOB, LABEL_ATTEMPT: "1",
                              LABEL_MACHINE: r.name, LABEL_HOSTS: "1"}
    assert metadata(body) == {STARTUP_SCRIPT_KEY: SCRIPT, INSTALL_GPU_DRIVER_KEY: "True", HOST_KEY: "0",
                              JOB_DIR_KEY: r.job_dir, COMPUTE_API_KEY: fake.url,
                              INSTANCE_KEY: f"projects/proj/zones/{ZONE}/instances/{r.name}-0"}
    assert body["networkInterfaces"] == [{"network": "projects/proj/global/networks/train",
                                          "subnetwork": "regions/us-central1/subnetworks/s",
                                          "accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]}]
    assert body["serviceAccounts"] == [{"email": "vm@proj.iam.gserviceaccount.com", "scopes": [
        "https://www.googleapis.com/auth/devstorage.read_write", "https://www.googleapis.com/auth/compute"]}]
    assert body["tags"] == {"items": ["trainjobs", "no-ssh"]}


@pytest.mark.parametrize("accelerator, machine_type", [
    ({"gpu_type": "nvidia-tesla-a100", "count": 4}, "a2-highgpu-4g"),
    ({"gpu_type": "nvidia-a100-80gb", "count": 1}, "a2-ultragpu-1g"),
    ({"gpu_type": "nvidia-h100-80gb", "count": 8}, "a3-highgpu-8g"),
    ({"gpu_type": "nvidia-h200-141gb", "count": 8}, "a3-ultragpu-8g"),
    ({"gpu_type": "nvidia-l4", "count": 2}, "g2-standard-24"),
    ({"gpu_type": "nvidia-l4", "count": 1, "machine_type": "g2-standard-8"}, "g2-standard-8"),
])
def test_a2_a3_and_g2_machine_types_bring_their_gpus(fake: FakeComputeApi, accelerator: dict, machine_type: str) -> None:
    provisioner(fake).create(request(**accelerator))
    [insert] = inserts(fake)
    assert insert.body["machineType"].endswith(f"/{machine_type}")
    assert "guestAccelerators" not in insert.body


@pytest.mark.parametrize("accelerator, machine_type, gpus", [
    ({"gpu_type": "nvidia-tesla-v100", "count": 8}, "n1-standard-32", 8),
    ({"gpu_type": "nvidia-tesla-p100", "count": 1, "machine_type": "n1-highmem-8"}, "n1-highmem-8", 1),
])
def test_n1_machine_types_take_the_gpus_as_guest_accelerators(fake: FakeComputeApi, accelerator: dict,
                                                              machine_type: str, gpus: int) -> None:
    provisioner(fake).create(request(**accelerator))
    [insert] = inserts(fake)
    assert insert.body["machineType"].endswith(f"/{machine_type}")
    assert insert.body["guestAccelerators"][0]["acceleratorCount"] == gpus


def test_an_on_demand_vm_is_standard_and_a_cpu_job_gets_a_plain_vm(fake: FakeComputeApi) -> None:
    p = provisioner(fake)
    p.create(request())
    cpu = JobSpec.model_validate({"dataset": {"source": "sklearn:digits"}, "model": {"name": "cnn"},
                                  "accelerator": {"type": "cpu", "replicas": 3}})
    p.create(MachineRequest("cpu-job", 1, cpu, JobPaths.for_job("cpu-job", "bucket").root))
    gpu_vm, cpu_vm = (r.body for r in inserts(fake))
    assert "provisioningModel" not in gpu_vm["scheduling"]
    assert cpu_vm["machineType"].endswith("/n2-standard-8") and "guestAccelerators" not in cpu_vm
    assert INSTALL_GPU_DRIVER_KEY not in metadata(cpu_vm)
    assert cpu_vm["disks"][0]["initializeParams"]["sourceImage"].endswith("/tf-2-17-cpu-ubuntu-2204-py310-v20250101")


# --- walks ---------------------------------------------------------------------------------------

def test_create_follows_the_zone_operation_on_the_configured_endpoint(fake: FakeComputeApi) -> None:
    """InstancesClient.insert() would poll the operation on compute.googleapis.com whatever the endpoint;
    the provisioner follows it through its own ZoneOperationsClient on the same one."""
    p, r = provisioner(fake), request()
    assert p.create(r).state == MachineState.READY
    polls = [q for q in fake.requests if q.method == "GET" and "/operations/" in q.path]
    assert polls and all(q.path.startswith(f"/compute/v1/projects/proj/zones/{ZONE}/operations/") for q in polls)


def test_a_created_vm_becomes_ready_and_delete_leaves_nothing(fake: FakeComputeApi) -> None:
    p, r = provisioner(fake), request()
    assert p.create(r).state == MachineState.READY
    p.delete(r.name)
    assert p.get(r) is None and fake.instance_names() == []


def test_a_stockout_in_the_first_zone_creates_the_vm_in_the_fallback_zone(fake: FakeComputeApi) -> None:
    fake.stock_out(ZONE)
    p, r = provisioner(fake, fallback_zones=(FALLBACK,)), request()
    info = p.create(r)
    assert info.state == MachineState.READY and FALLBACK in (info.detail or "")
    assert [q.path.split("/")[6] for q in inserts(fake)] == [ZONE, FALLBACK]
    assert fake.instance(f"{r.name}-0")["zone"].endswith(f"/zones/{FALLBACK}")  # type: ignore[index]


def test_when_every_zone_is_out_the_job_waits_then_fails_after_the_capacity_wait(fake: FakeComputeApi) -> None:
    fake.stock_out(ZONE)
    now = [0.0]
    p = GceVmProvisioner(GcpConfig(project="proj", zone=ZONE, compute_api_endpoint=fake.url, capacity_wait_s=600),
                         startup=lambda r: SCRIPT, backoff_s=0.01, poll_s=0.02, create_wait_s=scaled(30),
                         clock=lambda: now[0])
    r = request()
    waiting = p.create(r)  # the driver starts no boot clock for it, and asks again at its next step
    assert waiting.waiting_for_capacity and "no zone has capacity for a VM with 1 x nvidia-tesla-t4" in (waiting.detail or "")
    assert p.get(r) is None
    asked = len(inserts(fake))
    now[0] = 10.0
    assert p.create(r).waiting_for_capacity and len(inserts(fake)) == asked  # asked moments ago: not again yet
    now[0] = 601.0
    with pytest.raises(MachineRefused, match=f"no capacity for a VM with 1 x nvidia-tesla-t4 in {ZONE} after 10 minutes"):
        p.create(r)


def test_gpu_quota_refuses_the_vm_with_the_clouds_message(fake: FakeComputeApi) -> None:
    fake.set_gpu_quota(ZONE, 1)
    with pytest.raises(MachineRefused) as refused:
        provisioner(fake, fallback_zones=(FALLBACK,)).create(request(count=2))
    assert str(refused.value) == "Quota 'GPUS_PER_GPU_FAMILY' exceeded.  Limit: 1.0 in region us-central1."
    assert len(inserts(fake)) == 1 and fake.instance_names() == []  # no other zone tried: quota is the project's


def test_a_transient_error_is_retried_and_a_permission_error_is_not(fake: FakeComputeApi) -> None:
    fake.fail_next("POST", "/instances", 503, "UNAVAILABLE", "backend error", times=2)
    p, r = provisioner(fake), request()
    assert p.create(r).state == MachineState.READY
    p.delete(r.name)
    fake.fail_next("POST", "/instances", 403, "PERMISSION_DENIED", "Required 'compute.instances.create' permission")
    with pytest.raises(MachineRefused, match="Required 'compute.instances.create' permission"):
        provisioner(fake).create(request())


def test_a_preempted_spot_vm_reports_preempted_even_after_google_deletes_it(fake: FakeComputeApi) -> None:
    p, r = provisioner(fake), request(spot=True)
    p.create(r)
    fake.preempt(f"{r.name}-0")
    assert p.get(r).state == MachineState.PREEMPTED  # type: ignore[union-attr]
    # instanceTerminationAction DELETE: Google deletes it
    eventually(lambda: not fake.instance_names(), 10, "Google deleted the preempted VM")
    assert p.get(r).state == MachineState.PREEMPTED  # type: ignore[union-attr]


def test_a_multi_host_set_is_ready_once_every_vm_runs_and_the_cluster_is_written(fake: FakeComputeApi, bucket: str) -> None:
    job_dir = JobPaths.for_job(JOB, bucket).root
    p, r = provisioner(fake, tf_port=5000), request(job_dir=job_dir, workers=2, spot=True)
    assert p.create(r).state == MachineState.READY
    assert sorted(fake.instance_names()) == [f"{r.name}-0", f"{r.name}-1"]
    assert [metadata(q.body)[HOST_KEY] for q in inserts(fake)] == ["0", "1"]
    assert storage.read_json(JobPaths(job_dir).cluster(1)) == {"worker": ["127.0.0.1:5000", "127.0.0.1:5001"]}
    fake.preempt(f"{r.name}-1")  # losing any host loses the set
    assert p.get(r).state == MachineState.PREEMPTED  # type: ignore[union-attr]
    p.delete(r.name)
    assert fake.instance_names() == []


def test_an_adopting_worker_writes_the_cluster_to_the_requests_job_directory_whatever_the_vms_metadata_says(
        fake: FakeComputeApi, bucket: str) -> None:
    from google.cloud import compute_v1

    job_dir, other_job_dir = JobPaths.for_job(JOB, bucket).root, JobPaths.for_job("another-job", bucket).root
    r = request(job_dir=job_dir, workers=2)
    provisioner(fake, tf_port=5000).create(r)  # this worker dies; the set is not yet in its cluster file
    storage.blob(JobPaths(job_dir).cluster(1)).delete()
    # The job's code on the VM, with the VM's compute scope, points its metadata at another job.
    instances = compute_clients(GcpConfig(project="proj", zone=ZONE, compute_api_endpoint=fake.url)).instances
    for host in (0, 1):
        vm = instances.get(project="proj", zone=ZONE, instance=f"{r.name}-{host}")
        items = [compute_v1.Items(key=i.key, value=other_job_dir if i.key == JOB_DIR_KEY else i.value)
                 for i in vm.metadata.items]
        instances.set_metadata_unary(project="proj", zone=ZONE, instance=vm.name, metadata_resource=compute_v1.Metadata(
            fingerprint=vm.metadata.fingerprint, items=items))
    assert provisioner(fake, tf_port=5000).get(r).state == MachineState.READY  # type: ignore[union-attr]
    assert storage.read_json(JobPaths(job_dir).cluster(1)) == {"worker": ["127.0.0.1:5000", "127.0.0.1:5001"]}
    assert storage.read_json(JobPaths(other_job_dir).cluster(1)) is None


def test_a_new_worker_finds_the_set_by_label_and_does_not_create_it_twice(fake: FakeComputeApi) -> None:
    r = request()
    provisioner(fake).create(r)  # this worker dies before recording anything
    successor = provisioner(fake)
    [found] = successor.list({LABEL_JOB: JOB})
    assert found.name == r.name and found.state == MachineState.READY
    assert successor.create(r).name == r.name
    assert len(inserts(fake)) == 1


# --- routing and layers --------------------------------------------------------------------------

def test_the_gcp_provisioner_sends_tpu_jobs_to_cloud_tpu_and_the_rest_to_compute_engine(
        fake: FakeComputeApi, tmp_path: Path) -> None:
    with FakeTpuApi(sandbox=tmp_path / "tpu", boot=False, timing=Timing(boot_s=0.1, delete_s=0.1)) as tpu_fake:
        config = GcpConfig(project="proj", zone=ZONE, tpu_api_endpoint=tpu_fake.url, compute_api_endpoint=fake.url)
        tpu = TpuVmProvisioner(config, startup=lambda r: SCRIPT, create_wait_s=scaled(30), backoff_s=0.01)
        gcp = GcpProvisioner(tpu, GceVmProvisioner(config, startup=lambda r: SCRIPT, poll_s=0.02, backoff_s=0.01))
        tpu_spec = JobSpec.model_validate({"dataset": {"source": "sklearn:digits"}, "model": {"name": "cnn"},
                                           "accelerator": {"type": "tpu", "tpu_type": "v5litepod-8"}})
        on_tpu = MachineRequest("tpu-job", 1, tpu_spec, JobPaths.for_job("tpu-job", "b").root)
        gcp.create(on_tpu)
        gcp.create(request())
        assert tpu_fake.node_names() == [on_tpu.name] and fake.instance_names() == [f"{request().name}-0"]
        # A worker that did not create them (adoption, the reaper) finds each where it is.
        fresh = GcpProvisioner(tpu, GceVmProvisioner(config, poll_s=0.02, backoff_s=0.01))
        assert {m.name for m in fresh.list({})} == {on_tpu.name, request().name}
        assert fresh.get(on_tpu) is not None and fresh.get(request()) is not None
        for name in (on_tpu.name, request().name):
            fresh.delete(name)
        assert tpu_fake.node_names() == [] and fake.instance_names() == []


def test_no_vm_of_a_set_carries_a_token_in_its_metadata_and_an_adopting_worker_keeps_them_coming(
        fake: FakeComputeApi, bucket: str) -> None:
    import json
    from datetime import UTC, datetime, timedelta

    from worker.gcp.job_tokens import JobTokens
    from worker.gcs_channel import GcsJobChannel

    def Minter() -> Any:  # stands in for the token exchange: a token names the job it was minted for
        return lambda boundary: lambda: (f"token-{boundary.job_id}-1", datetime.now(UTC) + timedelta(hours=1))

    r = request(job_dir=GcsJobChannel(bucket).job_dir(JOB), workers=2)
    r = replace(r, boundary=JobBoundary(JOB, read=(), write=(Scope.from_uri(r.job_dir, directory=True),)))
    p = GceVmProvisioner(GcpConfig(project="proj", zone=ZONE, compute_api_endpoint=fake.url), startup=lambda r: SCRIPT,
                         create_wait_s=scaled(30), backoff_s=0.01, poll_s=0.02, tokens=JobTokens(Minter()))
    p.create(r)
    # Instance metadata is readable by whoever may get the VM: the token comes sealed to each VM's own key
    # once it asks (tests/test_sealed_tokens.py), never with the insert.
    assert len(inserts(fake)) == 2 and not [q for q in inserts(fake) if f"token-{JOB}" in json.dumps(q.body)]
    successor = GceVmProvisioner(GcpConfig(project="proj", zone=ZONE, compute_api_endpoint=fake.url),
                                 backoff_s=0.01, poll_s=0.02, tokens=JobTokens(Minter()))
    successor.get(r)
    assert successor.tokens is not None and successor.tokens.running() == [r.name]
    successor.delete(r.name)
    assert successor.tokens.running() == [] and fake.instance_names() == []


@pytest.mark.parametrize("accelerator, workers, machine", [
    ({"gpu_type": "nvidia-l4", "count": 2}, 1, "Compute Engine GPU VM 2 x nvidia-l4, g2-standard-24"),
    ({"gpu_type": "nvidia-tesla-t4", "count": 1}, 2, "Compute Engine GPU VM 1 x nvidia-tesla-t4, n1-standard-4 each"),
    ({"gpu_type": "nvidia-tesla-t4", "machine_type": "n1-highmem-8"}, 1, "Compute Engine GPU VM 1 x nvidia-tesla-t4, n1-highmem-8"),
])
def test_the_dry_run_names_the_machine_type_the_provisioner_will_ask_for(accelerator: dict, workers: int,
                                                                        machine: str) -> None:
    from trainjobs.machine_plan import plan_machines

    plan = plan_machines(request(workers=workers, **accelerator).spec)
    assert f"{plan.kind} {plan.type}" == machine and plan.hosts == workers


def test_a_gcp_worker_is_wired_to_both_products_from_the_environment(tmp_path: Path, monkeypatch: Any) -> None:
    from stack.wiring import build_runtime

    for name, value in {"TRAINJOBS_GCP_PROJECT": "proj", "TRAINJOBS_GCP_ZONE": ZONE, "TRAINJOBS_GCP_TF_PORT": "3000",
                        "TRAINJOBS_TPU_API_ENDPOINT": "http://127.0.0.1:9",
                        "TRAINJOBS_COMPUTE_API_ENDPOINT": "http://127.0.0.1:9"}.items():
        monkeypatch.setenv(name, value)
    provisioner = build_runtime("gcp", tmp_path).provisioner
    assert isinstance(provisioner, GcpProvisioner)
    assert isinstance(provisioner.tpu, TpuVmProvisioner) and isinstance(provisioner.vm, GceVmProvisioner)
    assert provisioner.vm.config.tf_port == 3000
    assert provisioner.vm.clients.instances.api_endpoint == provisioner.vm.clients.zone_operations.api_endpoint \
        == "http://127.0.0.1:9"
