"""Request dependencies: the session factory, the caller's project, and a request's one transaction.

Each sync dependency costs a hop to the threadpool and back (issue 12 measured three per read, a
fifth of a primary-key read's time), so what needs no I/O is async, and the jobs routes check the
key inside the route, in the transaction they work in (project_transaction, KeyCheckedFirst).

The jobs routes' database work runs on a few threads of its own, taken first come first served
(in_db_thread), not on the 40 of the shared threadpool: 32 requests' threads taking turns at the GIL
in no order made a primary-key read's p99 5x its median (issue 12; bench/README.md). The shared
threadpool keeps what may wait on storage (uploads, artifacts, logs), so a slow bucket does not
hold up reads of the database.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

import anyio
import anyio.to_thread
from fastapi import Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from sqlalchemy.orm import Session, sessionmaker

from service.auth_throttle import key_accepted
from service.db.projects import hash_key, project_for_key
from service.db.session import PoolTimeout, retry_if_dropped
from service.errors import ApiError
from service.key_cache import KeyCache


async def get_factory(request: Request) -> sessionmaker[Session]:
    factory: sessionmaker[Session] = request.app.state.session_factory  # set by create_app
    return factory


SessionFactory = sessionmaker[Session]
Factory = Annotated[SessionFactory, Depends(get_factory)]


async def get_read_factory(request: Request) -> sessionmaker[Session]:
    """Sessions for routes that only read, in autocommit: under READ COMMITTED each statement sees
    its own snapshot inside a transaction too, so BEGIN and COMMIT bought a read nothing but two
    round trips (half of a primary-key read's, issue 12)."""
    factory: sessionmaker[Session] = request.app.state.read_factory  # set by create_app
    return factory


ReadFactory = Annotated[SessionFactory, Depends(get_read_factory)]

T = TypeVar("T")
# Enough to keep PostgreSQL busy while one of them runs Python (a submit is 5 round trips); more
# only take turns at the GIL. TRAINJOBS_API_DB_THREADS per server process.
DEFAULT_DB_THREADS = 4


def db_threads() -> int:
    raw = os.environ.get("TRAINJOBS_API_DB_THREADS", "").strip()
    try:
        n = int(raw) if raw else DEFAULT_DB_THREADS
    except ValueError:
        raise ValueError(f"TRAINJOBS_API_DB_THREADS={raw!r} is not a whole number") from None
    if n < 1:
        raise ValueError(f"TRAINJOBS_API_DB_THREADS={raw!r} must be at least 1")
    return n


async def in_db_thread(request: Request, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) once one of the app's database turns is free; requests wait for theirs in arrival
    order (anyio's CapacityLimiter queues its waiters first in, first out). A request that waits
    longer than the pool would (POOL_TIMEOUT_S) is answered 503, as when the pool is exhausted: with
    the database hanging, each turn can take the connect timeout, and the queue must not hold
    requests for minutes (issue 8: a 503 within seconds)."""
    state = request.app.state
    turns = getattr(state, "db_turns", None)
    if turns is None:  # made here, in the server's event loop
        turns = state.db_turns = anyio.CapacityLimiter(state.db_threads)
        # A thread budget of its own, as large as the turns (so never waited for): storage calls
        # holding the shared threadpool's 40 cannot hold up database work.
        state.db_thread_pool = anyio.CapacityLimiter(state.db_threads)
    with anyio.move_on_after(state.db_wait_s) as waited:
        await turns.acquire()
    if waited.cancelled_caught:
        raise PoolTimeout(f"no database turn free in {state.db_wait_s:g} s")
    try:
        return await anyio.to_thread.run_sync(fn, *args, limiter=state.db_thread_pool)
    finally:
        turns.release()


UNKNOWN_KEY = "unknown or revoked API key"


def bearer_secret(authorization: str) -> str | None:
    """The key in an `Authorization: Bearer <key>` header's value, or None when there is none."""
    scheme, _, secret = authorization.partition(" ")
    return secret.strip() if scheme.lower() == "bearer" and secret.strip() else None


def _secret(request: Request) -> str:
    secret = bearer_secret(request.headers.get("authorization", ""))
    if secret is None:
        raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>'")
    return secret


def _project(session: Session, secret: str) -> uuid.UUID:
    # The app's sessions carry its key cache (create_app): a key this process accepted moments ago
    # costs no query (service/key_cache.py says how a revoke still reaches the next request).
    cache: KeyCache | None = session.info.get("key_cache")
    key_hash = hash_key(secret)
    if cache is not None and (project_id := cache.get(key_hash)) is not None:
        key_accepted()
        return project_id
    epoch = cache.epoch() if cache is not None else 0
    project_id = retry_if_dropped(session, lambda s: project_for_key(s, secret))
    if project_id is None:
        raise ApiError(401, UNKNOWN_KEY)  # middleware.ThrottleFailedAuth counts it and caches the hash
    key_accepted()  # ... and lets a working key through an address another key's failures hold
    if cache is not None:
        cache.store(key_hash, project_id, epoch)
    return project_id


def current_project(request: Request, factory: Factory) -> uuid.UUID:
    """The key's project, checked in a transaction of its own (routes that stream keep no connection)."""
    secret = _secret(request)
    with factory() as session:
        project_id = _project(session, secret)
        session.commit()
    return project_id


ProjectId = Annotated[uuid.UUID, Depends(current_project)]


async def api_secret(request: Request) -> str:
    return _secret(request)


ApiSecret = Annotated[str, Depends(api_secret)]


@contextmanager
def project_transaction(factory: sessionmaker[Session], secret: str) -> Iterator[tuple[uuid.UUID, Session]]:
    """One transaction that checks the key and then does the route's work (issue 12: two before);
    commits when the block ends, rolls back on an exception."""
    with factory() as session:
        yield _project(session, secret), session
        session.commit()


class KeyCheckedFirst(APIRoute):
    """For routes that check their key inside the route, in the transaction they work in (one
    threadpool hop per request instead of three): a request whose parameters or body fail
    validation never reaches the route, so the key is checked here before the 422 is answered. An
    unknown or revoked key is a 401 whatever else is wrong, as with ProjectId."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def key_first(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError:
                factory = await get_factory(request)
                await in_db_thread(request, _check_key, factory, _secret(request))
                raise

        return key_first


def _check_key(factory: sessionmaker[Session], secret: str) -> None:
    with project_transaction(factory, secret):
        pass
