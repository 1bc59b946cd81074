"""GPU jobs through the whole product: API -> worker -> gcp provisioner (Compute Engine for GPU jobs) ->
real google-cloud-compute client -> fake Compute Engine API -> (startup script -> agent), with real
PostgreSQL and the GCS emulator. CPU devices stand in for the GPUs."""

from __future__ import annotations

from pathlib import Path
from typing import Any


from service.db.session import get_engine
from tests.support.jobs import TERMINAL_STATUSES as TERMINAL
from tests.support.jobs import wait_for_job as wait
from tests.support.gcp import FALLBACK, ZONE, gpu_spec, wait_for_vms


# --- the control plane, no training --------------------------------------------------------------

def test_a_stockout_sends_the_vms_to_the_fallback_zone_and_cancel_deletes_them_all(
        api: Any, make_gce: Any, database_url: str, tmp_path: Path) -> None:
    gce = make_gce()
    gce.fake.stock_out(ZONE)
    gce.start_worker(database_url, tmp_path / "staging")
    job = api.post("/v1/jobs", json=gpu_spec(count=1, workers=2)).json()
    vms = wait_for_vms(gce.fake, 2)
    assert all(gce.fake.instance(n)["zone"].endswith(f"/zones/{FALLBACK}") for n in vms)
    api.post(f"/v1/jobs/{job['id']}/cancel")
    assert wait(api, job["id"], lambda j: j["status"] in TERMINAL)["status"] == "CANCELLED"
    assert gce.fake.instance_names() == []



def test_a_worker_told_its_accelerator_types_claims_only_those_jobs(api: Any, database_url: str) -> None:
    from service.db import queue

    gpu_job = api.post("/v1/jobs", json=gpu_spec()).json()
    with get_engine(database_url).connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        assert queue.claim_next_job(conn, "tpu-worker", 30, serves=("tpu",)) is None
        claim = queue.claim_next_job(conn, "gpu-worker", 30, serves=("gpu", "cpu"))
    assert claim is not None and str(claim.job_id) == gpu_job["id"]
