"""One JSON error shape, {"error": {"error", "message", "details"}}, for every 4xx and 5xx."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.db.admission import Refusal
from trainjobs.spec import describe_errors

log = logging.getLogger("trainjobs.api")

_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
          409: "conflict", 413: "too_large", 415: "unsupported_media_type", 422: "invalid_request", 503: "unavailable"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, details: list[dict[str, str]] | None = None):
        self.status, self.message, self.code, self.details = status, message, code or _CODES.get(status, "error"), details or []


def error_response(status: int, code: str, message: str, details: list[dict[str, Any]] | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"error": code, "message": message, "details": details or []}}, status, headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.details)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        details = describe_errors(list(exc.errors()), strip=("body", "query", "path", "header"))
        summary = "; ".join(f"{d['field']}: {d['reason']}" for d in details[:5])
        return error_response(422, "invalid_spec", f"invalid request: {summary}", details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, _CODES.get(exc.status_code, "error"), str(exc.detail),
                              headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(500, "internal", "internal error; it has been logged")


def refused(refusals: Sequence[Refusal]) -> ApiError:
    """The 422 for what this deployment does not admit (service/db/admission.py), naming each field."""
    return ApiError(422, "; ".join(f"{r.field}: {r.reason}" for r in refusals), refusals[0].code,
                    [r.detail() for r in refusals])
