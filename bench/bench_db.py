"""A fresh database for a benchmark: on TRAINJOBS_TEST_DATABASE_URL (or TRAINJOBS_DATABASE_URL)'s
server, else on an embedded PostgreSQL that is stopped when the benchmark exits."""

from __future__ import annotations

import atexit
import os
import tempfile
from pathlib import Path

import psycopg
from sqlalchemy.engine import make_url

from service.db.session import upgrade


def fresh_database(name: str, revision: str = "head") -> str:
    """Drop and create database `name`, migrate it to `revision`, and return its SQLAlchemy URL."""
    base = os.environ.get("TRAINJOBS_TEST_DATABASE_URL") or os.environ.get("TRAINJOBS_DATABASE_URL")
    if not base:
        from stack.embedded import start_embedded_postgres, stop_embedded_postgres

        data_dir = Path(tempfile.mkdtemp(prefix="bench-pg-")) / "pg"
        base = start_embedded_postgres(data_dir, database="postgres")
        atexit.register(stop_embedded_postgres, data_dir)  # before, every run left its server running
    base = base.replace("postgresql://", "postgresql+psycopg://", 1)
    admin = make_url(base).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(base).set(database=name).render_as_string(hide_password=False)
    if revision == "head":
        upgrade(url)
    else:  # for an older checkout's head (api_bench.py --repo)
        from alembic import command

        from service.db.session import _alembic_config

        command.upgrade(_alembic_config(url), revision)
    return url
