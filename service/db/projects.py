"""Projects and API keys. Only a hash of each key is stored."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.db.models import ApiKey, Project

KEY_PREFIX = "tj_"
PREFIX_LENGTH = 10  # of each secret, kept in clear so users can tell their keys apart


def hash_key(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def ensure_project(session: Session, name: str) -> uuid.UUID:
    session.execute(insert(Project).values(name=name).on_conflict_do_nothing(index_elements=["name"]))
    return session.scalars(select(Project.id).where(Project.name == name)).one()


def create_api_key(session: Session, project_name: str) -> str:
    """Make (or reuse) the project and return a new key. The secret is shown once, never stored."""
    project_id = ensure_project(session, project_name)
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    session.add(ApiKey(project_id=project_id, key_hash=hash_key(secret), prefix=secret[:PREFIX_LENGTH]))
    session.flush()
    return secret


def project_for_key(session: Session, secret: str) -> uuid.UUID | None:
    keys = ApiKey.__table__.c  # plain columns: every request runs this, and Core skips the ORM's steps
    project_id: uuid.UUID | None = session.execute(
        select(keys.project_id).where(keys.key_hash == hash_key(secret), keys.revoked_at.is_(None))
    ).scalar()
    return project_id


@dataclass(frozen=True)
class ApiKeyInfo:
    """What may be shown about a key: never the secret or its hash."""

    prefix: str
    created_at: datetime
    revoked_at: datetime | None


class AmbiguousKeyPrefix(ValueError):
    """Several keys start with this prefix; the whole key names one."""


def _info(key: ApiKey) -> ApiKeyInfo:
    return ApiKeyInfo(prefix=key.prefix, created_at=key.created_at, revoked_at=key.revoked_at)


def list_api_keys(session: Session, project_name: str) -> list[ApiKeyInfo] | None:
    """The project's keys, oldest first, revoked ones included; None when there is no such project."""
    project_id = session.scalars(select(Project.id).where(Project.name == project_name)).first()
    if project_id is None:
        return None
    keys = session.scalars(select(ApiKey).where(ApiKey.project_id == project_id).order_by(ApiKey.created_at, ApiKey.id))
    return [_info(k) for k in keys]


# Every API process LISTENs here and forgets the key it names (service/key_cache.py).
KEY_REVOKED_CHANNEL = "trainjobs_api_key_revoked"


def revoke_api_key(session: Session, prefix_or_key: str) -> ApiKeyInfo | None:
    """Revoke the key with this prefix (as `keys list` shows it) or this whole secret; None when no key
    matches. Revoking twice keeps the first time. The API processes remember accepted keys for a few
    seconds (service/key_cache.py): the NOTIFY, sent in this transaction, reaches them when it commits
    and not before, so the next request with the key is refused."""
    if len(prefix_or_key) > PREFIX_LENGTH:  # longer than any prefix: the whole secret
        match = select(ApiKey).where(ApiKey.key_hash == hash_key(prefix_or_key))
    else:
        match = select(ApiKey).where(ApiKey.prefix == prefix_or_key)
    keys = list(session.scalars(match.with_for_update()))
    if len(keys) > 1:
        raise AmbiguousKeyPrefix(f"{len(keys)} keys start with {prefix_or_key!r}: give the whole key to revoke one")
    if not keys:
        return None
    key = keys[0]
    if key.revoked_at is None:
        key.revoked_at = session.scalar(select(func.now()))
        session.flush()
    session.execute(text("SELECT pg_notify(:channel, :key)"), {"channel": KEY_REVOKED_CHANNEL, "key": key.key_hash.hex()})
    return _info(key)
