"""Shared fixtures: real PostgreSQL and the GCS emulator behind the real storage client."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from stack.embedded import GcsEmulator, start_gcs_emulator, use_emulator


def scaled(seconds: float) -> float:
    """A wait or deadline in a test, scaled for a loaded machine: TRAINJOBS_TEST_TIME_SCALE=3 triples it.
    No test may pass or fail on time alone at scale 1 on a quiet machine either."""
    return seconds * float(os.environ.get("TRAINJOBS_TEST_TIME_SCALE", "1"))


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

    base = os.environ.get("TRAINJOBS_TEST_DATABASE_URL")
    if base:
        base = base.replace("postgresql://", "postgresql+psycopg://", 1)
    else:
        base = start_embedded_postgres(tmp_path_factory.mktemp("pg"), database="postgres")
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
    from trainjobs.ports import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(database_url), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            break
        except httpx.HTTPError:
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
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
        yield client


def digits_spec(**overrides: object) -> dict:
    spec: dict = {"name": "digits", "dataset": {"source": "sklearn:digits"}, "model": {"name": "cnn"},
                  "accelerator": {"type": "cpu", "replicas": 2}, "strategy": "mirrored", "training": {"epochs": 2}}
    spec.update(overrides)
    return spec
