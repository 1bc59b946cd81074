from __future__ import annotations

import logging

from fastapi import APIRouter
from sqlalchemy import text

from service.db.session import transaction
from service.deps import Factory
from service.errors import ApiError
from service.schemas import error_responses
from trainjobs import storage

router = APIRouter(tags=["health"])
log = logging.getLogger("trainjobs.api")


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.get("/readyz", responses=error_responses(503))
def readyz(factory: Factory) -> dict[str, str]:
    """The database and the bucket both answer; otherwise a 503 whose details name each one that
    does not (a load balancer sends no traffic to an API that cannot serve it)."""
    down = [{"field": name, "reason": reason} for name, reason in
            (("database", _database_problem(factory)), ("storage", _storage_problem())) if reason]
    if down:
        raise ApiError(503, "not ready: " + "; ".join(f"{d['field']} {d['reason']}" for d in down), details=down)
    return {"status": "ready"}


def _database_problem(factory: Factory) -> str | None:
    try:
        with transaction(factory) as session:
            session.execute(text("SELECT 1"))
    except Exception as exc:  # whatever the driver raised, the database cannot serve requests
        log.warning("readyz: database: %s", exc)
        return f"unreachable ({type(exc).__name__})"
    return None


def _storage_problem() -> str | None:
    name = storage.bucket_name()
    try:
        exists = storage.bucket(name).exists()
    except Exception as exc:  # the storage limits of the request bound how long this takes
        log.warning("readyz: storage: %s", exc)
        return f"unreachable ({type(exc).__name__})"
    return None if exists else f"bucket {name!r} does not exist"
