"""The FastAPI application, wired in one place."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from service import errors, outages, prometheus
from service.auth_throttle import AuthThrottle, AuthThrottleConfig
from service.db.session import POOL_TIMEOUT_S, check_migrated, get_engine, session_factory
from service.deps import db_threads
from service.key_cache import KeyCache, KeyListener, replace_dropped_connections, ttl_from_env
from service.middleware import AnswerUnexpectedErrors, BodyLimit, BodyLimits, SecurityHeaders, ThrottleFailedAuth
from service.request_body import parse_threads
from service.routes import artifacts, dashboard, datasets, health, jobs, modules, sweeps
from trainjobs.uploads import UploadKind, max_upload_bytes, too_large_message

MAX_JSON_BODY = 256 << 10  # a job spec; model.params alone is held to 64 KiB by the spec
# The multipart framing around an uploaded file (boundaries, part headers); the file itself is held
# to its exact cap by store_upload while it streams to storage.
MULTIPART_ALLOWANCE = 64 << 10
_UPLOADS: dict[str, UploadKind] = {"/v1/datasets": "dataset", "/v1/modules": "module"}


def body_limit(method: str, path: str) -> BodyLimit:
    if method == "POST" and (kind := _UPLOADS.get(path)):
        limit = max_upload_bytes(kind)
        return BodyLimit(limit + MULTIPART_ALLOWANCE, too_large_message(kind, limit))
    return BodyLimit(MAX_JSON_BODY, f"a request body (a job spec) is limited to {MAX_JSON_BODY >> 10} KiB: "
                                    "send data as a dataset (POST /v1/datasets), not inside the spec")


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    # What is alive once the app is built (modules, routes, models: hundreds of thousands of objects)
    # lives as long as the process: frozen out of the collector's reach, a full collection walks only
    # what requests made. Those collections were a list's p99 (issue 12: 139 ms -> 78 ms).
    gc.collect()
    gc.freeze()
    listener: KeyListener | None = getattr(app.state, "key_listener", None)
    if listener is not None:  # here, not in create_app: each server process (--workers) needs its own
        listener.start()
    try:
        yield
    finally:
        if listener is not None:
            listener.stop()


def create_app(database_url: str, *, check_schema: bool = True) -> FastAPI:
    engine = get_engine(database_url, pre_ping=False)  # deps.py retries a request's first statement instead
    if check_schema:
        check_migrated(engine)
    # docs_url/redoc_url None: FastAPI's pages load Swagger UI and ReDoc from a CDN onto the origin
    # that holds the dashboard's API key; /docs is our own page instead (routes/dashboard.py).
    app = FastAPI(title="trainjobs", version="0.1.0", lifespan=_lifespan, docs_url=None, redoc_url=None,
                  description="Run TensorFlow training jobs on Cloud TPUs and GPU VMs.")
    app.state.session_factory = session_factory(engine)
    app.state.read_factory = session_factory(engine.execution_options(isolation_level="AUTOCOMMIT"))  # same pool
    app.state.db_threads = db_threads()  # a bad TRAINJOBS_API_DB_THREADS stops the start, naming it
    app.state.db_wait_s = POOL_TIMEOUT_S  # longest wait for a database turn before a 503 (deps.in_db_thread)
    app.state.parse_threads = parse_threads()  # request bodies validated off the event loop (request_body.py)
    if (ttl := ttl_from_env()) > 0:  # accepted keys, forgotten on revoke (service/key_cache.py)
        app.state.key_cache = KeyCache(ttl)
        app.state.key_listener = KeyListener(engine, app.state.key_cache)
        for factory in (app.state.session_factory, app.state.read_factory):
            factory.configure(info={"key_cache": app.state.key_cache})
        replace_dropped_connections(engine)
    errors.install(app)
    outages.install(app)  # 503s, within seconds, while PostgreSQL or storage is down
    # The last added runs first: unexpected errors are answered around everything else.
    app.add_middleware(BodyLimits, limit_for=body_limit)
    # Before a body is read: a blocked address costs no upload. A bad TRAINJOBS_AUTH_* stops the start.
    app.add_middleware(ThrottleFailedAuth, throttle=AuthThrottle(AuthThrottleConfig.from_env()))
    app.add_middleware(AnswerUnexpectedErrors)
    app.add_middleware(SecurityHeaders)  # around the error answers too
    app.include_router(health.router)
    app.include_router(jobs.router)
    app.include_router(artifacts.router)
    app.include_router(datasets.router)
    app.include_router(modules.router)
    app.include_router(sweeps.router)
    dashboard.install(app)  # /ui, and / redirects there
    prometheus.install(app, app.state.session_factory)  # GET /metrics; its middleware, added last, times all
    return app
