"""Issue 18, finding 5: what a job's code can write (its logs, status.json, metrics.json, its artifact
manifest) is read within a cap, never whole: GET /logs serves pages with a cursor, a stream reads a
page per poll and metrics.json only when it changed, and a status over its cap fails the job with
a note that says so. Against the real API, PostgreSQL, the GCS emulator and, where the attack is a
job's, a real job's code."""

from __future__ import annotations

from datetime import datetime, timezone


from tests.support.jobs import digits_spec
from tests.support.streams import Follower
from trainjobs import storage
from trainjobs.job_paths import JobPaths
from worker.gcs_channel import GcsJobChannel

MiB = 1 << 20


def _log_lines(count: int, width: int = 99) -> bytes:
    return b"".join(f"{i:08d} ".encode() + b"x" * (width - 9) + b"\n" for i in range(count))


def _log_uri(job_id: str, name: str) -> str:
    return f"{JobPaths.for_job(job_id).logs}/{name}"


def test_logs_come_in_pages_of_whole_lines_that_add_up_to_the_log(api, bucket):
    job = api.post("/v1/jobs", json=digits_spec()).json()
    first, second = _log_lines(30_000), b"the other task\n"  # 2.8 MiB: three pages, the last with the small one
    storage.blob(_log_uri(job["id"], "agent-1-0.log")).upload_from_string(first)
    storage.blob(_log_uri(job["id"], "agent-1-1.log")).upload_from_string(second)

    pages, cursor = [], None
    while True:
        page = api.get(f"/v1/jobs/{job['id']}/logs", params={"cursor": cursor} if cursor else {}).json()
        pages.append(page["text"])
        if not (cursor := page["next_cursor"]):
            break

    assert len(pages) == 3 and all(len(p.encode()) <= storage.LOG_PAGE_MAX_BYTES + 100 for p in pages)
    assert all(p.endswith("\n") for p in pages)  # pages end at line ends
    assert "".join(pages) == ("==> agent-1-0.log <==\n" + first.decode() + "\n==> agent-1-1.log <==\n"
                              + second.decode())
    assert page["end_cursor"] == f"agent-1-0.log={len(first)};agent-1-1.log={len(second)}"


def test_a_page_holds_at_most_limit_bytes_and_tail_reads_only_the_end(api, bucket):
    job = api.post("/v1/jobs", json=digits_spec()).json()
    log = _log_lines(30_000)
    storage.blob(_log_uri(job["id"], "agent-1-0.log")).upload_from_string(log)

    small = api.get(f"/v1/jobs/{job['id']}/logs", params={"limit_bytes": 1000}).json()
    assert small["text"] == "==> agent-1-0.log <==\n" + log[:1000 - 1000 % 100].decode()
    assert small["next_cursor"] == "agent-1-0.log=1000"
    tail = api.get(f"/v1/jobs/{job['id']}/logs", params={"tail": 3}).json()
    assert tail["text"] == "".join(line + "\n" for line in log.decode().splitlines()[-3:])
    assert tail["next_cursor"] is None and tail["end_cursor"] == f"agent-1-0.log={len(log)}"
    assert api.get(f"/v1/jobs/{job['id']}/logs", params={"limit_bytes": storage.LOG_PAGE_MAX_BYTES + 1}).status_code == 422


def test_a_log_stream_reads_a_page_per_poll_and_still_sends_every_line(api, bucket, monkeypatch):
    from service import job_logs

    reads: list[int] = []
    real = job_logs.read_range

    def counted(blob, start, end):  # type: ignore[no-untyped-def]
        reads.append(end - start)
        return real(blob, start, end)

    monkeypatch.setattr(job_logs, "read_range", counted)  # the API runs in this process
    job = api.post("/v1/jobs", json=digits_spec()).json()
    log = _log_lines(25_000)  # ~2.5 MiB: three polls' pages
    storage.blob(_log_uri(job["id"], "agent-1-0.log")).upload_from_string(log)
    api.post(f"/v1/jobs/{job['id']}/cancel")

    events = Follower(api, f"/v1/jobs/{job['id']}/logs?follow=true").until("end", timeout=60)

    lines = [e.data["line"] for e in events if e.name == "log"]
    assert lines == log.decode().splitlines() and events[-1].data == {"status": "CANCELLED"}
    assert len(reads) == 3 and max(reads) == storage.LOG_PAGE_MAX_BYTES


def test_metrics_over_their_cap_are_refused_not_read(api, bucket):
    job = api.post("/v1/jobs", json=digits_spec()).json()
    storage.blob(JobPaths.for_job(job["id"]).metrics).upload_from_string(b" " * (storage.METRICS_MAX_BYTES + 1))

    answer = api.get(f"/v1/jobs/{job['id']}/metrics")
    assert answer.status_code == 422 and answer.json()["error"]["error"] == "too_large"
    assert "metrics.json is 4.0 MiB, over the 4.0 MiB trainjobs reads of it" in answer.json()["error"]["message"]
    events = Follower(api, f"/v1/jobs/{job['id']}/metrics?follow=true").until("error")
    assert events[-1].data["code"] == "too_large"


def test_metrics_that_are_not_json_are_a_422_and_end_no_stream_early_or_never(api, bucket):
    job = api.post("/v1/jobs", json=digits_spec()).json()
    storage.blob(JobPaths.for_job(job["id"]).metrics).upload_from_string(b"{not json")

    answer = api.get(f"/v1/jobs/{job['id']}/metrics")
    assert answer.status_code == 422 and answer.json()["error"]["error"] == "not_json"
    follower = Follower(api, f"/v1/jobs/{job['id']}/metrics?follow=true")
    assert follower.next().data == {"status": "QUEUED"}
    api.post(f"/v1/jobs/{job['id']}/cancel")
    assert follower.until("end", timeout=30)[-1].data == {"status": "CANCELLED"}


def test_metrics_nested_too_deep_are_a_422_or_left_out_never_a_500(api, bucket):
    # The job's code can write metrics.json: JSON nested past what the parser follows, or an epoch
    # nested past what the response serializes, was an internal error.
    job = api.post("/v1/jobs", json=digits_spec()).json()
    metrics = JobPaths.for_job(job["id"]).metrics
    storage.blob(metrics).upload_from_string(b"[" * 100_000 + b"]" * 100_000)
    answer = api.get(f"/v1/jobs/{job['id']}/metrics")
    assert answer.status_code == 422 and answer.json()["error"]["error"] == "not_json", answer.text
    deep: object = 1
    for _ in range(300):
        deep = {"a": deep}
    storage.write_json(metrics, {"history": [{"attempt": 1, "epoch": 1, "loss": 0.5}, {"attempt": 1, "epoch": 2, "x": deep},
                                             {"attempt": 1, "epoch": 3, "loss": 0.25, "val": {"loss": 0.3}}]})
    answer = api.get(f"/v1/jobs/{job['id']}/metrics")
    assert answer.status_code == 200, answer.text
    assert answer.json()["epochs"] == [{"attempt": 1, "epoch": 1, "loss": 0.5},
                                       {"attempt": 1, "epoch": 3, "loss": 0.25, "val": {"loss": 0.3}}]


def test_a_metric_stream_downloads_metrics_json_only_when_it_changed(api, bucket, monkeypatch):
    from service.routes import streams

    downloads = []
    real = storage.read_json_bounded

    def counted(uri, limit, **kw):  # type: ignore[no-untyped-def]
        downloads.append(uri)
        return real(uri, limit, **kw)

    monkeypatch.setattr(storage, "read_json_bounded", counted)  # the API runs in this process
    monkeypatch.setattr(streams, "QUEUED_POLL_S", streams.POLL_S)
    job = api.post("/v1/jobs", json=digits_spec()).json()
    storage.write_json(JobPaths.for_job(job["id"]).metrics, {"history": [{"attempt": 1, "epoch": 1}]})
    follower = Follower(api, f"/v1/jobs/{job['id']}/metrics?follow=true")
    assert [follower.next().name, follower.next().name] == ["status", "metric"]
    with api.stream("GET", f"/v1/jobs/{job['id']}/metrics?follow=true") as second:  # polls while we wait
        lines = second.iter_lines()
        while next(lines) != "event: metric":
            pass
    storage.write_json(JobPaths.for_job(job["id"]).metrics,
                       {"history": [{"attempt": 1, "epoch": 1}, {"attempt": 1, "epoch": 2}]})
    assert follower.next().data == {"attempt": 1, "epoch": 2}
    api.post(f"/v1/jobs/{job['id']}/cancel")
    follower.until("end")

    # One download per generation, however many follow: the two streams share the job's one feed
    # (service/stream_feeds.py); before it, each stream downloaded each generation for itself (3).
    assert len(downloads) == 2, downloads


def _report(**fields: object) -> dict:
    return {"state": "running", "heartbeat_at": datetime.now(timezone.utc).isoformat(), "attempt": 1, **fields}


def test_the_worker_reads_a_status_over_its_cap_as_a_failure_that_says_so(bucket):
    channel = GcsJobChannel()
    status = JobPaths.for_job("j1").status
    storage.write_json(status, _report(metrics={"junk": "x" * storage.STATUS_MAX_BYTES}))

    report = channel.read_status("j1", 1)

    assert report is not None and report.state == "failed" and report.error is not None
    assert report.error.summary().startswith("ObjectTooLarge: status.json is 1.0 MiB, over the 1.0 MiB")
    storage.write_json(status, _report(metrics={"loss": 0.5}))
    assert channel.read_status("j1", 1).metrics == {"loss": 0.5}  # type: ignore[union-attr]


def test_a_success_whose_manifest_is_over_its_cap_is_read_as_a_failure(bucket):
    channel = GcsJobChannel()
    paths = JobPaths.for_job("j1")
    storage.write_json(paths.status, _report(state="succeeded"))
    storage.blob(paths.artifact_manifest).upload_from_string(b"[" + b" " * storage.MANIFEST_MAX_BYTES + b"]")

    report = channel.read_status("j1", 1)

    assert report is not None and report.state == "failed"
    assert "artifacts/manifest.json is 1.0 MiB" in report.error.message  # type: ignore[union-attr]
    assert channel.final_metrics("j1") is None




# --- issue 36, finding 2: an object a job stores gzip-encoded is read as stored, never inflated ------------
# On GCS a job can store an object with contentEncoding gzip; a client that is not told `raw_download`
# inflates it (the emulator transcodes as GCS does: stack/emulator_requests.py), so 64 KB could arrive as
# 64 MB. Every reader of an object a job writes takes its stored bytes.


def _store_gzip_encoded(uri: str, stored: bytes) -> None:
    import gzip

    blob = storage.blob(uri)
    blob.content_encoding = "gzip"
    blob.upload_from_string(stored, content_type="application/octet-stream")
    assert storage.blob(uri).download_as_bytes() == gzip.decompress(stored)  # what a reader that inflates takes in


def test_gzip_encoded_metrics_are_not_json_to_the_api_and_the_worker(api, bucket):
    import gzip

    job = api.post("/v1/jobs", json=digits_spec()).json()
    _store_gzip_encoded(JobPaths.for_job(job["id"]).metrics, gzip.compress(b'{"history": [{"attempt": 1, "epoch": 1}]}'))

    answer = api.get(f"/v1/jobs/{job['id']}/metrics")
    assert answer.status_code == 422 and answer.json()["error"]["error"] == "not_json"
    assert GcsJobChannel().history(job["id"]) is None


def test_a_gzip_encoded_artifact_downloads_as_its_stored_bytes(db, api, bucket):
    import gzip

    from tests.support.tenancy import succeeded_job

    bomb = gzip.compress(b"\0" * (64 * MiB))  # 64 KB stored, 64 MiB inflated
    job_id = succeeded_job(db, api, bucket, {"model.bin": bomb})  # its manifest: the stored bytes
    _store_gzip_encoded(JobPaths.for_job(job_id, bucket).artifact("model.bin"), bomb)

    answer = api.get(f"/v1/jobs/{job_id}/artifacts/model.bin")
    assert answer.status_code == 200 and answer.content == bomb
