"""How long a storage call waits for storage that does not answer.

The google-cloud-storage client retries a refused or dropped connection for up to 120 s (its
DEFAULT_RETRY deadline), each request with a 60 s timeout. That patience suits an agent in the middle
of training; an API request that waits that long answers a 500 after minutes (issue 8: 79-166 s with
the emulator down). The client takes a retry and a timeout per call but has no default for a whole
process, and calls are made in many places, so the limits live on its HTTP transport: every client
built through `honours_call_limits` carries an adapter that reads the limits in force in the calling
context (`limited_calls`) and, once storage has been unreachable for `give_up_after_s`, raises
StorageUnavailable, which the client's retry does not retry. Outside `limited_calls` the client
behaves exactly as shipped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache, wraps
from typing import Any, ParamSpec


@dataclass(frozen=True)
class CallLimits:
    """give_up_after_s is looked at when a try fails, and the client sleeps a random, doubling while
    between tries (up to 1 s, 2 s, 4 s, ...): a call gives up within about three times it."""

    connect_timeout_s: float  # to open a connection
    read_timeout_s: float  # for the next bytes of an answer
    give_up_after_s: float  # unreachable this long (refused, reset, timed out), the client's retries included


# An API request: someone is waiting, and a 503 they can retry beats a 500 minutes later.
API_LIMITS = CallLimits(connect_timeout_s=3.0, read_timeout_s=20.0, give_up_after_s=3.0)
# A worker driving a job: it retries a failed step itself, without counting an outage against the
# job (service/db/outages.py), so giving up early costs nothing; a step stuck in storage for minutes would
# hold up a cancel or a shutdown.
WORKER_LIMITS = CallLimits(connect_timeout_s=5.0, read_timeout_s=60.0, give_up_after_s=5.0)

# DEFAULT_RETRY sleeps at most 60 s between two tries of one call: failures further apart than this
# belong to different calls, and the later one starts counting afresh.
_LONGEST_RETRY_GAP_S = 60.0


class StorageUnavailable(Exception):
    """Storage could not be reached within the limits in force; raised from the last connection error."""


_in_force: ContextVar[CallLimits | None] = ContextVar("storage_call_limits", default=None)


@contextmanager
def limited_calls(limits: CallLimits) -> Iterator[None]:
    """Storage calls made in this context honour `limits`; so do those made in threads that run with
    a copy of it (Starlette's threadpool does), but not those of threads started from it."""
    token = _in_force.set(limits)
    try:
        yield
    finally:
        _in_force.reset(token)


def in_force() -> CallLimits | None:
    """The limits storage calls made here honour (None: the client's own), for work handed to another
    process that should honour them too (worker/staging_child.py)."""
    return _in_force.get()


class _FailureRun(threading.local):
    """Since when this thread's storage requests have failed in a row. One call's retries run in the
    thread that made it, so a run spans them."""

    since: float | None = None
    last: float = 0.0

    def failing_for(self, attempt_started: float) -> float:
        now = time.monotonic()
        if self.since is None or now - self.last > _LONGEST_RETRY_GAP_S:
            self.since = attempt_started
        self.last = now
        return now - self.since

    def end(self) -> None:
        self.since = None


_run = _FailureRun()
P = ParamSpec("P")


def honours_call_limits(make_client: Callable[P, Any]) -> Callable[P, Any]:
    """Decorates a storage-client factory: each client it makes honours the limits in force."""

    @wraps(make_client)
    def make(*args: P.args, **kwargs: P.kwargs) -> Any:
        client = make_client(*args, **kwargs)
        _mount(client._http)  # the client's requests session (google.cloud.client.Client._http)
        return client

    return make


def _mount(session: Any) -> None:
    from requests.adapters import HTTPAdapter

    limited = _limited_adapter_class()
    for prefix in ("http://", "https://"):
        # Only the stock adapter is replaced: an mTLS adapter google-auth mounted stays as it is.
        if type(session.get_adapter(prefix + "x")) is HTTPAdapter:
            session.mount(prefix, limited())


@cache
def _limited_adapter_class() -> type[Any]:
    import requests
    from requests.adapters import HTTPAdapter

    class LimitedAdapter(HTTPAdapter):
        def send(self, request: requests.PreparedRequest, stream: bool = False, timeout: Any = None,
                 verify: bool | str = True, cert: Any = None, proxies: Any = None) -> requests.Response:
            limits = _in_force.get()
            if limits is None:
                return super().send(request, stream=stream, timeout=timeout, verify=verify, cert=cert, proxies=proxies)
            started = time.monotonic()
            try:
                response = super().send(request, stream=stream, timeout=_capped(timeout, limits), verify=verify,
                                        cert=cert, proxies=proxies)
            except (requests.ConnectionError, requests.Timeout) as exc:
                failing_for = _run.failing_for(started)
                if failing_for >= limits.give_up_after_s:
                    raise StorageUnavailable(f"storage unreachable for {failing_for:.1f}s "
                                             f"({type(exc).__name__} on {request.method} {request.url})") from exc
                raise  # the client's retry tries again (or, for a write it must not repeat, gives up)
            _run.end()
            return response

    return LimitedAdapter


def _capped(timeout: Any, limits: CallLimits) -> tuple[float, float]:
    connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
    return _smaller(connect, limits.connect_timeout_s), _smaller(read, limits.read_timeout_s)


def _smaller(given: Any, limit: float) -> float:
    return min(float(given), limit) if isinstance(given, int | float) else limit
