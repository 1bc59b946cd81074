"""Prometheus /metrics: the API's (request latency by route template and code, jobs by status) and the
worker's (claims, phases, staging, machines, driver errors), read back with Prometheus' own parser."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import httpx
from prometheus_client.parser import text_string_to_metric_families

from service.db.jobstate import JobStatus
from tests.support.jobs import digits_spec
from tests.support import eventually
from tests.support.worker import make_worker, submit, wait_for
from trainjobs import storage
from trainjobs.job_paths import DATASET_MANIFEST
from trainjobs.loopback import free_port
from trainjobs.spec import JobSpec
from worker import prometheus
from worker.memory_cloud import MemoryCloud


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample(values: dict, name: str, **labels: str) -> float:
    return values.get((name, frozenset(labels.items())), 0.0)


def worker_sample(name: str, **labels: str) -> float:
    return prometheus.REGISTRY.get_sample_value(name, labels) or 0.0


def test_api_metrics_count_jobs_by_status_across_projects(api, api_url, db):
    from tests.support.jobs import make_key

    for _ in range(2):
        assert api.post("/v1/jobs", json=digits_spec()).status_code == 201
    other = httpx.post(f"{api_url}/v1/jobs", json=digits_spec(), headers={"Authorization": f"Bearer {make_key(db, 'beta')}"})
    api.post(f"/v1/jobs/{other.json()['id']}/cancel", headers={"Authorization": other.request.headers["authorization"]})

    response = httpx.get(f"{api_url}/metrics")  # no key: Prometheus scrapes it
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    values = samples(response.text)
    assert sample(values, "trainjobs_jobs", status="QUEUED") == 2
    assert sample(values, "trainjobs_jobs", status="CANCELLED") == 1
    assert sample(values, "trainjobs_jobs", status="RUNNING") == 0
    assert sample(values, "trainjobs_jobs_count_up") == 1


def test_api_request_latency_is_labelled_by_route_template_and_code(api, api_url):
    before = samples(httpx.get(f"{api_url}/metrics").text)
    job = api.post("/v1/jobs", json=digits_spec()).json()
    api.get(f"/v1/jobs/{job['id']}")
    api.get(f"/v1/jobs/{uuid.uuid4()}")
    api.get(f"/no/such/path/{uuid.uuid4()}")
    after = samples(httpx.get(f"{api_url}/metrics").text)

    def grew(**labels: str) -> float:
        name = "trainjobs_api_request_duration_seconds_count"
        return sample(after, name, **labels) - sample(before, name, **labels)

    assert grew(method="POST", route="/v1/jobs", code="201") == 1
    assert grew(method="GET", route="/v1/jobs/{job_id}", code="200") == 1
    assert grew(method="GET", route="/v1/jobs/{job_id}", code="404") == 1
    assert grew(method="GET", route="unmatched", code="404") == 1  # one series, whatever the path
    assert not any(job["id"] in str(labels) for _, labels in after)


def test_worker_counts_claims_phases_and_machines(db, database_url, running_workers):
    names = ["trainjobs_worker_claims_total", "trainjobs_worker_machines_created_total",
             "trainjobs_worker_machines_deleted_total", "trainjobs_worker_claim_seconds_count"]
    labels = [{"kind": "queued"}, {}, {}, {}]
    before = [worker_sample(n, **lb) for n, lb in zip(names, labels)]
    phases_before = {p: worker_sample("trainjobs_worker_phase_seconds_count", phase=p)
                     for p in ("STAGING", "PROVISIONING", "RUNNING")}
    cloud = MemoryCloud()
    w = make_worker(database_url, cloud, "metrics")
    running_workers.append(w)
    w.start()
    ids = submit(db, 2)
    for job_id in ids:
        wait_for(db, job_id, {JobStatus.SUCCEEDED}, timeout=15)
    grown = [worker_sample(n, **lb) - b for n, lb, b in zip(names, labels, before)]
    assert grown[:3] == [2, 2, 2]
    assert grown[3] >= 2  # every claim statement, found a job or not
    for phase, count in phases_before.items():
        assert worker_sample("trainjobs_worker_phase_seconds_count", phase=phase) - count == 2, phase


def test_worker_counts_driver_errors_and_reaped_machines(db, database_url, running_workers):
    from worker.ports import MachineRequest

    errors_before = worker_sample("trainjobs_worker_driver_errors_total", kind="error")
    reaped_before = worker_sample("trainjobs_worker_machines_reaped_total")

    def broken_stager(*args: object, **kwargs: object) -> str:
        raise RuntimeError("stager bug")

    cloud = MemoryCloud()
    stray = MachineRequest(str(uuid.uuid4()), 1, JobSpec.model_validate(digits_spec()), "mem://nowhere")
    cloud.create(stray)
    w = make_worker(database_url, cloud, "errors", stager=broken_stager, reap_every_s=0.05)
    w.config.driver.retry_backoff_s = 0.01
    running_workers.append(w)
    w.start()
    [job_id] = submit(db)
    job = wait_for(db, job_id, {JobStatus.FAILED}, timeout=20)
    assert "stager bug" in (job.error or "")
    assert worker_sample("trainjobs_worker_driver_errors_total", kind="error") - errors_before == \
        w.config.driver.max_driver_failures
    eventually(lambda: cloud.get(stray) is None, 10, "the reaper deleted the stray machine")
    assert worker_sample("trainjobs_worker_machines_reaped_total") - reaped_before == 1


def test_staging_counts_uploaded_bytes_and_time_by_outcome(bucket, tmp_path):
    from worker.staging_adapter import GcsStager

    spec = JobSpec.model_validate(digits_spec())
    bytes_before = worker_sample("trainjobs_worker_staging_bytes_total")
    staged_before = worker_sample("trainjobs_worker_staging_seconds_count", outcome="staged")
    reused_before = worker_sample("trainjobs_worker_staging_seconds_count", outcome="reused")
    stager = GcsStager(tmp_path)
    uri = stager(spec, "job-1", project_id=str(uuid.uuid4()))
    _, prefix = storage.split_uri(uri + "/")
    shards = sum(b.size for b in storage.client().list_blobs(bucket, prefix=prefix) if not b.name.endswith(DATASET_MANIFEST))
    assert worker_sample("trainjobs_worker_staging_bytes_total") - bytes_before == shards > 0
    assert worker_sample("trainjobs_worker_staging_seconds_count", outcome="staged") - staged_before == 1

    stager(spec, "job-2", project_id=str(uuid.uuid4()))  # same content: nothing uploaded
    assert worker_sample("trainjobs_worker_staging_bytes_total") - bytes_before == shards
    assert worker_sample("trainjobs_worker_staging_seconds_count", outcome="reused") - reused_before == 1


def test_worker_command_serves_its_metrics_on_the_port_asked(database_url, tmp_path):
    port = free_port()
    env = dict(os.environ, TRAINJOBS_DATABASE_URL=database_url)
    proc = subprocess.Popen([sys.executable, "-m", "stack.cli", "worker", "--provisioner", "memory",
                             "--data-dir", str(tmp_path), "--metrics-port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    def claims_served() -> float:
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        try:
            return sample(samples(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text),
                          "trainjobs_worker_claim_seconds_count")
        except httpx.HTTPError:  # not serving yet
            return 0.0

    try:
        # The claim loop polls from the start: its latency is observed within seconds.
        eventually(claims_served, 30, f"the worker served a claim latency on port {port}", every=0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
