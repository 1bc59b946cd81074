"""TPU jobs through the whole product: API -> worker -> Cloud TPU provisioner -> real google-cloud-tpu
client -> fake TPU API -> (startup script -> agent), with real PostgreSQL and the GCS emulator."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from service.db.session import get_engine
from stack.fakecloud import FakeTpuApi
from stack.fakecloud.tpu_inventory import Timing
from tests.conftest import TERMINAL_STATUSES as TERMINAL
from tests.conftest import wait_for_job as wait
from tests.conftest import digits_spec, scaled
from trainjobs import storage
from trainjobs.spec import JobSpec
from worker.cloud.config import GcpConfig
from worker.cloud.reaper import reap_orphans
from worker.driver import DriverConfig
from worker.gcs_channel import GcsJobChannel
from worker.loop import Worker, WorkerConfig
from worker.provisioner import MachineRequest
from worker.provisioners.gcp_tpu import TpuVmProvisioner
from worker.staging_adapter import GcsStager

ZONE = "us-central1-a"


def tpu_spec(spot: bool = False, **overrides: Any) -> dict[str, Any]:
    return digits_spec(accelerator={"type": "tpu", "tpu_type": "v5litepod-8", "spot": spot}, strategy="auto", **overrides)


@dataclass
class GcpStack:
    fake: FakeTpuApi
    provisioner: TpuVmProvisioner
    worker: Worker | None = None

    def start_worker(self, database_url: str, staging: Path, **driver: Any) -> None:
        self.worker = Worker(get_engine(database_url), self.provisioner, GcsJobChannel(), GcsStager(staging),
                             WorkerConfig(concurrency=2, lease_s=30, heartbeat_s=1, poll_s=0.3, name="gcp-test",
                                          driver=DriverConfig(poll_s=0.3, **driver)))
        self.worker.start()


@pytest.fixture
def make_gcp(db: Any, bucket: str, tmp_path: Path) -> Iterator[Callable[..., GcpStack]]:
    """make_gcp(**fake options): a fake TPU API (by default its VMs do not boot) and a provisioner on it;
    the test starts the worker when it is ready."""
    stacks: list[GcpStack] = []

    def make(config: dict[str, Any] | None = None, **options: Any) -> GcpStack:
        options = {"boot": False, "timing": Timing(boot_s=0.3, delete_s=0.2), **options}
        fake = FakeTpuApi(sandbox=tmp_path / "vms", **options).start()
        provisioner = TpuVmProvisioner(GcpConfig(project="proj", zone=ZONE, tpu_api_endpoint=fake.url, **(config or {})),
                                       create_wait_s=0, delete_wait_s=scaled(30), backoff_s=0.01)
        stacks.append(GcpStack(fake, provisioner))
        return stacks[-1]

    yield make
    for stack in stacks:
        if stack.worker is not None:
            stack.worker.shutdown(timeout=10)
        stack.fake.stop()


def wait_for_node(fake: FakeTpuApi, state: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + scaled(timeout)
    while not (names := [n for n in fake.node_names() if (fake.node(n) or {}).get("state") == state]):
        assert time.monotonic() < deadline, f"no {state} node: {fake.node_names()}"
        time.sleep(0.1)
    return names[0]


def test_a_job_queued_for_capacity_waits_past_the_boot_timeout_then_fails_saying_so(
        api: Any, make_gcp: Any, database_url: str, tmp_path: Path) -> None:
    gcp = make_gcp(config={"capacity_wait_s": scaled(4)})
    gcp.provisioner.create_wait_s = scaled(30)  # a stockout is the create operation's error: follow it
    gcp.fake.stock_out(ZONE)
    gcp.start_worker(database_url, tmp_path / "staging", boot_timeout_s=0.5)  # far shorter than the queue's wait
    job = api.post("/v1/jobs", json=tpu_spec()).json()
    done = wait(api, job["id"], lambda j: j["status"] == "FAILED", timeout=60)
    # Queued, not booting: no new attempt after 0.5 s, and the end says why, in Google's terms of place and type.
    assert done["attempt"] == 1
    assert done["error"] == f"no capacity in {ZONE} for v5litepod-8 after {scaled(4):.0f} seconds"
    events = api.get(f"/v1/jobs/{job['id']}/events").json()["events"]
    assert "RECOVERING" not in [e["to_status"] for e in events]
    assert gcp.fake.node_names() == [] and gcp.fake.queued_names() == []


def test_cancel_while_the_node_is_creating_deletes_it(api: Any, make_gcp: Any, database_url: str, tmp_path: Path) -> None:
    gcp = make_gcp(timing=Timing(boot_s=scaled(600)))
    gcp.start_worker(database_url, tmp_path / "staging")
    job = api.post("/v1/jobs", json=tpu_spec()).json()
    wait_for_node(gcp.fake, "CREATING")
    api.post(f"/v1/jobs/{job['id']}/cancel")
    assert wait(api, job["id"], lambda j: j["status"] in TERMINAL)["status"] == "CANCELLED"
    assert gcp.fake.node_names() == []


def test_cancel_while_the_node_is_ready_deletes_it(api: Any, make_gcp: Any, database_url: str, tmp_path: Path) -> None:
    gcp = make_gcp()
    gcp.start_worker(database_url, tmp_path / "staging")
    job = api.post("/v1/jobs", json=tpu_spec()).json()
    wait_for_node(gcp.fake, "READY")
    api.post(f"/v1/jobs/{job['id']}/cancel")
    assert wait(api, job["id"], lambda j: j["status"] in TERMINAL)["status"] == "CANCELLED"
    assert gcp.fake.node_names() == []


def test_a_node_left_by_a_dead_worker_is_adopted_not_created_again(api: Any, make_gcp: Any, database_url: str,
                                                                   tmp_path: Path) -> None:
    gcp = make_gcp()
    job = api.post("/v1/jobs", json=tpu_spec()).json()
    # A worker created the node and was killed -9 before it recorded anything.
    spec = JobSpec.model_validate(job["spec"])
    gcp.provisioner.create(MachineRequest(job["id"], 1, spec, GcsJobChannel().job_dir(job["id"])))
    gcp.start_worker(database_url, tmp_path / "staging")
    wait(api, job["id"], lambda j: j["status"] == "PROVISIONING")
    wait_for_node(gcp.fake, "READY")
    api.post(f"/v1/jobs/{job['id']}/cancel")
    wait(api, job["id"], lambda j: j["status"] in TERMINAL)
    assert len([r for r in gcp.fake.requests if r.method == "POST" and r.path.endswith("/nodes")]) == 1
    assert gcp.fake.node_names() == []


def test_a_quota_refusal_fails_the_job_with_the_clouds_message(api: Any, make_gcp: Any, database_url: str,
                                                               tmp_path: Path) -> None:
    gcp = make_gcp()
    gcp.fake.set_quota(ZONE, 4)
    gcp.start_worker(database_url, tmp_path / "staging")
    job = api.post("/v1/jobs", json=tpu_spec()).json()
    done = wait(api, job["id"], lambda j: j["status"] in TERMINAL)
    assert done["status"] == "FAILED"
    assert done["error"].startswith("Quota limit 'TPUS-per-project-per-zone' has been exceeded.")
    assert len([r for r in gcp.fake.requests if r.method == "POST"]) == 1


def test_the_reaper_deletes_nodes_of_ended_and_unknown_jobs_only(api: Any, make_gcp: Any, db: Any) -> None:
    gcp = make_gcp()
    live = api.post("/v1/jobs", json=tpu_spec()).json()
    ended = api.post("/v1/jobs", json=tpu_spec()).json()
    api.post(f"/v1/jobs/{ended['id']}/cancel")
    spec = JobSpec.model_validate(live["spec"])
    for job_id in (live["id"], ended["id"], str(uuid.uuid4())):
        gcp.provisioner.create(MachineRequest(job_id, 1, spec, GcsJobChannel().job_dir(job_id)))
    assert reap_orphans(gcp.provisioner, db) == 2
    assert gcp.fake.node_names() == [MachineRequest(live["id"], 1, spec, "").name]


# --- the whole way: the startup script boots the real agent on CPU devices standing in for chips ----

@pytest.mark.tf
def test_a_tpu_job_trains_through_the_startup_script_and_its_node_is_deleted(api: Any, make_gcp: Any,
                                                                              database_url: str, tmp_path: Path) -> None:
    gcp = make_gcp(boot=True)
    gcp.start_worker(database_url, tmp_path / "staging")
    job = api.post("/v1/jobs", json=tpu_spec(training={"epochs": 1})).json()
    done = wait(api, job["id"], lambda j: j["status"] in TERMINAL, timeout=600)
    assert done["status"] == "SUCCEEDED", done
    assert done["runtime"]["strategy"] == "mirrored" and done["runtime"]["precision"] == "mixed_bfloat16"
    assert gcp.fake.node_names() == []
    [create] = [r for r in gcp.fake.requests if r.method == "POST" and r.path.endswith("/nodes")]
    assert "-m worker.agent --job-dir" in create.body["metadata"]["startup-script"]  # type: ignore[index]


@pytest.mark.tf
def test_a_preempted_node_is_replaced_and_the_new_attempt_resumes_from_the_checkpoint(
        api: Any, make_gcp: Any, database_url: str, tmp_path: Path) -> None:
    gcp = make_gcp(boot=True)
    gcp.start_worker(database_url, tmp_path / "staging")
    # Small batches, one step per call: epochs long enough that the preemption lands mid-training.
    job = api.post("/v1/jobs", json=tpu_spec(spot=True, steps_per_execution=1,
                                             training={"epochs": 3, "per_replica_batch_size": 4})).json()
    job_dir = GcsJobChannel().job_dir(job["id"])
    deadline = time.monotonic() + scaled(600)
    while (taken := storage.read_json(f"{job_dir}/checkpoints/latest.json")) is None:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    [node] = gcp.fake.node_names()
    gcp.fake.preempt(node)
    done = wait(api, job["id"], lambda j: j["status"] in TERMINAL, timeout=600)
    assert (done["status"], done["attempt"]) == ("SUCCEEDED", 2), done
    assert done["runtime"]["initial_epoch"] == taken["epoch"] >= 1
    history = storage.read_json(f"{job_dir}/artifacts/history.json")
    assert [e["epoch"] for e in history] == [1, 2, 3]
    assert gcp.fake.node_names() == []
