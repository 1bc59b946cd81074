"""Which errors mean a service trainjobs depends on is down (PostgreSQL or storage), rather than that a
request or a job is bad. One classifier for both of its readers:

- the API answers them with a 503 that says which service, within seconds (service/outages.py);
- the worker retries a driver step that failed with one for as long as the outage lasts, without
  counting it toward the job's failure limit (worker/driver.py): counting it would fail every running
  job during a long outage (issue 8: a PostgreSQL restart and a 150 s storage outage under a running
  worker).

The errors are named, not imported: importing this imports no driver or cloud SDK, and an error is
recognised by any class in its MRO, so a subclass counts as its base does.
"""

from __future__ import annotations

import importlib
from enum import Enum

from trainjobs.storage_limits import StorageUnavailable


class Outage(Enum):
    DATABASE = "the database"
    STORAGE = "storage"


_ERRORS: dict[Outage, frozenset[str]] = {
    # A lost or refused connection, a server shutting down or starting up (psycopg's OperationalError,
    # however SQLAlchemy wraps it), a connection closed underneath us, no pooled connection free in time.
    Outage.DATABASE: frozenset({
        "psycopg.OperationalError",
        "sqlalchemy.exc.OperationalError",
        "sqlalchemy.exc.InterfaceError",
        "sqlalchemy.exc.TimeoutError",
    }),
    Outage.STORAGE: frozenset({
        # Storage past the call limits in force (trainjobs/storage_limits.py).
        f"{StorageUnavailable.__module__}.{StorageUnavailable.__qualname__}",
        # google-cloud-storage over requests: the connection failed (a non-idempotent write the client does
        # not retry), or the client's own retries of transient errors (503s, resets) ran out of time.
        "requests.exceptions.ConnectionError",
        "requests.exceptions.Timeout",
        "google.auth.exceptions.TransportError",
        "google.api_core.exceptions.RetryError",
        "google.api_core.exceptions.ServiceUnavailable",
        "google.api_core.exceptions.GatewayTimeout",
        "google.api_core.exceptions.TooManyRequests",
        # refused, reset or aborted sockets (the database's come wrapped as the errors above)
        "builtins.ConnectionError",
    }),
}
# SQLAlchemy says when an error cost it the connection (a server that restarted under a pooled one),
# whatever the error's class.
_DATABASE_BASE = "sqlalchemy.exc.DBAPIError"


def outage_of(exc: BaseException) -> Outage | None:
    """The service `exc` itself says could not be reached, or None."""
    names = {f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__}
    for outage, errors in _ERRORS.items():
        if names & errors:
            return outage
    if _DATABASE_BASE in names and getattr(exc, "connection_invalidated", False):
        return Outage.DATABASE
    return None


def classify(exc: BaseException) -> Outage | None:
    """The service that `exc`, or any error it was raised from, says could not be reached; None when
    none does (then the error is the request's or the job's own)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if (outage := outage_of(cause)) is not None:
            return outage
        cause = cause.__cause__ or cause.__context__
    return None


def is_outage(exc: BaseException) -> bool:
    return classify(exc) is not None


def error_classes() -> tuple[type[Exception], ...]:
    """The classes outage_of recognises by their class alone, for a framework that dispatches on the class
    (the API's exception handlers), those importable here. Not DBAPIError, which is judged one error at a
    time: a handler of its own would take every database error (an IntegrityError) for a moment."""
    found: list[type[Exception]] = []
    for name in sorted(set().union(*_ERRORS.values())):
        module, _, qualname = name.rpartition(".")
        try:
            found.append(getattr(importlib.import_module(module), qualname))
        except (ImportError, AttributeError):  # a client this process does not use
            continue
    return tuple(found)
