"""The product on this machine: a worker with the local provisioner, whose machines run the real
TensorFlow agent (forked from the agent zygote). The `local_stack` fixture (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from service.db.session import get_engine
from tests.support import scaled
from worker.driver import DriverConfig
from worker.gcs_channel import GcsJobChannel
from worker.local.provisioner import LocalProvisioner
from worker.loop import Worker, WorkerConfig
from worker.staging_adapter import GcsStager

# How long a job on local machines may take to reach what a test waits for (scaled): an agent starts
# TensorFlow, stages, trains and exports.
AGENT_JOB_S = 300


@contextmanager
def local_stack_running(database_url: str, tmp_path: Path) -> Iterator[LocalProvisioner]:
    """A worker with a local provisioner of two devices and two slots, for the whole block; on the way
    out the worker stops and every machine left is deleted."""
    provisioner = LocalProvisioner(tmp_path / "machines", devices=2, slots=2)
    worker = Worker(get_engine(database_url), provisioner, GcsJobChannel(), GcsStager(tmp_path / "staging"),
                    WorkerConfig(concurrency=2, lease_s=30, heartbeat_s=1, poll_s=0.5, name="e2e",
                                 driver=DriverConfig(poll_s=0.5, agent_stale_s=scaled(120))))
    worker.start()
    try:
        yield provisioner
    finally:
        worker.shutdown(timeout=10)
        for m in provisioner.list({}):
            provisioner.delete(m.name)
        provisioner.close()
