"""Projects and API keys. Only a hash of each key is stored."""

from __future__ import annotations

import hashlib
import secrets
import uuid

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.db.models import ApiKey, Project

KEY_PREFIX = "tj_"


def hash_key(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def ensure_project(session: Session, name: str) -> uuid.UUID:
    session.execute(insert(Project).values(name=name).on_conflict_do_nothing(index_elements=["name"]))
    return session.scalars(select(Project.id).where(Project.name == name)).one()


def create_api_key(session: Session, project_name: str) -> str:
    """Make (or reuse) the project and return a new key. The secret is shown once, never stored."""
    project_id = ensure_project(session, project_name)
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    session.add(ApiKey(project_id=project_id, key_hash=hash_key(secret), prefix=secret[:10]))
    session.flush()
    return secret


def project_for_key(session: Session, secret: str) -> uuid.UUID | None:
    return session.scalars(
        select(ApiKey.project_id).where(ApiKey.key_hash == hash_key(secret), ApiKey.revoked_at.is_(None))
    ).first()
