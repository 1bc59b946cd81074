"""Prometheus for the worker (`trainjobs worker --metrics-port P`): claims, time in each phase,
staging, machines, driver errors, the clouds' rate limits and the shared machine listings. Counters live in this process's own registry; the worker loop,
driver, stager and reaper each make one call here where the thing happens.

Jobs by status are the API's to report (one COUNT over all jobs); these are what only a worker sees.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from trainjobs.states import JobStatus

log = logging.getLogger("trainjobs.worker")

REGISTRY = CollectorRegistry()
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_PHASE_SECONDS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600, 48 * 3600)

CLAIMS = Counter("trainjobs_worker_claims_total", "Jobs claimed; kind: queued (a new job) or takeover "
                 "(a lapsed lease)", ["kind"], registry=REGISTRY)
CLAIM_SECONDS = Histogram("trainjobs_worker_claim_seconds", "The claim statement's latency, found a job or not",
                          registry=REGISTRY, buckets=_SECONDS)
PHASE_SECONDS = Histogram("trainjobs_worker_phase_seconds", "Time a job spent in a status, observed as it "
                          "leaves it", ["phase"], registry=REGISTRY, buckets=_PHASE_SECONDS)
STAGING_SECONDS = Histogram("trainjobs_worker_staging_seconds", "Staging a job's dataset; outcome: staged, "
                            "reused (already in storage), rejected, stopped, error", ["outcome"], registry=REGISTRY,
                            buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800))
STAGING_BYTES = Counter("trainjobs_worker_staging_bytes_total", "Bytes of dataset shards uploaded by staging",
                        registry=REGISTRY)
MACHINES_CREATED = Counter("trainjobs_worker_machines_created_total", "Machines created for jobs",
                           registry=REGISTRY)
MACHINES_DELETED = Counter("trainjobs_worker_machines_deleted_total", "Machines deleted by job drivers",
                           registry=REGISTRY)
MACHINES_REAPED = Counter("trainjobs_worker_machines_reaped_total", "Orphaned machines deleted by the reaper",
                          registry=REGISTRY)
DRIVER_ERRORS = Counter("trainjobs_worker_driver_errors_total", "Driver steps that raised; kind: outage (a "
                        "service unreachable) or rate_limited (a cloud's API rate quota), neither counted against "
                        "the job, or error", ["kind"], registry=REGISTRY)
# The shared machine listings (worker/gcp/machine_watch.py); product: cloud-tpu or compute-engine.
CLOUD_RATE_LIMITED = Counter("trainjobs_worker_cloud_rate_limited_total", "Google API calls refused for the "
                             "project's rate quota (403 rateLimitExceeded, 429)", ["product"], registry=REGISTRY)
MACHINE_LISTINGS = Counter("trainjobs_worker_machine_listings_total", "Listings of a product's machines in every "
                           "zone, shared by the worker's jobs; outcome: ok, rate_limited, error", ["product", "outcome"],
                           registry=REGISTRY)
MACHINE_LOOKUPS = Counter("trainjobs_worker_machine_lookups_total", "A job's look at its machine; answer: listing "
                          "(the shared listing) or get (the job read its own machine)", ["product", "answer"],
                          registry=REGISTRY)
LISTING_INTERVAL = Gauge("trainjobs_worker_machine_listing_interval_seconds", "How often the machines are listed "
                         "now: the configured interval, longer while backing off from rate limits", ["product"],
                         registry=REGISTRY)


def claimed(takeover: bool) -> None:
    CLAIMS.labels("takeover" if takeover else "queued").inc()


def left_phase(job: Any, phase: JobStatus) -> None:
    """`job` (a jobs row) is leaving `phase`: observe how long it was there, from the row's own
    timestamp for that phase (RECOVERING and CANCELLING have none: the row's last update)."""
    since = {JobStatus.STAGING: job.staging_at, JobStatus.PROVISIONING: job.provisioning_at,
             JobStatus.RUNNING: job.running_at}.get(phase) or job.updated_at
    if since is not None:
        PHASE_SECONDS.labels(phase.value).observe(max(0.0, (datetime.now(UTC) - since).total_seconds()))


def serve(port: int, host: str = "0.0.0.0") -> None:
    """GET http://HOST:PORT/metrics from a daemon thread, for as long as the process runs."""
    start_http_server(port, addr=host, registry=REGISTRY)
    log.info("worker metrics on http://%s:%d/metrics", host, port)
