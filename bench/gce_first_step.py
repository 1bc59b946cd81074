"""Time to first training step on Compute Engine, fake cloud (issue 10 §4): what the control plane adds
between "a machine is requested" and "training's first step ended", against the local provisioner
running the same job on this machine, alternating within one run.

Both run the same 2-GPU job (sklearn digits, the built-in cnn, 1 epoch; CPU devices standing in for
the GPUs) through the real worker, driver and agent, with PostgreSQL and a GCS emulator. The cloud
side goes through the real google-cloud-compute client to the fake Compute Engine API, whose VM boots
in 0.5 s (ComputeTiming's default) and runs the real startup script. Both sides pay the same agent
start (Python, TensorFlow, data download, model build), so the difference is the cloud path's own
overhead: insert, operation polling, the VM's boot, the startup script, the metadata server, storage
tokens off (the emulator). Read from the job's own figures (jobs.machines, time_to_first_step_s).

Usage: TRAINJOBS_TEST_DATABASE_URL=postgresql://... python bench/gce_first_step.py [--runs 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import bench_db  # noqa: E402


from service.db.jobstate import JobStatus  # noqa: E402
from service.db.jobs import create_job  # noqa: E402
from service.db.models import Job  # noqa: E402
from service.db.projects import ensure_project  # noqa: E402
from service.db.session import get_engine, session_factory, transaction  # noqa: E402
from stack.embedded import start_gcs_emulator, use_emulator  # noqa: E402
from stack.fakecloud import FakeComputeApi  # noqa: E402
from trainjobs.spec import JobSpec  # noqa: E402
from worker.gcp.config import GcpConfig  # noqa: E402
from worker.driver import DriverConfig  # noqa: E402
from worker.gcs_channel import GcsJobChannel  # noqa: E402
from worker.loop import Worker, WorkerConfig  # noqa: E402
from worker.ports import Provisioner  # noqa: E402
from worker.gcp.compute import GceVmProvisioner  # noqa: E402
from worker.local.provisioner import LocalProvisioner  # noqa: E402
from worker.local.sandbox import LocalIsolation  # noqa: E402
from worker.staging_adapter import GcsStager  # noqa: E402

BUCKET = "trainjobs-gcebench"
SPEC = {"name": "first-step", "dataset": {"source": "sklearn:digits"}, "model": {"name": "cnn"},
        "accelerator": {"type": "gpu", "gpu_type": "nvidia-l4", "count": 2}, "training": {"epochs": 1}}


def run_job(url: str, provisioner: Provisioner, scratch: Path) -> dict[str, Any]:
    engine = get_engine(url)
    factory = session_factory(engine)
    worker = Worker(engine, provisioner, GcsJobChannel(), GcsStager(scratch / "staging"),
                    WorkerConfig(concurrency=1, poll_s=0.2, heartbeat_s=1, name=f"bench-{uuid.uuid4().hex[:6]}",
                                 driver=DriverConfig(poll_s=0.2)))
    with transaction(factory) as session:
        project = ensure_project(session, "bench")
        job, _ = create_job(session, project, JobSpec.model_validate(SPEC).model_dump(mode="json"),
                            idempotency_key=None, request_hash=b"")
        job_id = job.id
    worker.start()
    try:
        while True:
            with transaction(factory) as session:
                row = session.get(Job, job_id)
                assert row is not None
                if row.status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED):
                    break
            time.sleep(0.5)
    finally:
        worker.shutdown(timeout=30)
    assert row.status == JobStatus.SUCCEEDED, row.error
    [machine] = row.machines or []
    at = {k: datetime.fromisoformat(machine[k]) for k in ("requested_at", "ready_at", "first_report_at")}
    assert row.first_step_at is not None and row.time_to_first_step_s is not None
    return {"to_first_step_s": row.time_to_first_step_s,
            "requested_to_ready_s": (at["ready_at"] - at["requested_at"]).total_seconds(),
            "ready_to_first_report_s": (at["first_report_at"] - at["ready_at"]).total_seconds(),
            "first_report_to_first_step_s": (row.first_step_at - at["first_report_at"]).total_seconds()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="gcebench-"))
    emulator = start_gcs_emulator(None, bucket=BUCKET)
    use_emulator(emulator, BUCKET)
    os.environ["TRAINJOBS_BUCKET"] = BUCKET
    url = bench_db.fresh_database("trainjobs_gcebench")
    results: dict[str, list[dict[str, Any]]] = {"local": [], "gce": []}
    try:
        for run in range(args.runs):
            # Unsandboxed, its agent forked from the zygote, as the figures in bench/README.md were taken
            # (a sandboxed machine starts a fresh agent: bench/sandbox_start.py).
            local = LocalProvisioner(scratch / f"local-{run}", devices=2, slots=1,
                                     isolation=LocalIsolation(sandbox=False, trusted=True))
            results["local"].append(run_job(url, local, scratch / f"l{run}"))
            with FakeComputeApi(sandbox=scratch / f"vms-{run}", local_devices=2) as fake:
                gce = GceVmProvisioner(GcpConfig(project="bench", zone="us-central1-a", compute_api_endpoint=fake.url),
                                       poll_s=0.2)
                results["gce"].append(run_job(url, gce, scratch / f"g{run}"))
            print(f"run {run + 1}: local {results['local'][-1]}\n       gce   {results['gce'][-1]}", flush=True)
    finally:
        emulator.stop()
    med = {side: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for side, rs in results.items()}
    print(f"\nmedian of {args.runs} runs (seconds):")
    for key in med["local"]:
        print(f"  {key:30s} local {med['local'][key]:7.2f}   gce (fake) {med['gce'][key]:7.2f}")
    ratio = med["gce"]["to_first_step_s"] / med["local"]["to_first_step_s"]
    print(f"time to first step, gce / local: {ratio:.2f}x "
          f"(+{med['gce']['to_first_step_s'] - med['local']['to_first_step_s']:.1f} s)")


if __name__ == "__main__":
    main()
