"""Engine, sessions and migrations. The caller owns the transaction: data functions flush, never commit."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout  # what a pool with no connection free raises (deps.py too)
from sqlalchemy.orm import Session, sessionmaker

if TYPE_CHECKING:
    from alembic.config import Config

T = TypeVar("T")
MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


class NotMigrated(RuntimeError):
    pass


# Without these a caller waits as long as the operating system lets it on a database that is down
# or cut off: libpq's connect has no timeout of its own (a frozen server or a dropped network holds it
# for minutes), and a pool with every connection checked out makes the next request wait 30 s. With
# them a request fails within seconds with an error the API answers as a 503 (service/outages.py).
CONNECT_TIMEOUT_S = 5
POOL_TIMEOUT_S = 10
# A server that vanished under an open connection (a pooled one, a long LISTEN) is noticed within
# about half a minute instead of the kernel's defaults: keepalives while the connection is idle (two
# hours), tcp_user_timeout while a query waits for its acknowledgement (some fifteen minutes of
# retransmits). Neither fires on a slow query: the server's kernel acknowledges it. Unix sockets
# ignore both.
_CONNECT_ARGS = {"connect_timeout": CONNECT_TIMEOUT_S, "keepalives": 1, "keepalives_idle": 10,
                 "keepalives_interval": 5, "keepalives_count": 3, "tcp_user_timeout": 30_000}


@lru_cache(maxsize=8)
def get_engine(url: str, pool_size: int = 10, *, pre_ping: bool = True) -> Engine:
    """pre_ping: a connection the server dropped (a restart) is replaced at checkout, so callers
    recover by themselves once the database is back, at one round trip per checkout. The API turns
    it off (issue 12: a third of a primary-key read) and retries its first statement on a dropped
    connection instead (retry_if_dropped)."""
    return create_engine(url, pool_size=pool_size, max_overflow=20, pool_pre_ping=pre_ping,
                         pool_timeout=POOL_TIMEOUT_S, connect_args=_CONNECT_ARGS)


def retry_if_dropped(session: Session, first_statement: Callable[[Session], T]) -> T:
    """Run a request's first statement; if its pooled connection turns out to be one the server
    dropped (a restart, a failover), run it once more on a new one. SQLAlchemy has by then
    invalidated the whole pool (every connection older than the error), so the retry connects
    afresh, and a database that is still down fails it as usual (a 503). Only for a first statement:
    nothing before it in the transaction can have been lost."""
    try:
        return first_statement(session)
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        session.rollback()
        return first_statement(session)


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on any exception."""
    with factory() as session, session.begin():
        yield session


def _alembic_config(url: str) -> Config:
    from alembic.config import Config

    cfg = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str) -> None:
    from alembic import command

    command.upgrade(_alembic_config(url), "head")


def downgrade(url: str, revision: str) -> None:
    from alembic import command

    command.downgrade(_alembic_config(url), revision)


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config("postgresql://")).get_current_head()
    assert head is not None
    return head


def check_migrated(engine: Engine) -> None:
    """Fail fast, with the fix in the message, when the schema is missing or behind."""
    with engine.connect() as conn:
        exists = conn.execute(text("SELECT to_regclass('alembic_version')")).scalar()
        current = conn.execute(text("SELECT version_num FROM alembic_version")).scalar() if exists else None
    if current != head_revision():
        raise NotMigrated(
            f"database schema is at {current or 'nothing'}, this build needs {head_revision()}: "
            "run `trainjobs db upgrade` (or start with --migrate)"
        )
