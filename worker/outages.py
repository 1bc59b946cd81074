"""Which errors mean a service the worker depends on is down, rather than that a job is bad.

A driver step that fails because PostgreSQL or storage cannot be reached says nothing about the job:
counting it toward the job's failure limit would fail every running job during a long outage
(issue 8: a PostgreSQL restart and a 150 s storage outage under a running worker). Those errors are
retried with backoff for as long as the outage lasts; every other error counts.

The storage client's errors are named, not imported: the driver reaches storage only through its
ports, and this keeps the cloud SDK out of the worker's core.
"""

from __future__ import annotations

import psycopg
from sqlalchemy import exc as sa

from trainjobs.storage_limits import StorageUnavailable

_UNREACHABLE = frozenset({
    # google-cloud-storage over requests: the connection failed, or the client's own retries of
    # transient errors (503s, resets) ran out of time.
    "requests.exceptions.ConnectionError",
    "requests.exceptions.Timeout",
    "google.auth.exceptions.TransportError",
    "google.api_core.exceptions.RetryError",
    "google.api_core.exceptions.ServiceUnavailable",
    "google.api_core.exceptions.GatewayTimeout",
    "google.api_core.exceptions.TooManyRequests",
    # refused, reset or aborted sockets, whoever opened them
    "builtins.ConnectionError",
})


def is_outage(exc: BaseException) -> bool:
    """True if `exc`, or any error it was raised from, says a service could not be reached."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if _unreachable(cause):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _unreachable(exc: BaseException) -> bool:
    # A lost or refused connection, a server shutting down, a pool with no connection to give:
    # psycopg's OperationalError class, however SQLAlchemy wraps it; storage past the worker's
    # call limits (trainjobs/storage_limits.py).
    if isinstance(exc, (psycopg.OperationalError, sa.OperationalError, sa.TimeoutError, StorageUnavailable)):
        return True
    if isinstance(exc, sa.DBAPIError) and exc.connection_invalidated:
        return True
    return any(f"{c.__module__}.{c.__qualname__}" in _UNREACHABLE for c in type(exc).__mro__)
