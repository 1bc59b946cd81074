"""Request bodies parsed and validated off the event loop (issue 36, 1).

FastAPI parses a JSON body and validates it against the route's model on the event loop: while a 29 KB
sweep was validated (30-40 s before its checks were bounded), no other request of any project was
answered. A route that takes a spec declares its body as `Annotated[Any, Body(), deferred(Model)]`: the
OpenAPI document shows Model's schema as before (the docs page and the fuzz tests read it), but FastAPI
hands the route the parsed JSON as it came, and the route validates it with `validated(request, Model,
body)` on the API's few parsing threads. The JSON itself is parsed on them too (ParsedOffLoop); what
stays on the loop is receiving the body, capped at 256 KiB by service/middleware.BodyLimits.

The threads are TRAINJOBS_API_PARSE_THREADS (2) per server process, apart from the database turns
(service/deps.py): a body being validated never holds a turn another project's read waits for.
Validation is CPU work under the GIL, so more threads would only take turns.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, PlainValidator, ValidationError

from service.db.quotas import env_int
from service.deps import KeyCheckedFirst

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
DEFAULT_PARSE_THREADS = 2


def parse_threads() -> int:
    if (n := env_int("TRAINJOBS_API_PARSE_THREADS", DEFAULT_PARSE_THREADS)) < 1:
        raise ValueError("TRAINJOBS_API_PARSE_THREADS must be at least 1")
    return n


def deferred(model: type[BaseModel]) -> PlainValidator:
    """`Annotated[dict[str, Any], Body(), deferred(Model)]`: a body the OpenAPI document shows as Model,
    handed to the route as sent for `validated` to check."""
    return PlainValidator(_as_sent, json_schema_input_type=model)


def _as_sent(value: Any) -> Any:
    return value


async def in_parse_thread(request: Request, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) on one of the app's parsing threads, waiting for one in arrival order."""
    state = request.app.state
    limiter = getattr(state, "parse_limiter", None)
    if limiter is None:  # made here, in the server's event loop
        limiter = state.parse_limiter = anyio.CapacityLimiter(state.parse_threads)
    return await anyio.to_thread.run_sync(fn, *args, limiter=limiter)


async def validated(request: Request, model: type[M], body: Any) -> M:
    """`body` (the route's deferred(model) body) validated as FastAPI would have, off the event loop; a refusal
    is the same 422 (service/errors.py renders it, KeyCheckedFirst checks the key first)."""
    return await in_parse_thread(request, validate, model, body)


def validate(model: type[M], body: Any, context: dict[str, Any] | None = None) -> M:
    """`validated`'s work, for a route that does more on the same parsing thread."""
    try:
        return model.model_validate(body, context=context)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors, body=body) from None


class ParsedOffLoop(KeyCheckedFirst):
    """The route's JSON body parsed on a parsing thread: FastAPI reads it with `await request.json()`,
    which this request answers from the thread. A JSON error is raised as json.loads raises it, and
    FastAPI answers it as before (a 422, `json_invalid`)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def parsed_off_loop(request: Request) -> Response:
            return await handler(_ThreadParsedRequest(request.scope, request.receive))

        return parsed_off_loop


class _ThreadParsedRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = await in_parse_thread(self, json.loads, await self.body())
        return self._json
