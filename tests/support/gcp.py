"""The product on each fake Google Cloud: a fake API (Cloud TPU or Compute Engine), our provisioner on
it through the real Google client, and a worker the test starts when it is ready. The fixtures
`make_gcp` and `make_gce` (tests/conftest.py) hand these out."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.db.session import get_engine
from stack.fakecloud import FakeComputeApi, FakeTpuApi
from stack.fakecloud.compute_inventory import ComputeTiming
from stack.fakecloud.tpu_inventory import Timing
from tests.support.jobs import digits_spec
from tests.support import scaled
from tests.support import eventually
from trainjobs.loopback import free_port
from worker.gcp.config import GcpConfig
from worker.driver import DriverConfig
from worker.gcs_channel import GcsJobChannel
from worker.loop import Worker, WorkerConfig
from worker.gcp.compute import GceVmProvisioner
from worker.gcp.machine_watch import WatchConfig
from worker.gcp.tpu import TpuVmProvisioner
from worker.staging_adapter import GcsStager

ZONE, FALLBACK = "us-central1-a", "us-central1-b"
# The worker's jobs look at their machines through a shared listing, as `trainjobs worker --provisioner
# gcp` wires it, on a schedule as short as the tests' driver polls (production: WatchConfig()).
WATCH = WatchConfig(every_s=1.0, soon_s=0.3, max_every_s=4.0, max_age_s=30.0)


def tpu_spec(spot: bool = False, **overrides: Any) -> dict[str, Any]:
    return digits_spec(accelerator={"type": "tpu", "tpu_type": "v5litepod-8", "spot": spot}, strategy="auto", **overrides)


def gpu_spec(count: int = 2, spot: bool = False, **overrides: Any) -> dict[str, Any]:
    return digits_spec(accelerator={"type": "gpu", "gpu_type": "nvidia-l4", "count": count, "spot": spot},
                       strategy="auto", **overrides)


def _worker(database_url: str, provisioner: Any, staging: Path, name: str, **driver: Any) -> Worker:
    worker = Worker(get_engine(database_url), provisioner, GcsJobChannel(), GcsStager(staging),
                    WorkerConfig(concurrency=2, lease_s=30, heartbeat_s=1, poll_s=0.3, name=name,
                                 driver=DriverConfig(poll_s=0.3, **driver)))
    worker.start()
    return worker


# --- Cloud TPU -------------------------------------------------------------------------------------

@dataclass
class GcpStack:
    fake: FakeTpuApi
    provisioner: TpuVmProvisioner
    worker: Worker | None = None

    def start_worker(self, database_url: str, staging: Path, **driver: Any) -> None:
        self.worker = _worker(database_url, self.provisioner, staging, "gcp-test", **driver)


@contextmanager
def tpu_stacks(tmp_path: Path) -> Iterator[Callable[..., GcpStack]]:
    """make(**fake options): a fake TPU API (by default its VMs do not boot) and a provisioner on it;
    the test starts the worker when it is ready. Everything made is stopped on the way out. The
    `make_gcp` fixture (tests/conftest.py)."""
    stacks: list[GcpStack] = []

    def make(config: dict[str, Any] | None = None, **options: Any) -> GcpStack:
        options = {"boot": False, "timing": Timing(boot_s=0.3, delete_s=0.2), **options}
        fake = FakeTpuApi(sandbox=tmp_path / "vms", **options).start()
        provisioner = TpuVmProvisioner(GcpConfig(project="proj", zone=ZONE, tpu_api_endpoint=fake.url, **(config or {})),
                                       create_wait_s=0, delete_wait_s=scaled(30), backoff_s=0.01, watch=WATCH)
        stacks.append(GcpStack(fake, provisioner))
        return stacks[-1]

    try:
        yield make
    finally:
        for stack in stacks:
            if stack.worker is not None:
                stack.worker.shutdown(timeout=10)
            stack.fake.stop()


def wait_for_node(fake: FakeTpuApi, state: str, timeout: float = 60) -> str:
    def named() -> list[str]:
        return [n for n in fake.node_names() if (fake.node(n) or {}).get("state") == state]

    return eventually(named, timeout, lambda: f"a {state} node; the nodes are {fake.node_names()}", every=0.1)[0]


# --- Compute Engine --------------------------------------------------------------------------------

@dataclass
class GceStack:
    fake: FakeComputeApi
    provisioner: GceVmProvisioner
    worker: Worker | None = None

    def start_worker(self, database_url: str, staging: Path) -> None:
        self.worker = _worker(database_url, self.provisioner, staging, "gce-test")


@contextmanager
def gce_stacks(tmp_path: Path) -> Iterator[Callable[..., GceStack]]:
    """make(**fake options): a fake Compute Engine API (by default its VMs do not boot) and a
    provisioner on it with a fallback zone; the test starts the worker when it is ready. The
    `make_gce` fixture (tests/conftest.py)."""
    stacks: list[GceStack] = []

    def make(**options: Any) -> GceStack:
        options = {"boot": False, "timing": ComputeTiming(boot_s=0.3, delete_s=0.2), **options}
        fake = FakeComputeApi(sandbox=tmp_path / "vms", **options).start()
        config = GcpConfig(project="proj", zone=ZONE, fallback_zones=(FALLBACK,), compute_api_endpoint=fake.url,
                           tf_port=free_port())
        provisioner = GceVmProvisioner(config, create_wait_s=scaled(30), delete_wait_s=scaled(30), backoff_s=0.01,
                                       poll_s=0.1, watch=WATCH)
        stacks.append(GceStack(fake, provisioner))
        return stacks[-1]

    try:
        yield make
    finally:
        for stack in stacks:
            if stack.worker is not None:
                stack.worker.shutdown(timeout=10)
            stack.fake.stop()


def wait_for_vms(fake: FakeComputeApi, count: int, status: str = "RUNNING", timeout: float = 60) -> list[str]:
    def enough() -> list[str]:
        names: list[str] = fake.instance_names(status)
        return names if len(names) >= count else []

    return eventually(enough, timeout, lambda: f"{count} {status} VMs; the VMs are {fake.instance_names()}", every=0.1)


# --- the two clouds as one matrix -------------------------------------------------------------------

@dataclass(frozen=True)
class Cloud:
    """What differs between the clouds for the tests that hold on both (tests/integration/test_gcp_jobs.py,
    tests/e2e/test_gcp_jobs.py): the fixture that stands one up, a one-machine job's spec, the fake's
    machines, the machines one request makes, and how the fake refuses a job for quota."""

    stack: str  # the fixture that makes its stack: make_gcp or make_gce
    spec: Callable[..., dict[str, Any]]  # a one-machine job, spot=True for a spot one
    machines: Callable[[Any], list[str]]  # the fake's machine names
    names_of: Callable[[str], list[str]]  # the machines a request of this name makes
    refuse_quota: Callable[[Any], None]  # the fake's quota now refuses that job
    quota_error: str  # how the job's error begins then: the cloud's own message


CLOUDS = {
    "tpu": Cloud("make_gcp", lambda spot=False, **o: tpu_spec(spot=spot, **o), lambda fake: fake.node_names(),
                 lambda name: [name], lambda fake: fake.set_quota(ZONE, 4),
                 "Quota limit 'TPUS-per-project-per-zone' has been exceeded."),
    "gpu": Cloud("make_gce", lambda spot=False, **o: gpu_spec(count=1, spot=spot, **o), lambda fake: fake.instance_names(),
                 lambda name: [f"{name}-0"], lambda fake: fake.set_gpu_quota(ZONE, 0),
                 "Quota 'GPUS_PER_GPU_FAMILY' exceeded."),
}
