"""A job's storage boundary comes from what its code cannot touch (issue 18, finding 1), and a gcp worker
asks only the cloud product a job runs on (issue 18, low).

The boundary is computed by the worker from the job's row and the staged dataset's manifest, which only
the worker writes. Here the job (the test, writing with the job's own access: into jobs/<id>/ only)
rewrites its spec.json and plants a manifest naming other projects' objects; every boundary the worker
hands out afterwards, on adoption by a fresh worker or at a later attempt's create, is the original."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.support.jobs import TERMINAL_STATUSES as TERMINAL
from tests.support import eventually, scaled
from tests.support.jobs import wait_for_job as wait
from tests.support.gcp import GcpStack, tpu_spec, wait_for_node
from trainjobs import storage
from trainjobs.job_paths import DATASETS, JOBS, UPLOADS, JobPaths, dataset_file, dataset_manifest, dataset_uri
from trainjobs.messages import AgentReport, AgentState
from trainjobs.spec import JobSpec
from trainjobs.uploads import upload_prefix
from trainjobs.vm_metadata import LABEL_JOB
from worker import prometheus
from worker.boundary.access import JobBoundary, Scope, job_boundary
from worker.gcp.config import GcpConfig
from worker.gcp.job_tokens import JobTokens
from worker.gcs_channel import GcsJobChannel
from worker.ports import MachineRequest
from worker.gcp.router import GcpProvisioner
from worker.gcp.compute import GceVmProvisioner
from worker.gcp.tpu import TpuVmProvisioner
from worker.local.provisioner import LocalProvisioner

ZONE = "us-central1-a"
OTHER_PROJECT, OTHER_JOB = "22222222-2222-4222-8222-222222222222", "6a1e9d42-1111-4c1e-8d7a-3b1c2d3e4f50"


class Minter:
    """Stands in for the token exchange and keeps every boundary a token was minted for."""

    def __init__(self) -> None:
        self.boundaries: list[JobBoundary] = []

    def __call__(self, boundary: JobBoundary) -> Callable[[], tuple[str, datetime]]:
        self.boundaries.append(boundary)
        return lambda: (f"token-{boundary.job_id}", datetime.now(UTC) + timedelta(hours=1))


class StandInAgent:
    """Reports for attempt 1 through status.json, as the agent on the node would, until told to finish."""

    def __init__(self, job_dir: str) -> None:
        self.paths, self.finish, self._stop = JobPaths(job_dir), threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            state = AgentState.SUCCEEDED if self.finish.is_set() else AgentState.RUNNING
            storage.write_json(self.paths.status, AgentReport(state=state, attempt=1, heartbeat_at=datetime.now(UTC),
                                                              progress=1.0 if self.finish.is_set() else 0.5
                                                              ).model_dump(mode="json"))
            self._stop.wait(0.3)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(scaled(10))


def widen_from_inside(job_dir: str, bucket: str) -> None:
    """What a job's code can do with its own access: rewrite its spec.json (dataset_uri, model.module) and
    plant a 'manifest' in its own directory naming other projects' uploads and another job's token."""
    paths = JobPaths(job_dir)
    planted = f"{job_dir}/planted"
    storage.write_json(dataset_manifest(planted), {"splits": {"train": {"shards": [
        f"gs://{bucket}/{upload_prefix(OTHER_PROJECT, 'b' * 64)}their_model.py",
        JobPaths.for_job(OTHER_JOB, bucket).storage_token]}}})
    spec = storage.read_json(paths.spec)
    spec["dataset_uri"] = planted
    spec["spec"]["model"] = {"module": f"gs://{bucket}/{UPLOADS}/", "function": "build_model"}
    storage.write_json(paths.spec, spec)


# --- finding 1: the boundary ---------------------------------------------------------------------

def test_a_fresh_worker_adopting_a_running_node_mints_the_boundary_the_job_started_with_whatever_the_job_wrote(
        api: Any, make_gcp: Any, bucket: str, database_url: str, tmp_path: Path) -> None:
    minted_at_create, minted_on_adoption = Minter(), Minter()
    first = make_gcp()
    first.provisioner.tokens = JobTokens(minted_at_create)
    first.start_worker(database_url, tmp_path / "staging")
    job = api.post("/v1/jobs", json=tpu_spec()).json()
    job_dir = GcsJobChannel().job_dir(job["id"])
    agent = StandInAgent(job_dir)
    try:
        wait(api, job["id"], lambda j: j["status"] == "RUNNING")
        wait_for_node(first.fake, "READY")  # a node still booting is not adopted but replaced
        [original] = minted_at_create.boundaries
        assert original.write == (Scope(bucket, f"{JOBS}/{job['id']}/"),)
        assert [s.key.split("/")[0] for s in original.read] == [DATASETS]

        widen_from_inside(job_dir, bucket)
        first.worker.shutdown(timeout=scaled(10))  # a deploy: the node keeps running, the job is handed back
        first.worker = None
        successor = GcpStack(first.fake, TpuVmProvisioner(
            GcpConfig(project="proj", zone=ZONE, tpu_api_endpoint=first.fake.url), create_wait_s=0,
            delete_wait_s=scaled(30), backoff_s=0.01, tokens=JobTokens(minted_on_adoption)))
        successor.start_worker(database_url, tmp_path / "staging")
        try:
            eventually(lambda: minted_on_adoption.boundaries, 60,
                       "the successor adopted the node and minted its token")
            assert minted_on_adoption.boundaries == [original]
            agent.finish.set()
            done = wait(api, job["id"], lambda j: j["status"] in TERMINAL)
            assert (done["status"], done["attempt"]) == ("SUCCEEDED", 1)
        finally:
            assert successor.worker is not None
            successor.worker.shutdown(timeout=scaled(10))
    finally:
        agent.stop()


def test_a_later_attempts_local_machine_is_guarded_by_the_requests_boundary_not_by_what_the_job_wrote(
        bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job_id = str(uuid.uuid4())
    channel = GcsJobChannel(bucket)
    spec = JobSpec.model_validate({"name": "t", "dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp"}})
    dataset = dataset_uri("d" * 64, bucket)
    storage.write_json(dataset_manifest(dataset), {"splits": {"train": {"shards": [dataset_file(dataset, "train-0.tfrecord")]}}})
    storage.bucket(bucket).blob(f"{upload_prefix(OTHER_PROJECT, 'b' * 64)}their_model.py").upload_from_string(b"theirs")
    channel.prepare(job_id, 2, spec, dataset)
    widen_from_inside(channel.job_dir(job_id), bucket)  # attempt 1's code, before its machine was lost
    request = MachineRequest(job_id, 2, spec, channel.job_dir(job_id),
                             job_boundary(job_id, spec, dataset, channel.job_dir(job_id)))
    monkeypatch.setenv("TRAINJOBS_LOCAL_ZYGOTE", "0")  # the agent itself is not what this looks at
    provisioner = LocalProvisioner(tmp_path / "machines")
    provisioner.create(request)
    try:
        machine_dir = tmp_path / "machines" / request.name
        assert JobBoundary.from_json((machine_dir / "boundary.json").read_text()) == request.boundary
        guard = f"http://127.0.0.1:{(machine_dir / 'storage-guard.port').read_text()}"
        their_model = quote(f"{upload_prefix(OTHER_PROJECT, 'b' * 64)}their_model.py", safe="")
        manifest = quote(storage.split_uri(dataset_manifest(dataset))[1], safe="")
        assert httpx.get(f"{guard}/storage/v1/b/{bucket}/o/{manifest}?alt=media").status_code == 200
        assert httpx.get(f"{guard}/storage/v1/b/{bucket}/o/{their_model}?alt=media").status_code == 403
    finally:
        provisioner.delete(request.name)
        provisioner.close()


def test_a_dataset_uri_outside_the_staged_datasets_is_refused_not_trusted(bucket: str) -> None:
    spec = JobSpec.model_validate({"name": "t", "dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp"}})
    job_dir = GcsJobChannel(bucket).job_dir("j")
    for uri in (f"{job_dir}/planted", f"gs://{bucket}/{UPLOADS}/{OTHER_PROJECT}", dataset_uri("d" * 64, "other"),
                f"{dataset_uri('d' * 64, bucket)}/../../{JOBS}/j"):
        with pytest.raises(ValueError, match="is not a staged dataset"):
            job_boundary("j", spec, uri, job_dir)


# --- low: a product nobody uses must not break the other ---------------------------------------------

class DisabledApi:
    """A Google API as it answers every call in a project where it is off: 403, status
    PERMISSION_DENIED, reason SERVICE_DISABLED (and the older accessNotConfigured)."""

    def __init__(self, title: str, service: str) -> None:
        message = f"{title} has not been used in project proj before or it is disabled."
        self.body = json.dumps({"error": {
            "code": 403, "status": "PERMISSION_DENIED", "message": message,
            "errors": [{"message": message, "domain": "usageLimits", "reason": "accessNotConfigured"}],
            "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "SERVICE_DISABLED",
                         "domain": "googleapis.com", "metadata": {"service": service}}]}}).encode()
        self.requests: list[str] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                api.requests.append(f"{self.command} {self.path}")
                self.send_response(403)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(api.body)))
                self.end_headers()
                self.wfile.write(api.body)

            do_GET = do_POST = do_PATCH = do_DELETE = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def compute_disabled() -> Iterator[DisabledApi]:
    api = DisabledApi("Compute Engine API", "compute.googleapis.com")
    yield api
    api.close()


@pytest.fixture
def tpu_disabled() -> Iterator[DisabledApi]:
    api = DisabledApi("Cloud TPU API", "tpu.googleapis.com")
    yield api
    api.close()


def gcp_worker(fake_tpu_url: str, compute_url: str, database_url: str, staging: Path) -> Any:
    from service.db.session import get_engine
    from worker.driver import DriverConfig
    from worker.loop import Worker, WorkerConfig
    from worker.staging_adapter import GcsStager

    config = GcpConfig(project="proj", zone=ZONE, tpu_api_endpoint=fake_tpu_url, compute_api_endpoint=compute_url)
    provisioner = GcpProvisioner(
        TpuVmProvisioner(config, create_wait_s=0, delete_wait_s=scaled(30), backoff_s=0.01),
        GceVmProvisioner(config, backoff_s=0.01, poll_s=0.05))
    worker = Worker(get_engine(database_url), provisioner, GcsJobChannel(), GcsStager(staging),
                    WorkerConfig(concurrency=2, lease_s=30, heartbeat_s=1, poll_s=0.3, name=f"gcp-{uuid.uuid4().hex[:6]}",
                                 driver=DriverConfig(poll_s=0.3)))
    worker.start()
    return worker


def test_tpu_jobs_run_and_are_adopted_in_a_project_whose_compute_engine_api_is_disabled(
        api: Any, make_gcp: Any, compute_disabled: DisabledApi, database_url: str, tmp_path: Path) -> None:
    def errors() -> float:
        return prometheus.REGISTRY.get_sample_value("trainjobs_worker_driver_errors_total", {"kind": "error"}) or 0.0

    tpu = make_gcp()
    failures_before = errors()
    first = gcp_worker(tpu.fake.url, compute_disabled.url, database_url, tmp_path / "staging")
    job = api.post("/v1/jobs", json=tpu_spec()).json()
    agent = StandInAgent(GcsJobChannel().job_dir(job["id"]))
    try:
        wait(api, job["id"], lambda j: j["status"] == "RUNNING")
        wait_for_node(tpu.fake, "READY")  # a node still booting is not adopted but replaced
        first.shutdown(timeout=scaled(10))  # a deploy: the next worker adopts the node
        successor = gcp_worker(tpu.fake.url, compute_disabled.url, database_url, tmp_path / "staging")
        try:
            eventually(lambda: any(e["reason"].startswith("adopted running machine") for e in
                                   api.get(f"/v1/jobs/{job['id']}/events").json()["events"]), 60, "the node adopted")
            agent.finish.set()
            done = wait(api, job["id"], lambda j: j["status"] in TERMINAL)
        finally:
            successor.shutdown(timeout=scaled(10))
    finally:
        agent.stop()
    assert (done["status"], done["attempt"], done["error"]) == ("SUCCEEDED", 1, None)
    assert errors() == failures_before  # no driver step failed
    assert tpu.fake.node_names() == []
    assert compute_disabled.requests  # asked (for machines of the job by label), and its 403 was no failure


def test_gpu_machines_are_created_found_and_deleted_in_a_project_whose_cloud_tpu_api_is_disabled(
        tpu_disabled: DisabledApi, tmp_path: Path, gcs_emulator: Any) -> None:
    from stack.fakecloud import FakeComputeApi
    from stack.fakecloud.compute_inventory import ComputeTiming

    with FakeComputeApi(sandbox=tmp_path, boot=False, timing=ComputeTiming(boot_s=0.1, delete_s=0.1)) as compute:
        config = GcpConfig(project="proj", zone=ZONE, tpu_api_endpoint=tpu_disabled.url, compute_api_endpoint=compute.url)

        def gcp() -> GcpProvisioner:  # a fresh worker's: it knows no machine yet
            return GcpProvisioner(TpuVmProvisioner(config, backoff_s=0.01),
                                  GceVmProvisioner(config, startup=lambda r: "#!/bin/bash\n", create_wait_s=scaled(30),
                                                   backoff_s=0.01, poll_s=0.02))

        spec = JobSpec.model_validate({"dataset": {"source": "sklearn:digits"}, "model": {"name": "cnn"},
                                       "accelerator": {"type": "gpu", "gpu_type": "nvidia-tesla-t4"}})
        request = MachineRequest("gpu-job", 1, spec, JobPaths.for_job("gpu-job", "b").root)
        gcp().create(request)
        assert gcp().get(request) is not None
        assert [m.name for m in gcp().list({LABEL_JOB: "gpu-job"})] == [request.name]
        gcp().delete(request.name)
        assert compute.instance_names() == []
        assert tpu_disabled.requests  # asked when the product was unknown (list, delete), and its 403 failed nothing
