"""ASGI middleware around the API: request bodies capped while they arrive, failed key checks
throttled, unexpected errors answered without costing the client its keep-alive connection, and the
browser told what the pages may load."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.auth_throttle import AuthThrottle, address_key, watch_key_check
from service.db.projects import hash_key
from service.deps import UNKNOWN_KEY, bearer_secret
from service.errors import error_response


@dataclass(frozen=True)
class BodyLimit:
    max_bytes: int
    message: str  # for the 413, e.g. "a job spec is limited to 256 KiB"


class BodyTooLarge(HTTPException):
    def __init__(self, limit: BodyLimit) -> None:
        super().__init__(413, limit.message)


class BodyLimits:
    """413 as soon as a request body passes its cap: before reading it when Content-Length says so,
    else when the bytes received pass it. The cap holds while the body arrives, so an oversized body is
    never whole in memory (JSON) or on disk (multipart spooling) and never reaches a parser."""

    def __init__(self, app: ASGIApp, limit_for: Callable[[str, str], BodyLimit]) -> None:
        self.app, self.limit_for = app, limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["method"], scope["path"])
        declared = Request(scope).headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit.max_bytes:
            # Answered unread: uvicorn discards the rest of the body and keeps the connection.
            await error_response(413, "too_large", limit.message)(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit.max_bytes:
                    # FastAPI re-raises an HTTPException from body reading, and the app's handler answers it.
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, counted, send)


class AnswerUnexpectedErrors:
    """Starlette's ServerErrorMiddleware answers an unhandled exception and then re-raises it for the
    server to log, and uvicorn closes the connection on any exception (h11_impl.run_asgi): one bad
    request would cost a client its connection. This answers with the app's own handler for Exception
    (which logs it) and stops the exception here. Only a response already half sent still needs the
    close, to tell the client it is incomplete."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            handler = scope["app"].exception_handlers.get(Exception) if "app" in scope else None
            if started or scope["type"] != "http" or handler is None:
                raise
            response = await handler(Request(scope, receive), exc)
            await response(scope, receive, send)


class ThrottleFailedAuth:
    """Answers a request that presents a key (service.auth_throttle):
    - 429 with Retry-After while its address has spent its failures for the window, unless its key
      was accepted by this process within the last minutes (one tenant's flood from a shared address,
      127.0.0.1 on one host or an untrusted proxy, must not lock the others out);
    - 401 from memory when its key was refused moments ago, without a database turn;
    - otherwise as the app does, counting a 401 against the address and caching the key's hash.

    The address is the connection's peer as the server saw it: behind a proxy that is the proxy,
    unless the server is told to believe the proxy's X-Forwarded-For (TRAINJOBS_TRUSTED_PROXIES)."""

    def __init__(self, app: ASGIApp, throttle: AuthThrottle) -> None:
        self.app, self.throttle = app, throttle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        secret = bearer_secret(Request(scope).headers.get("authorization", "")) if scope["type"] == "http" else None
        if secret is None:  # nothing to look up: a missing key costs the database nothing
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        address = address_key(client[0] if client else None)
        key_hash = hash_key(secret)
        if not self.throttle.known_good(key_hash) and (wait := self.throttle.retry_after(address)) is not None:
            seconds = math.ceil(wait)
            await error_response(429, "too_many_requests", f"too many unknown API keys from this address: "
                                 f"try again in {seconds} s", headers={"Retry-After": str(seconds)})(scope, receive, send)
            return
        if self.throttle.known_bad(key_hash):
            self.throttle.failed(address, key_hash)
            await error_response(401, "unauthorized", UNKNOWN_KEY)(scope, receive, send)
            return
        status, check = 0, watch_key_check()

        async def watched(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await self.app(scope, receive, watched)
        if status == 401:
            self.throttle.failed(address, key_hash)
        elif check["accepted"]:
            self.throttle.accepted(key_hash)


# The dashboard keeps an API key in sessionStorage: no script but its own may run on this origin, and
# no other site may frame it (clickjacking the Cancel button). Its pages use no inline script or style.
SECURITY_HEADERS = (
    (b"content-security-policy",
     b"default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'"),
    (b"x-content-type-options", b"nosniff"),  # an artifact served as text/plain is never run as script
    (b"referrer-policy", b"no-referrer"),  # job ids in /ui/#/jobs/<id> stay on this origin
    (b"x-frame-options", b"DENY"),  # frame-ancestors, for browsers that predate it
)


class SecurityHeaders:
    """Adds SECURITY_HEADERS to every response, the API's JSON and errors included (a JSON body opened
    in a browser tab is a page of this origin too); a header a route set itself is kept."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [(name, value) for name, value in SECURITY_HEADERS if name not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)
