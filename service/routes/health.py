from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from service.db.session import transaction
from service.deps import Factory
from service.errors import ApiError

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(factory: Factory) -> dict[str, str]:
    """The database answers."""
    try:
        with transaction(factory) as session:
            session.execute(text("SELECT 1"))
    except Exception as exc:  # any driver error means not ready
        raise ApiError(503, f"database unreachable: {type(exc).__name__}") from exc
    return {"status": "ready"}
