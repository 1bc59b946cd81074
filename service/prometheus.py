"""Prometheus for the API: request latency by route template and status code, and jobs by status.

The latency middleware is plain ASGI and does one clock read and one histogram observation per
request (the API's speed is benchmarked, bench/). It measures until the response headers are sent,
so a following stream (hours long) counts as quickly answered, which it was. Jobs by status are read
at scrape time with one grouped COUNT, not kept as counters that a second API process would not see.

Each app has its own registry, so several apps in one process (the tests) do not collide.
/metrics is unauthenticated, as Prometheus scrapes it: it shows counts and latencies, no job of anyone.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.db import jobs as data
from service.db.session import transaction
from trainjobs.states import JobStatus

LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class RequestLatency:
    """trainjobs_api_request_duration_seconds{method, route, code}. `route` is the matched template
    (/v1/jobs/{job_id}), never the raw path, so ids do not make a series each; unmatched paths are one
    series, "unmatched"."""

    def __init__(self, app: ASGIApp, histogram: Histogram) -> None:
        self.app, self.histogram = app, histogram
        self._children: dict[tuple[str, str, str], Histogram] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.start":
                self._observe(scope, str(message["status"]), time.perf_counter() - started)
            await send(message)

        await self.app(scope, receive, timed)

    def _observe(self, scope: Scope, code: str, seconds: float) -> None:
        route = getattr(scope.get("route"), "path", None) or "unmatched"
        key = (scope["method"], route, code)
        if (child := self._children.get(key)) is None:
            child = self._children[key] = self.histogram.labels(*key)
        child.observe(seconds)


class JobsByStatus(Collector):
    def __init__(self, factory: sessionmaker[Session]) -> None:
        self.factory = factory

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily("trainjobs_jobs_count_up", "1 when this scrape could count jobs in PostgreSQL")
        try:
            with transaction(self.factory) as session:
                counts = data.count_by_status(session)
        except Exception:  # the database is down: the request latencies are still worth a scrape
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        family = GaugeMetricFamily("trainjobs_jobs", "Jobs by status, all projects", labels=["status"])
        for status in JobStatus:
            family.add_metric([status.value], counts.get(status, 0))
        yield family


class KeyCacheCounts(Collector):
    """This process's key cache (service/key_cache.py): each process of `api --workers N` has its own."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        cache = getattr(self.app.state, "key_cache", None)
        if cache is None:  # TRAINJOBS_API_KEY_CACHE_TTL_S=0
            return
        counts = cache.counts
        for name, value, what in (("hits", counts.hits, "key checks answered from memory"),
                                  ("misses", counts.misses, "key checks that asked PostgreSQL"),
                                  ("invalidations", counts.invalidations,
                                   "keys forgotten: revoked (NOTIFY), or all on a lost listener connection"),
                                  ("listener_connects", counts.listener_connects,
                                   "times the revocation listener (re)connected")):
            yield CounterMetricFamily(f"trainjobs_api_key_cache_{name}", f"API key cache: {what}", value=value)
        yield GaugeMetricFamily("trainjobs_api_key_cache_keys", "API keys remembered now", value=cache.size())


def install(app: FastAPI, factory: sessionmaker[Session]) -> None:
    """Serve GET /metrics and time every request; add it last, so it times the other middleware too."""
    registry = CollectorRegistry()
    histogram = Histogram("trainjobs_api_request_duration_seconds", "API requests: seconds until the response "
                          "headers were sent", ["method", "route", "code"], registry=registry, buckets=LATENCY_BUCKETS)
    registry.register(JobsByStatus(factory))
    registry.register(KeyCacheCounts(app))

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(RequestLatency, histogram=histogram)
