"""TPU jobs through the whole product: API -> worker -> Cloud TPU provisioner -> real google-cloud-tpu
client -> fake TPU API -> (startup script -> agent), with real PostgreSQL and the GCS emulator."""

from __future__ import annotations

from pathlib import Path
from typing import Any


from stack.fakecloud.tpu_inventory import Timing
from tests.support.jobs import TERMINAL_STATUSES as TERMINAL
from tests.support.jobs import wait_for_job as wait
from tests.support import scaled
from tests.support.gcp import ZONE, tpu_spec, wait_for_node
from trainjobs.spec import JobSpec
from worker.gcs_channel import GcsJobChannel
from worker.ports import MachineRequest


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


