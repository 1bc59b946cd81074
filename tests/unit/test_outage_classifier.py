"""One outage classifier for the API and the worker (service/db/outages.py): the union of what each
used to call an outage, judged the same way for both."""

from __future__ import annotations

import asyncio

import httpx
import psycopg
import pytest
import requests
from fastapi import FastAPI
from google.api_core import exceptions as gapi
from google.auth.exceptions import TransportError
from sqlalchemy import exc as sa

from service import outages as api_outages
from service.db.outages import Outage, classify, error_classes, is_outage
from trainjobs.storage_limits import StorageUnavailable

DATABASE_DOWN = [
    psycopg.OperationalError("connection refused"),
    psycopg.errors.AdminShutdown("terminating connection due to administrator command"),  # a subclass
    sa.OperationalError("SELECT 1", {}, psycopg.OperationalError("server closed the connection")),
    sa.InterfaceError("SELECT 1", {}, Exception("connection already closed")),
    sa.TimeoutError("QueuePool limit of size 10 overflow 20 reached"),
    sa.DBAPIError("SELECT 1", {}, Exception("lost"), connection_invalidated=True),
]
STORAGE_DOWN = [
    StorageUnavailable("storage did not answer within 3 s"),
    requests.ConnectionError("Max retries exceeded"),
    requests.Timeout("read timed out"),
    TransportError("could not refresh the token"),
    gapi.RetryError("Deadline of 120.0s exceeded", cause=None),
    gapi.ServiceUnavailable("503 backend error"),
    gapi.GatewayTimeout("504"),
    gapi.TooManyRequests("429 rate limit"),
    ConnectionRefusedError(111, "Connection refused"),
    ConnectionResetError(104, "Connection reset by peer"),
]
THE_JOBS_OWN = [
    ValueError("bad spec"),
    KeyError("epochs"),
    sa.IntegrityError("INSERT", {}, Exception("duplicate key")),
    sa.DBAPIError("SELECT 1", {}, Exception("syntax error"), connection_invalidated=False),
    gapi.NotFound("no such object"),
    gapi.Forbidden("permission denied"),
    OSError("disk full"),
]


@pytest.mark.parametrize("exc", DATABASE_DOWN, ids=lambda e: type(e).__name__)
def test_the_database_being_down_is_an_outage_of_the_database(exc: BaseException) -> None:
    assert classify(exc) is Outage.DATABASE and is_outage(exc)


@pytest.mark.parametrize("exc", STORAGE_DOWN, ids=lambda e: type(e).__name__)
def test_storage_being_down_is_an_outage_of_storage(exc: BaseException) -> None:
    assert classify(exc) is Outage.STORAGE and is_outage(exc)


@pytest.mark.parametrize("exc", THE_JOBS_OWN, ids=lambda e: type(e).__name__)
def test_any_other_error_is_no_outage(exc: BaseException) -> None:
    assert classify(exc) is None and not is_outage(exc)


def _raised(outer: Exception, inner: BaseException, *, explicit: bool) -> Exception:
    try:
        try:
            raise inner
        except BaseException as caught:
            if explicit:
                raise outer from caught
            raise outer
    except Exception as exc:
        return exc
    raise AssertionError("unreachable")


@pytest.mark.parametrize("explicit", [True, False], ids=["raised from", "raised while handling"])
def test_an_error_raised_from_an_outage_is_that_outage(explicit: bool) -> None:
    exc = _raised(RuntimeError("the step failed"), StorageUnavailable("down"), explicit=explicit)
    assert classify(exc) is Outage.STORAGE


def test_a_cycle_of_causes_ends() -> None:
    first, second = ValueError("a"), ValueError("b")
    first.__cause__, second.__cause__ = second, first
    assert classify(first) is None


@pytest.mark.parametrize("exc, service", [
    *((e, "the database") for e in DATABASE_DOWN if type(e) is not sa.DBAPIError),
    *((e, "storage") for e in STORAGE_DOWN),
], ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else v)
def test_the_api_answers_an_outage_with_a_503_naming_the_service(exc: BaseException, service: str) -> None:
    app = FastAPI()
    api_outages.install(app)

    @app.get("/fails")
    def fails() -> None:
        raise exc

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            return await client.get("/fails")

    r = asyncio.run(get())
    assert r.status_code == 503 and r.headers["retry-after"] == str(api_outages.RETRY_AFTER_S)
    assert r.json()["error"]["message"] == f"{service} is unavailable; try again shortly"


def test_the_api_registers_a_handler_for_every_class_the_classifier_names() -> None:
    app = FastAPI()
    api_outages.install(app)
    assert set(error_classes()) <= set(app.exception_handlers)
