"""The product on this machine: a worker with the local provisioner, whose machines run the real
TensorFlow agent (forked from the agent zygote). The `local_stack` fixture (tests/conftest.py)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from service.db.session import get_engine
from tests.support import scaled
from worker.driver import DriverConfig
from worker.gcs_channel import GcsJobChannel
from worker.local.provisioner import LocalProvisioner, start_agent_zygote
from worker.local.sandbox import LocalIsolation
from worker.local.zygote_client import Zygote
from worker.loop import Worker, WorkerConfig
from worker.staging_adapter import GcsStager
from worker.sweeps import SweepConfig

# How long a job on local machines may take to reach what a test waits for (scaled): an agent starts
# TensorFlow, stages, trains and exports.
AGENT_JOB_S = 300
# The suite's stacks fork their agents from one zygote, which a sandboxed machine cannot use (it starts a
# fresh agent in its sandbox): they run unsandboxed, every project trusted. The sandbox's own tests:
# tests/e2e/test_local_tenancy.py.
TRUSTED_UNSANDBOXED = LocalIsolation(sandbox=False, trusted=True)


_zygote: Zygote | None = None


def shared_zygote() -> Zygote | None:
    """This test process's agent zygote, which every local stack in it forks its agents from. Each stack
    used to start its own, and each paid TensorFlow's import again (about 6 CPU-s on two cores, for
    some twenty stacks a run). A new one if the last stopped serving; None with TRAINJOBS_LOCAL_ZYGOTE=0.
    Started as the local provisioner starts its own, when first needed."""
    global _zygote
    if os.environ.get("TRAINJOBS_LOCAL_ZYGOTE", "1") == "0":
        return None
    if _zygote is None or not _zygote.usable:
        if _zygote is not None:
            _zygote.close()
        # This process's TMPDIR (tests/conftest.py: temp_dir_of_this_run), which outlives every stack.
        _zygote = start_agent_zygote(Path(tempfile.gettempdir()) / "zygote.log")
    return _zygote


def close_shared_zygote() -> None:
    global _zygote
    if _zygote is not None:
        _zygote.close()
        _zygote = None


@contextmanager
def local_stack_running(database_url: str, tmp_path: Path, slots: int = 2,
                        isolation: LocalIsolation = TRUSTED_UNSANDBOXED) -> Iterator[LocalProvisioner]:
    """A worker with a local provisioner of two devices and `slots` machines at once (as many jobs
    driven), for the whole block; on the way out the worker stops and every machine left is deleted."""
    provisioner = LocalProvisioner(tmp_path / "machines", devices=2, slots=slots, isolation=isolation,
                                   zygote=None if isolation.sandbox else shared_zygote())
    worker = Worker(get_engine(database_url), provisioner, GcsJobChannel(), GcsStager(tmp_path / "staging"),
                    WorkerConfig(concurrency=slots, lease_s=30, heartbeat_s=1, poll_s=0.5, name="e2e",
                                 driver=DriverConfig(poll_s=0.5, agent_stale_s=scaled(120)),
                                 sweeps=SweepConfig(poll_s=0.5)))
    worker.start()
    try:
        yield provisioner
    finally:
        worker.shutdown(timeout=10)
        for m in provisioner.list({}):
            provisioner.delete(m.name)
        provisioner.close()
