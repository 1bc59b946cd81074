"""Per-job storage tokens on cloud VMs: the worker publishes them, the VM's startup script and agent
use them, and nothing else of the job's storage is in the VM's hands."""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path


from stack.fakecloud import FakeTpuApi
from tests.support.jobs import digits_spec
from tests.support import eventually, scaled
from trainjobs import storage
from trainjobs.job_paths import JobPaths, dataset_uri
from trainjobs.spec import JobSpec
from worker.boundary.access import JobBoundary, Scope
from agent.token_refresh import refresh_once
from worker.gcp.bootstrap import startup_script
from worker.gcp.config import GcpConfig
from worker.gcp.job_tokens import JobTokens
from worker.gcs_channel import GcsJobChannel
from worker.ports import MachineRequest
from worker.gcp.tpu import TpuVmProvisioner

ZONE = "us-central1-a"


class Minter:
    """Stands in for the token exchange: each token says which boundary it was minted for."""

    def __init__(self, life_s: float = 3600.0) -> None:
        self.life_s, self.boundaries, self.count = life_s, [], 0

    def __call__(self, boundary: JobBoundary):  # type: ignore[no-untyped-def]
        self.boundaries.append(boundary)

        def mint() -> tuple[str, datetime]:
            self.count += 1
            return f"token-{boundary.job_id}-{self.count}", datetime.now(UTC) + timedelta(seconds=self.life_s)

        return mint


def _job(bucket: str, job_id: str = "8d0c7f0e-5a34-4d59-8d7b-0a8e61c0b7d1") -> MachineRequest:
    spec = JobSpec.model_validate(digits_spec(accelerator={"type": "tpu", "tpu_type": "v5litepod-8"}, strategy="tpu"))
    channel = GcsJobChannel(bucket)
    dataset = dataset_uri("a" * 64, bucket)
    channel.prepare(job_id, 1, spec, dataset)
    boundary = JobBoundary(job_id, read=(Scope.from_uri(dataset, directory=True),),
                           write=(Scope.from_uri(channel.job_dir(job_id), directory=True),))
    return MachineRequest(job_id, 1, spec, channel.job_dir(job_id), boundary)


FAKE = FakeTpuApi  # the `fake` fixture (tests/conftest.py): its VMs do not boot


def test_the_worker_publishes_each_new_token_in_the_job_directory_until_the_machine_goes(bucket: str) -> None:
    request, minter = _job(bucket), Minter(life_s=0.4)
    tokens = JobTokens(minter, min_wait_s=0.05)
    first = json.loads(tokens.start(request))
    assert first["access_token"] == f"token-{request.job_id}-1"
    assert minter.boundaries == [request.boundary]  # minted for the boundary the request carries
    published = JobPaths.of(request.job_dir).storage_token
    eventually(lambda: (storage.read_json(published) or {}).get("access_token") != first["access_token"], 10,
               "a newer token was published")
    tokens.stop(request.name)
    assert tokens.running() == []
    settled = minter.count
    time.sleep(0.5)
    assert minter.count == settled  # stopped with its machine


def test_the_agent_copies_a_newer_published_token_into_its_file_and_never_an_older_one(bucket: str,
                                                                                         tmp_path: Path) -> None:
    uri, token_file = JobPaths.for_job("j", bucket).storage_token, tmp_path / "storage-token.json"
    now = datetime.now(UTC)
    token_file.write_text(json.dumps({"access_token": "old", "expiry": (now + timedelta(minutes=10)).isoformat()}))
    storage.write_json(uri, {"access_token": "older", "expiry": (now + timedelta(minutes=5)).isoformat()})
    assert not refresh_once(token_file, uri)
    storage.write_json(uri, {"access_token": "new", "expiry": (now + timedelta(minutes=60)).isoformat()})
    assert refresh_once(token_file, uri)
    assert json.loads(token_file.read_text())["access_token"] == "new"
    assert oct(token_file.stat().st_mode & 0o777) == "0o600"


def test_a_tpu_node_carries_no_token_in_its_metadata_and_an_adopting_worker_keeps_its_tokens_coming(
        bucket: str, fake: FakeTpuApi) -> None:
    request = _job(bucket)
    tokens = JobTokens(Minter())
    script = startup_script(request.job_dir, f"gs://{bucket}/agent/x/trainjobs.whl")
    p = TpuVmProvisioner(GcpConfig(project="proj", zone=ZONE, tpu_api_endpoint=fake.url), startup=lambda r: script,
                         create_wait_s=scaled(30), backoff_s=0.01, tokens=tokens)
    p.create(request)
    assert tokens.running() == [request.name]
    [body] = [r.body or {} for r in fake.requests if r.method == "POST" and r.path.endswith("/nodes")]
    # Other tenants' VMs may read node metadata: the hosts get the first token sealed to keys of their own
    # (tests/test_sealed_tokens.py), so no token is in what the node was created with.
    assert f"token-{request.job_id}" not in json.dumps(body)

    # A new worker (the first died) keeps the adopted node's tokens coming; deleting the node stops them.
    successor = TpuVmProvisioner(GcpConfig(project="proj", zone=ZONE, tpu_api_endpoint=fake.url),
                                 startup=lambda r: script, backoff_s=0.01, tokens=JobTokens(Minter()))
    successor.get(request)
    assert successor.tokens is not None and successor.tokens.running() == [request.name]
    successor.delete(request.name)
    assert successor.tokens.running() == []


def test_without_a_token_the_startup_script_sets_none(bucket: str, fake: FakeTpuApi, tmp_path: Path) -> None:
    request = _job(bucket)
    script = startup_script(request.job_dir, f"gs://{bucket}/agent/x/trainjobs.whl")
    p = TpuVmProvisioner(GcpConfig(project="proj", zone=ZONE, tpu_api_endpoint=fake.url), startup=lambda r: script,
                         create_wait_s=scaled(30), backoff_s=0.01)
    assert p.tokens is None  # storage is the emulator here: it checks no token
    p.create(request)
    python = tmp_path / "python"
    python.write_text('#!/bin/bash\necho "file=${TRAINJOBS_STORAGE_TOKEN_FILE:-none}"\n')
    python.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "TRAINJOBS_SKIP_INSTALL": "1", "TRAINJOBS_PYTHON": str(python),
           "TMPDIR": str(tmp_path), "TRAINJOBS_METADATA_URL": fake.metadata_url(request.name, 0)}
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=scaled(30))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "file=none"
