"""Fixtures shared by every tier: real PostgreSQL and the GCS emulator behind the real storage client,
the API behind uvicorn. Unit tests (tests/unit) use none of them; helpers that are not fixtures live in
tests/support/.

Every temporary file of a run lives under one directory, TRAINJOBS_TEST_TMPDIR (default .test-tmp in
the checkout, not the system temp): pytest's tmp_path folders (the last 3 runs are kept, older ones
removed) and, through TMPDIR, whatever the tests and the processes they start put in a temp dir (a
folder per test process, removed when it ends).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stack.embedded import GcsEmulator, start_gcs_emulator, use_emulator
from tests.support import eventually, scaled
from tests.support.jobs import TABLES, make_key
from tests.support.tmp import TEST_TMP, outside_pytest_tmp


TEST_TMP.mkdir(parents=True, exist_ok=True)
# Local machines the suite starts (and `trainjobs up` stacks it runs) are unsandboxed and trust every
# project: their agents fork from a shared zygote (tests/support/local.py). The sandbox's own tests say so
# explicitly (tests/e2e/test_local_tenancy.py).
os.environ["TRAINJOBS_LOCAL_SANDBOX"], os.environ["TRAINJOBS_LOCAL_TRUSTED"] = "off", "1"
# Read by pytest when it first needs tmp_path, which is after conftest files are imported.
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", str(TEST_TMP))


def _remove_stale(older_than_s: float = 86400) -> None:
    """What killed runs left outside pytest's folder (pytest prunes its own)."""
    import time

    for path in TEST_TMP.glob("*-*"):
        try:
            stale = not path.name.startswith("pytest-of-") and path.stat().st_mtime < time.time() - older_than_s
        except OSError:  # another run removed it first
            continue
        if stale:
            shutil.rmtree(path, ignore_errors=True)


_remove_stale()


# `make test` hands whole modules to its processes in collection order (--dist loadfile
# --no-loadscope-reorder), so the long ones should come first and the many short ones fill in behind
# them, instead of a long one starting last and running alone. What makes a module long is TensorFlow:
# the end-to-end tier first, then integration, then unit; within a tier, the modules with the most
# tests marked `tf` (each starts TensorFlow, most of them an agent) first. The order of tests within a
# module is kept.
TIERS = ("e2e", "integration", "unit")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tf_tests: dict[Path, int] = {}
    for item in items:
        tf_tests[item.path] = tf_tests.get(item.path, 0) + (item.get_closest_marker("tf") is not None)

    def rank(item: pytest.Item) -> tuple[int, int]:
        tier = item.path.parent.name
        return (TIERS.index(tier) if tier in TIERS else len(TIERS), -tf_tests[item.path])

    items.sort(key=rank)  # stable: modules of the same rank, and the tests within a module, keep their order


@pytest.fixture(scope="session", autouse=True)
def temp_dir_of_this_run() -> Iterator[Path]:
    """TMPDIR of this test process, so tempfile users and child processes (agents, TF, the emulator,
    an embedded PostgreSQL a test starts) write under TEST_TMP; removed when the process ends."""
    tmp = outside_pytest_tmp("tmp")
    before = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = str(tmp), str(tmp)
    yield tmp
    if before[0] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before[0]
    tempfile.tempdir = before[1]
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def shared_agent_servers(temp_dir_of_this_run: Path) -> Iterator[None]:
    """Ends this process's agent zygote, if a local stack started one (tests/support/local.py), and its
    agent fork server, if a test started an agent of its own (tests/support/agent.py), before its
    TMPDIR goes."""
    yield
    # Only where a stack ran: the images' agent venvs have none of the worker's packages to import.
    if (local := sys.modules.get("tests.support.local")) is not None:
        local.close_shared_zygote()
    if (agent := sys.modules.get("tests.support.agent")) is not None:
        agent.close_shared_forker()
    if "worker.staging_child" in sys.modules:  # a stager ran: its fork server and temp dir
        from tests.support.staging import close_staging_fork_server

        close_staging_fork_server()


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GcsEmulator]:
    """One in-memory emulator per test process; STORAGE_EMULATOR_HOST points at it."""
    emu = start_gcs_emulator(None, bucket="trainjobs-test")
    use_emulator(emu, "trainjobs-test")
    yield emu
    emu.stop()


@pytest.fixture
def bucket(gcs_emulator: GcsEmulator) -> str:
    """A fresh, empty bucket per test, set as TRAINJOBS_BUCKET."""
    from trainjobs import storage

    name = f"t-{uuid.uuid4().hex[:12]}"
    storage.ensure_bucket(name)
    os.environ["TRAINJOBS_BUCKET"] = name
    return name


# --- PostgreSQL ---------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A database of this test process's own, migrated to head: on the server named by
    TRAINJOBS_TEST_DATABASE_URL (CI: the local server), else on an embedded PostgreSQL."""
    import psycopg
    from sqlalchemy.engine import make_url

    from service.db.session import upgrade
    from stack.embedded import start_embedded_postgres

    from stack.embedded import stop_embedded_postgres

    base = os.environ.get("TRAINJOBS_TEST_DATABASE_URL")
    embedded = None
    if base:
        base = base.replace("postgresql://", "postgresql+psycopg://", 1)
    else:
        embedded = outside_pytest_tmp("pg")
        base = start_embedded_postgres(embedded, database="postgres")
    name = f"trainjobs_test_{os.getpid()}"
    url = make_url(base).set(database=name)
    admin = make_url(base).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    rendered = url.render_as_string(hide_password=False)
    upgrade(rendered)
    yield rendered
    from service.db.session import get_engine

    get_engine.cache_clear()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    if embedded is not None:
        stop_embedded_postgres(embedded)  # the server this session started ends with it
        shutil.rmtree(embedded, ignore_errors=True)


@pytest.fixture
def db(database_url: str):  # type: ignore[no-untyped-def]
    """Per-test isolation: every table emptied before the test."""
    from sqlalchemy import text

    from service.db.session import get_engine, session_factory

    engine = get_engine(database_url)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {TABLES} CASCADE"))
    return session_factory(engine)


@pytest.fixture(scope="session")
def api_url(database_url: str) -> Iterator[str]:
    """The real API behind uvicorn on a free port, for the whole session."""
    import threading

    import httpx
    import uvicorn

    from service.app import create_app
    from trainjobs.loopback import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(database_url), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            httpx.get(f"{url}/healthz", timeout=scaled(1))
        except httpx.HTTPError:
            return False
        return True

    eventually(answers, 10, f"the test API answered on {url}")
    yield url
    server.should_exit = True
    thread.join(5)


@pytest.fixture
def api(db, api_url: str):  # type: ignore[no-untyped-def]
    """An httpx client for project 'alpha', authenticated."""
    import httpx

    key = make_key(db, "alpha")
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {key}"}, timeout=scaled(30)) as client:
        yield client


# --- the product around the tests: workers, the local machines, the fake clouds -------------------
# Imported when used: the agent's own TensorFlow venvs (`make test-tpu-tf`) run the end-to-end agent
# tests without the server's packages.

@pytest.fixture
def running_workers() -> Iterator[list]:
    """The workers a test starts (against the in-memory cloud) go in this list; they stop after it."""
    from tests.support.worker import shut_down

    started: list = []
    yield started
    shut_down(started)


@pytest.fixture
def local_stack(db, database_url: str, bucket: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A worker with the local provisioner, whose machines run the real TensorFlow agent."""
    from tests.support.local import local_stack_running

    with local_stack_running(database_url, tmp_path) as provisioner:
        yield provisioner


@pytest.fixture
def make_gcp(db, bucket: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """make_gcp(**fake options): a fake Cloud TPU API and our provisioner on it (tests/support/gcp.py)."""
    from tests.support.gcp import tpu_stacks

    with tpu_stacks(tmp_path) as make:
        yield make


@pytest.fixture
def make_gce(db, bucket: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """make_gce(**fake options): a fake Compute Engine API and our provisioner on it (tests/support/gcp.py)."""
    from tests.support.gcp import gce_stacks

    with gce_stacks(tmp_path) as make:
        yield make


@pytest.fixture
def fake(request: pytest.FixtureRequest, gcs_emulator: GcsEmulator, tmp_path: Path):  # type: ignore[no-untyped-def]
    """The fake Google API a module names as its FAKE (FakeTpuApi or FakeComputeApi), its VMs under
    tmp_path, with short timings. Its VMs do not boot (what a provisioner test wants) unless the module
    sets FAKE_BOOTS = True (what a test of the fake itself wants: hosts that run the startup script).
    Storage is the emulator, as for the VMs: the provisioner mints no per-job storage tokens (which
    would need Application Default Credentials; tests/integration/test_job_tokens.py covers them)."""
    from stack.fakecloud import FakeComputeApi, FakeTpuApi
    from stack.fakecloud.compute_inventory import ComputeTiming
    from stack.fakecloud.tpu_inventory import Timing

    kind = request.module.FAKE
    timing = {FakeTpuApi: Timing, FakeComputeApi: ComputeTiming}[kind](boot_s=0.2, delete_s=0.1)
    with kind(sandbox=tmp_path, boot=getattr(request.module, "FAKE_BOOTS", False), timing=timing) as api:
        yield api
