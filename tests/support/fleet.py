"""Many jobs on a fake Google Cloud without TensorFlow: a real worker (PostgreSQL, drivers, our
provisioner through the real Google client, the fake API over HTTP) whose agents are stand-ins that
report like an agent while their machine runs. What the fleet costs in cloud requests is read from the
fake's own counters. Used by tests/integration/test_machine_watch.py and bench/fleet_bench.py."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from service.db import jobs as jobdata
from service.db.models import Project
from service.db.projects import ensure_project
from service.db.session import get_engine, transaction
from stack.fakecloud import FakeComputeApi, FakeTpuApi
from stack.fakecloud.compute_inventory import ComputeTiming
from stack.fakecloud.tpu_inventory import Timing
from trainjobs.messages import AgentReport, AgentState
from trainjobs.spec import JobSpec
from worker.driver import DriverConfig
from worker.gcp.compute import GceVmProvisioner
from worker.gcp.config import GcpConfig
from worker.gcp.machine_watch import WatchConfig
from worker.gcp.tpu import TpuVmProvisioner
from worker.gcp.zonal import ZonalProvisioner
from worker.loop import Worker, WorkerConfig
from worker.memory_cloud import memory_stager
from worker.ports import MachineRequest

ZONE = "us-central1-a"
ACCELERATORS = {"tpu": {"type": "tpu", "tpu_type": "v5litepod-8"}, "gpu": {"type": "gpu", "gpu_type": "nvidia-l4", "count": 1}}


@dataclass
class StandInAgents:
    """A JobChannel whose agent for an attempt starts when its machine first runs, reports RUNNING with a
    fresh heartbeat at every read while the machine runs, SUCCEEDED once `train_s` have passed, and
    nothing new once its machine stops (its last report stays, as a dead agent's status.json does)."""

    running: Callable[[str], bool]  # machine name -> whether it runs (the fake's state, read in-process)
    train_s: float
    _names: dict[tuple[str, int], str] = field(default_factory=dict)
    _started: dict[tuple[str, int], float] = field(default_factory=dict)
    _last: dict[tuple[str, int], AgentReport] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def job_dir(self, job_id: str) -> str:
        return f"mem://jobs/{job_id}"

    def prepare(self, job_id: str, attempt: int, spec: JobSpec, dataset_uri: str) -> None:
        with self._lock:
            self._names[(job_id, attempt)] = MachineRequest(job_id, attempt, spec, "").name

    def read_status(self, job_id: str, attempt: int) -> AgentReport | None:
        key = (job_id, attempt)
        with self._lock:
            name = self._names.get(key)
        if name is None or not self.running(name):
            with self._lock:
                return self._last.get(key)
        with self._lock:
            started = self._started.setdefault(key, time.monotonic())
            done = time.monotonic() - started >= self.train_s
            report = AgentReport(state=AgentState.SUCCEEDED if done else AgentState.RUNNING, attempt=attempt,
                                 heartbeat_at=datetime.now(UTC), progress=min(1.0, (time.monotonic() - started) / self.train_s))
            self._last[key] = report
            return report

    def request_stop(self, job_id: str, attempt: int, reason: str) -> None:
        pass

    def final_metrics(self, job_id: str) -> dict[str, Any] | None:
        return None

    def artifact_manifest(self, job_id: str) -> list[dict[str, Any]] | None:
        return None

    def history(self, job_id: str) -> Any:
        return None  # no epochs recorded (JobChannel.history on main since the advice column)


@dataclass
class Fleet:
    fake: FakeTpuApi | FakeComputeApi
    provisioner: ZonalProvisioner
    agents: StandInAgents
    worker: Worker
    factory: sessionmaker[Session]
    workers: list[Worker] = field(default_factory=list)  # all of them, `worker` first

    def submit(self, product: str, n: int, spot: bool = False) -> list[uuid.UUID]:
        spec = JobSpec.model_validate({"name": "fleet", "dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp"},
                                       "accelerator": {**ACCELERATORS[product], "spot": spot}, "strategy": "auto",
                                       "training": {"epochs": 1}}).model_dump(mode="json")
        with transaction(self.factory) as s:
            project = ensure_project(s, "fleet")
            # The project's quotas let the whole fleet run at once (the defaults hold 8 jobs).
            s.execute(update(Project).where(Project.id == project).values(max_running_jobs=100_000,
                                                                            max_accelerators=10_000_000))
            return [jobdata.create_job(s, project, spec, idempotency_key=None, request_hash=b"")[0].id for _ in range(n)]

    def reads(self) -> int:
        """GET requests the fake has received so far (Google's read quota counts these)."""
        return sum(n for key, n in self.fake.request_counts().items() if key.startswith("GET "))


@contextmanager
def fleet(database_url: str, factory: sessionmaker[Session], product: str, sandbox: Path, *, jobs: int,
          train_s: float, watch: WatchConfig | None, poll_s: float = 1.0, workers: int = 1,
          share_listing: bool = True) -> Iterator[Fleet]:
    """A fake API for `product` ("tpu" or "gpu"), our provisioner on it, and a worker driving up to
    `jobs` jobs at once, polling each every `poll_s` as DriverConfig does. With `workers` > 1, that many
    workers (a provisioner each, as separate processes have) share the fake, the database and the watch's
    listing (fleet_listing.py; `share_listing=False`: each lists for itself, as before issue 25's fleet
    listing); each drives up to `jobs`. Everything stops on the way out."""
    # Storage is the memory channel's, not GCS: no per-job storage tokens (they would need credentials).
    os.environ.setdefault("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    fake: FakeTpuApi | FakeComputeApi
    shared = factory if workers > 1 and share_listing else None
    if product == "tpu":
        tpu = FakeTpuApi(sandbox=sandbox, boot=False, timing=Timing(boot_s=0.3, delete_s=0.2)).start()

        def provisioner() -> ZonalProvisioner:
            return TpuVmProvisioner(GcpConfig(project="proj", zone=ZONE, tpu_api_endpoint=tpu.url), create_wait_s=0,
                                    delete_wait_s=30, backoff_s=0.05, startup=lambda r: "#!/bin/bash\n", watch=watch,
                                    fleet=shared)
        fake, running = tpu, (lambda name: tpu.node_state(name) == "READY")
    else:
        gce = FakeComputeApi(sandbox=sandbox, boot=False, timing=ComputeTiming(boot_s=0.3, delete_s=0.2)).start()

        def provisioner() -> ZonalProvisioner:
            return GceVmProvisioner(GcpConfig(project="proj", zone=ZONE, compute_api_endpoint=gce.url),
                                    create_wait_s=30, delete_wait_s=30, backoff_s=0.05, poll_s=0.1,
                                    startup=lambda r: "#!/bin/bash\n", watch=watch, fleet=shared)
        fake, running = gce, (lambda name: gce.instance_status(f"{name}-0") == "RUNNING")
    agents = StandInAgents(running, train_s)
    provisioners, started = [provisioner() for _ in range(workers)], []
    try:
        for i in range(workers):
            worker = Worker(get_engine(database_url), provisioners[i], agents, memory_stager,
                            WorkerConfig(concurrency=jobs, takeover_slots=0, lease_s=30, heartbeat_s=2, poll_s=0.3,
                                         name=f"fleet-{product}" + (f"-{i}" if workers > 1 else ""), sweeps=None,
                                         sweep_uploads_every_s=None,
                                         driver=DriverConfig(poll_s=poll_s, retry_backoff_max_s=5)))
            worker.start()
            started.append(worker)
        yield Fleet(fake, provisioners[0], agents, started[0], factory, started)
    finally:
        for worker in started:
            worker.shutdown(timeout=10)
        fake.stop()
