"""A cloud VM's first storage token reaches that VM and no other reader of its metadata: the worker seals
it to a key the VM made at boot and published as a guest attribute (trainjobs/sealed_token.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from stack.fakecloud import FakeComputeApi, FakeTpuApi
from stack.fakecloud.compute_inventory import ComputeTiming
from stack.fakecloud.tpu_inventory import Timing
from tests.support import eventually, scaled
from trainjobs.job_paths import JobPaths, agent_wheel_uri
from trainjobs.sealed_token import KeyPair, SealError, open_mine
from trainjobs.vm_metadata import PUBLIC_KEY_PATH, SEALED_KEY
from trainjobs.spec import JobSpec
from worker.boundary.access import JobBoundary, Scope
from worker.gcp.bootstrap import REPO_ROOT, startup_script
from worker.gcp.config import GcpConfig
from worker.gcp.job_tokens import JobTokens
from worker.gcp.token_delivery import DueChecks, create_metadata
from worker.ports import MachineRequest
from worker.gcp.compute import GceVmProvisioner, compute_clients
from worker.gcp.tpu import TpuVmProvisioner, tpu_client


# --- end to end: the provisioner, the fake cloud's API and metadata server, the real startup script -------------

ZONE = "us-central1-a"
JOB = "5b1f3c2e-9d4a-4c6b-8e2f-1a7d3c9e0b42"


def _minter(boundary: JobBoundary) -> Callable[[], tuple[str, datetime]]:
    """Stands in for the token exchange: the token names the job it was minted for."""
    return lambda: (f"ya29.token-of-{boundary.job_id}", datetime.now(UTC) + timedelta(hours=1))


def _request(bucket: str, accelerator: dict[str, Any], workers: int = 1) -> MachineRequest:
    spec = JobSpec.model_validate({"dataset": {"source": "sklearn:digits"}, "model": {"name": "cnn"},
                                   "accelerator": accelerator, "workers": workers})
    job_dir = JobPaths.for_job(JOB, bucket).root
    return MachineRequest(JOB, 1, spec, job_dir,
                          boundary=JobBoundary(JOB, read=(), write=(Scope.from_uri(job_dir, directory=True),)))


def _boot(tmp_path: Path, host: str, script: str, metadata_url: str) -> subprocess.Popen[str]:
    """The real startup script, as a VM host runs it at boot, against that host's metadata server. The
    token step runs the real agent.first_token; "the agent" prints the token file it was given."""
    disk = tmp_path / host
    disk.mkdir()
    python = disk / "python"
    python.write_text(f'#!/bin/bash\nif [ "$2" = agent.first_token ]; then exec {sys.executable} "$@"; fi\n'
                      'echo "$TRAINJOBS_STORAGE_TOKEN_URI"; stat -c %a "$TRAINJOBS_STORAGE_TOKEN_FILE"\n'
                      'cat "$TRAINJOBS_STORAGE_TOKEN_FILE"\n')
    python.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "TRAINJOBS_SKIP_INSTALL": "1", "TRAINJOBS_PYTHON": str(python),
           "TMPDIR": str(disk), "TRAINJOBS_METADATA_URL": metadata_url, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen(["bash", "-c", script], env=env, cwd=disk, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _until_booted(hosts: list[subprocess.Popen[str]], look: Callable[[], object]) -> list[str]:
    """Each host's output once its script ends; `look` is the driver's poll of the machine meanwhile."""
    def ended() -> bool:
        look()
        return all(h.poll() is not None for h in hosts)

    eventually(ended, 60, "every host got its token and ended its script", every=0.1)
    outputs = []
    for h in hosts:
        out, err = h.communicate()
        assert h.returncode == 0, err
        outputs.append(out)
    return outputs


def _got_token(output: str, job_dir: str) -> None:
    uri, mode, token = output.splitlines()
    assert uri == JobPaths(job_dir).storage_token and mode == "600"
    assert json.loads(token)["access_token"] == f"ya29.token-of-{JOB}"


def _usable(value: str) -> bool:
    """Whether a metadata value gives its reader the token: in the clear, or sealed to a key the reader has."""
    if "ya29" in value:
        return True
    try:
        return open_mine(value, KeyPair.generate(), "any") is not None
    except SealError:
        return False


@pytest.fixture
def tpu(tmp_path: Path) -> Iterator[FakeTpuApi]:
    with FakeTpuApi(sandbox=tmp_path / "cloud", boot=False, timing=Timing(boot_s=0.1, delete_s=0.1)) as api:
        yield api


@pytest.fixture
def compute(tmp_path: Path) -> Iterator[FakeComputeApi]:
    with FakeComputeApi(sandbox=tmp_path / "cloud", boot=False, timing=ComputeTiming(boot_s=0.1, delete_s=0.1)) as api:
        yield api


def test_every_host_of_a_tpu_slice_gets_the_token_and_no_reader_of_node_metadata_can_use_it(
        bucket: str, tpu: FakeTpuApi, tmp_path: Path) -> None:
    request = _request(bucket, {"type": "tpu", "tpu_type": "v4-16"})  # two hosts
    script = startup_script(request.job_dir, agent_wheel_uri(bucket, "x", "trainjobs.whl"))
    config = GcpConfig(project="proj", zone=ZONE, tpu_api_endpoint=tpu.url)
    p = TpuVmProvisioner(config, startup=lambda r: script, create_wait_s=scaled(30), backoff_s=0.01,
                         tokens=JobTokens(_minter))
    p.create(request)
    hosts = [_boot(tmp_path, f"host-{i}", script, tpu.metadata_url(request.name, i)) for i in range(2)]
    for output in _until_booted(hosts, lambda: p.get(request)):
        _got_token(output, request.job_dir)

    # Another tenant's VM, with an identity that may get and list nodes, reads everything the API shows.
    other_tenant = tpu_client(config)
    [node] = other_tenant.list_nodes(parent=f"projects/proj/locations/{ZONE}")
    assert node.metadata and not [k for k, v in node.metadata.items() if _usable(v)]
    assert [r for r in tpu.requests if r.method == "POST" and r.path.endswith("/nodes")]  # created through the API
    assert not [r for r in tpu.requests if "ya29" in json.dumps(r.body)]  # nor did any request carry it
    p.delete(request.name)


def test_a_compute_engine_vm_gets_the_token_and_no_reader_of_instance_metadata_can_use_it(
        bucket: str, compute: FakeComputeApi, tmp_path: Path) -> None:
    request = _request(bucket, {"type": "gpu", "gpu_type": "nvidia-l4"}, workers=2)
    script = startup_script(request.job_dir, agent_wheel_uri(bucket, "x", "trainjobs.whl"))
    config = GcpConfig(project="proj", zone=ZONE, compute_api_endpoint=compute.url)
    p = GceVmProvisioner(config, startup=lambda r: script, create_wait_s=scaled(30), backoff_s=0.01, poll_s=0.02,
                         tokens=JobTokens(_minter))
    p.create(request)
    hosts = [_boot(tmp_path, f"host-{i}", script, compute.metadata_url(f"{request.name}-{i}", 0)) for i in range(2)]
    for output in _until_booted(hosts, lambda: p.get(request)):
        _got_token(output, request.job_dir)

    other_tenant = compute_clients(config).instances
    vms = list(other_tenant.list(request={"project": "proj", "zone": ZONE}))
    assert len(vms) == 2 and not [i.key for vm in vms for i in vm.metadata.items if _usable(i.value)]
    assert not [r for r in compute.requests if "ya29" in json.dumps(r.body)]
    p.delete(request.name)


def test_the_worker_writes_the_sealed_token_once_and_then_only_rechecks_now_and_then(
        bucket: str, tpu: FakeTpuApi, tmp_path: Path) -> None:
    request = _request(bucket, {"type": "tpu", "tpu_type": "v5litepod-8"})
    script = startup_script(request.job_dir, agent_wheel_uri(bucket, "x", "trainjobs.whl"))
    p = TpuVmProvisioner(GcpConfig(project="proj", zone=ZONE, tpu_api_endpoint=tpu.url), startup=lambda r: script,
                         create_wait_s=scaled(30), backoff_s=0.01, tokens=JobTokens(_minter))
    p.create(request)
    _until_booted([_boot(tmp_path, "host-0", script, tpu.metadata_url(request.name, 0))], lambda: p.get(request))
    asked = len([r for r in tpu.requests if r.path.endswith(":getGuestAttributes")])
    for _ in range(20):  # the driver's polls of a running machine
        p.get(request)
    assert len([r for r in tpu.requests if r.method == "PATCH"]) == 1
    assert len([r for r in tpu.requests if r.path.endswith(":getGuestAttributes")]) == asked


def test_a_host_that_comes_back_with_a_new_key_gets_the_token_sealed_to_that_key(
        bucket: str, tpu: FakeTpuApi, tmp_path: Path) -> None:
    request = _request(bucket, {"type": "tpu", "tpu_type": "v5litepod-8"})
    script = startup_script(request.job_dir, agent_wheel_uri(bucket, "x", "trainjobs.whl"))
    p = TpuVmProvisioner(GcpConfig(project="proj", zone=ZONE, tpu_api_endpoint=tpu.url), startup=lambda r: script,
                         create_wait_s=scaled(30), backoff_s=0.01, tokens=JobTokens(_minter))
    p.create(request)
    _until_booted([_boot(tmp_path, "host-0", script, tpu.metadata_url(request.name, 0))], lambda: p.get(request))
    # Google restarted the host: its startup script runs again, with a key of its own making.
    restarted = KeyPair.generate()
    put = httpx.put(f"{tpu.metadata_url(request.name, 0)}/instance/guest-attributes/{PUBLIC_KEY_PATH}",
                    content=restarted.public_text, headers={"Metadata-Flavor": "Google"})
    assert put.status_code == 200
    p._token_checks = DueChecks(recheck_s=0)  # the half minute between rechecks has passed
    p.get(request)
    sealed = (tpu.node(request.name) or {})["metadata"][SEALED_KEY]
    assert json.loads(open_mine(sealed, restarted, request.name) or "{}")["access_token"] == f"ya29.token-of-{JOB}"


def test_a_host_whose_token_never_comes_stops_its_boot_instead_of_waiting_forever(
        tpu: FakeTpuApi, tmp_path: Path) -> None:
    node = {"acceleratorType": "v5litepod-8", "runtimeVersion": "tpu-vm-tf-2.18.0-pjrt",
            "metadata": create_metadata("n1")}
    assert httpx.post(f"{tpu.url}/v2/projects/proj/locations/{ZONE}/nodes?nodeId=n1", json=node).status_code == 200
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "agent.first_token", "--metadata-url", tpu.metadata_url("n1", 0),
                           "--out", str(tmp_path / "token.json"), "--timeout-s", "1"],
                          capture_output=True, text=True, timeout=scaled(30), cwd=REPO_ROOT)
    assert done.returncode == 1 and "no storage token sealed to this host's key" in done.stderr
    assert time.monotonic() - started < scaled(20) and not (tmp_path / "token.json").exists()
    assert list(tpu.guest_attributes("n1")) == [PUBLIC_KEY_PATH]  # it did publish its key


