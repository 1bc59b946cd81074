"""The baseline for bench/api_bench.py: a bare FastAPI + SQLAlchemy app, as a competent user writes
it in a few lines, serving one job by primary key from the same `jobs` table and database. No auth,
no projects, no error shapes: one pooled session, one `SELECT ... WHERE id = :id`, the row as JSON.

Usage: python bench/bare_app.py URL PORT
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])

from service.db.models import Job  # noqa: E402  the same table, the same ORM mapping

# What a job read shows, as of issue 12 (a fixed list, so that the same app serves an older schema).
COLUMNS = [Job.__table__.c[name] for name in (
    "id", "name", "spec", "labels", "status", "attempt", "created_at", "updated_at", "staging_at", "provisioning_at",
    "running_at", "finished_at", "error", "progress", "metrics", "runtime")]


def make_app(url: str) -> FastAPI:
    engine = create_engine(url, pool_size=10, max_overflow=20)
    app = FastAPI()

    @app.get("/jobs/{job_id}")
    def get_job(job_id: uuid.UUID) -> dict[str, Any]:
        with Session(engine) as session:
            row = session.execute(select(*COLUMNS).where(Job.id == job_id)).mappings().first()
        if row is None:
            raise HTTPException(404)
        return dict(row)

    return app


if __name__ == "__main__":
    uvicorn.run(make_app(sys.argv[1]), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
