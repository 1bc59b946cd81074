"""The API while PostgreSQL or storage is down: a 503 within seconds that says which, not a 500 after
minutes (issue 8), and normal answers again as soon as it is back, with nothing restarted.

- Storage: every request runs under the API's storage limits (trainjobs/storage_limits.py), so a call
  to storage that cannot be reached gives up after seconds instead of the client's 120 s of retries.
- PostgreSQL: the engine's connect and pool timeouts (service/db/session.py) bound the wait; the pool's
  pre-ping replaces dropped connections once the server is back.
Both kinds of error are answered here, once, for every route; which errors they are is the data
layer's classifier (service/db/outages.py), the worker's too.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from service.db.outages import error_classes, outage_of
from service.errors import error_response
from trainjobs.storage_limits import API_LIMITS, limited_calls

log = logging.getLogger("trainjobs.api")

RETRY_AFTER_S = 5  # a hint to clients; outages we recover from last seconds to minutes


class StorageLimits:
    """Runs each request under API_LIMITS. The limits are a context variable, so they reach the
    threadpool that runs sync routes and streams responses, and nothing outside a request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with limited_calls(API_LIMITS):
            await self.app(scope, receive, send)


def install(app: FastAPI) -> None:
    app.add_middleware(StorageLimits)

    async def unavailable(request: Request, exc: Exception) -> JSONResponse:
        outage = outage_of(exc)
        assert outage is not None, "registered only for the classes the classifier names"
        log.warning("%s %s: %s unreachable: %s", request.method, request.url.path, outage.name.lower(), _first_line(exc))
        return error_response(503, "unavailable", f"{outage.value} is unavailable; try again shortly",
                              headers={"Retry-After": str(RETRY_AFTER_S)})

    for error in error_classes():
        app.add_exception_handler(error, unavailable)


def _first_line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
