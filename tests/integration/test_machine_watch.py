"""Watching many jobs' machines within Google's API quotas (issue 25): a worker's jobs share one listing
per zone on a schedule instead of each reading its machine every step, still notice a preemption, and
ride out the project's rate quota. Every count is the fake cloud's own (the requests it received), on
jobs driven by a real worker through the real Google clients; the agents are stand-ins (no TensorFlow)."""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from service.db import jobs as jobdata
from service.db.models import Job
from service.db.session import transaction
from stack.fakecloud import FakeComputeApi, FakeTpuApi
from stack.fakecloud.server import RecordedRequest
from tests.support import eventually, scaled
from tests.support.fleet import Fleet, fleet
from tests.support.worker import path
from trainjobs.states import JobStatus
from trainjobs.vm_metadata import LABEL_MACHINE
from worker import prometheus
from worker.gcp.compute import compute_clients
from worker.gcp.config import GcpConfig
from worker.gcp.errors import is_rate_limited
from worker.gcp.machine_watch import WatchConfig
from worker.gcp.tpu import tpu_client

PRODUCT = {"tpu": "cloud-tpu", "gpu": "compute-engine"}
S = JobStatus


def statuses(f: Fleet, ids: list[uuid.UUID]) -> dict[uuid.UUID, Job]:
    with transaction(f.factory) as s:
        return {i: s.get(Job, i) for i in ids}


def all_in(f: Fleet, ids: list[uuid.UUID], wanted: set[JobStatus]) -> bool:
    return all(j.status in wanted for j in statuses(f, ids).values())


def one_machine(r: RecordedRequest) -> bool:
    """A read of one job's machine, not a listing of every machine: TPU get_node/get_queued, Compute Engine
    instances.get or a list filtered to one machine's label."""
    return r.method == "GET" and ("/nodes/" in r.path or "/queuedResources/" in r.path or "/instances/" in r.path
                                  or LABEL_MACHINE in r.query.get("filter", ""))


def listing(r: RecordedRequest) -> bool:
    return r.method == "GET" and r.path.endswith(("/nodes", "/instances")) and LABEL_MACHINE not in r.query.get("filter", "")


def requests_after_a_listing(f: Fleet, window: float) -> list[RecordedRequest]:
    """The cloud requests of `window` seconds, counted from a listing that began after the last create
    (every machine in it: from then on it answers the jobs)."""
    settled = len(f.fake.requests)
    eventually(lambda: any(listing(r) for r in f.fake.requests[settled:]), 30, "a listing after the creates")
    start = len(f.fake.requests)
    time.sleep(window)  # deliberately: the window is what is counted; fewer requests on a slow machine, never more
    return f.fake.requests[start:]


def metrics() -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The worker's /metrics, parsed as Prometheus would."""
    text = generate_latest(prometheus.REGISTRY).decode()
    return {(s.name, frozenset(s.labels.items())): s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


def metric(name: str, **labels: str) -> float:
    return metrics().get((name, frozenset(labels.items())), 0.0)


@pytest.mark.parametrize("product", ["tpu", "gpu"])
def test_running_jobs_share_one_listing_per_zone_and_never_read_their_own_machine(
        db, database_url: str, tmp_path: Path, product: str) -> None:
    every = 1.0
    with fleet(database_url, db, product, tmp_path, jobs=10, train_s=600, poll_s=0.2,
               watch=WatchConfig(every_s=every, soon_s=0.5, max_every_s=8, max_age_s=60)) as f:
        ids = f.submit(product, 10)
        eventually(lambda: all_in(f, ids, {S.RUNNING}), 60, "all 10 jobs RUNNING")
        window = 3 * every
        seen = requests_after_a_listing(f, window)
        # 10 jobs polled every 0.2 s for 3 s: 150 reads of their own without the watch; none with it.
        assert [r.path for r in seen if one_machine(r)] == []
        # One listing per interval (at 80-100% of it, jittered), one request per zone (TPU: nodes' and queued).
        assert 1 <= len([r for r in seen if listing(r)]) <= window / (0.8 * every) + 1
        assert all_in(f, ids, {S.RUNNING})

        # A cancel still ends at once: the teardown lists afresh, it does not wait for the schedule.
        with transaction(f.factory) as s:
            project = s.get(Job, ids[0]).project_id
        for i in ids:  # one transaction each, as the API's (one holding every row can deadlock with a driver)
            with transaction(f.factory) as s:
                jobdata.request_cancel(s, project, i)
        eventually(lambda: all_in(f, ids, {S.CANCELLED}), 5, "all 10 jobs CANCELLED")
        eventually(lambda: machines(f) == [], 10, lambda: f"machines deleted; left: {machines(f)}")


@pytest.mark.parametrize("product", ["tpu", "gpu"])
def test_a_preempted_spot_machine_is_noticed_from_the_listing_and_the_job_recovers(
        db, database_url: str, tmp_path: Path, product: str) -> None:
    with fleet(database_url, db, product, tmp_path, jobs=3, train_s=scaled(3), poll_s=0.2,
               watch=WatchConfig(every_s=1.0, soon_s=0.5, max_every_s=4, max_age_s=60)) as f:
        ids = f.submit(product, 3, spot=True)
        eventually(lambda: all_in(f, ids, {S.RUNNING}), 60, "all 3 jobs RUNNING")
        [victim] = [m for m in machines(f) if ids[0].hex[:20] in m]
        f.fake.preempt(victim)  # Compute Engine: a spot VM, deleted by Google (instanceTerminationAction DELETE)
        eventually(lambda: all_in(f, ids, {S.SUCCEEDED}), 60, lambda: f"all SUCCEEDED: {statuses(f, ids)}")
        jobs = statuses(f, ids)
        assert [jobs[i].attempt for i in ids] == [2, 1, 1]
        assert path(f.factory, ids[0]) == ["QUEUED", "STAGING", "PROVISIONING", "RUNNING", "RECOVERING", "PROVISIONING",
                                           "RUNNING", "SUCCEEDED"]


@pytest.mark.parametrize("product", ["tpu", "gpu"])
def test_jobs_ride_out_the_project_s_read_quota_and_the_backoff_shows_on_metrics(
        db, database_url: str, tmp_path: Path, product: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "trainjobs.worker")
    kind = PRODUCT[product]
    refused_before = metric("trainjobs_worker_cloud_rate_limited_total", product=kind)
    errors_before = metric("trainjobs_worker_driver_errors_total", kind="error")
    with fleet(database_url, db, product, tmp_path, jobs=4, train_s=scaled(5), poll_s=0.2,
               watch=WatchConfig(every_s=1.0, soon_s=0.5, max_every_s=4, max_age_s=60)) as f:
        ids = f.submit(product, 4)
        eventually(lambda: all_in(f, ids, {S.RUNNING}), 60, "all 4 jobs RUNNING")
        # For a while the quota serves half the watch's need (a listing a second: 2 reads on Cloud TPU,
        # nodes and queued resources; 1 on Compute Engine): until the worker shows it lists less often.
        per_listing = 2 if product == "tpu" else 1
        f.fake.limit_reads(5 * per_listing, window_s=10.0)
        interval = eventually(lambda: metric("trainjobs_worker_machine_listing_interval_seconds", product=kind) > 1.0
                              and metric("trainjobs_worker_machine_listing_interval_seconds", product=kind), 30,
                              "the listing interval stretched on /metrics")
        f.fake.limit_reads(None)
        assert interval >= 2.0
        eventually(lambda: all_in(f, ids, {S.SUCCEEDED, S.FAILED, S.CANCELLED}), 60,
                   lambda: f"all ended: {statuses(f, ids)}")
        jobs = statuses(f, ids)
        assert {j.status for j in jobs.values()} == {S.SUCCEEDED}
        assert {j.attempt for j in jobs.values()} == {1}  # no machine given up for want of a look at it
        assert sum(f.fake.rate_limited.values()) > 0  # the quota did refuse reads
    assert metric("trainjobs_worker_cloud_rate_limited_total", product=kind) > refused_before
    assert metric("trainjobs_worker_driver_errors_total", kind="error") == errors_before  # none held against a job
    assert any(f"{kind} rate-limited" in r.getMessage() and "listing its machines every" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("product, refusal", [("tpu", "TooManyRequests"), ("gpu", "Forbidden")])
def test_the_fakes_count_requests_by_method_and_refuse_reads_over_the_quota_as_google_does(
        tmp_path: Path, product: str, refusal: str) -> None:
    """Cloud TPU answers a rate quota 429 RESOURCE_EXHAUSTED (ErrorInfo RATE_LIMIT_EXCEEDED), Compute
    Engine 403 with errors[].reason rateLimitExceeded: through the real clients, one is TooManyRequests,
    the other Forbidden, and both are rate limits to the worker, not a refusal or a missing permission."""
    fake: FakeTpuApi | FakeComputeApi = (FakeTpuApi if product == "tpu" else FakeComputeApi)(
        sandbox=tmp_path, boot=False).start()
    try:
        if isinstance(fake, FakeTpuApi):
            client = tpu_client(GcpConfig("proj", "us-central1-a", tpu_api_endpoint=fake.url))
            def read() -> object:
                return list(client.list_nodes(parent="projects/proj/locations/us-central1-a"))
        else:
            clients = compute_clients(GcpConfig("proj", "us-central1-a", compute_api_endpoint=fake.url))
            def read() -> object:
                return list(clients.instances.list(project="proj", zone="us-central1-a"))
        fake.limit_reads(2, window_s=60)
        read(), read()
        with pytest.raises(Exception) as refused:
            read()
        assert type(refused.value).__name__ == refusal and is_rate_limited(refused.value)
        assert "Read requests per minute" in str(refused.value)
        key = "GET list_nodes" if product == "tpu" else "GET list"
        assert fake.request_counts() == {key: 3}
        assert httpx.get(f"{fake.url}/_fake/requests").json() == {"requests": {key: 3}, "rate_limited": {key: 1}}
        fake.limit_reads(None)
        read()
    finally:
        fake.stop()


def machines(f: Fleet) -> list[str]:
    return f.fake.node_names() if isinstance(f.fake, FakeTpuApi) else f.fake.instance_names()
