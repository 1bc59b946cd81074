"""Issue 25: the followers of one job share one feed in an API process (service/stream_feeds.py), so
N follow-streams cost one poller's storage reads, not N; and a follower that stops reading neither
stalls the others nor makes the feed queue for it. Requests are counted by the GCS emulator as they
arrive (stack/emulator_requests.py); the real API runs in this process."""

from __future__ import annotations

import os
import socket
import time
from urllib.parse import urlparse

from stack.emulator_requests import request_counts
from tests.support.jobs import digits_spec
from tests.support.streams import Follower
from tests.support.streams import queued_jobs_polled_like_running_ones  # noqa: F401 - an autouse fixture
from trainjobs import storage
from trainjobs.job_paths import JobPaths

FOLLOWERS = 10


def _log_uri(job_id: str) -> str:
    return f"{JobPaths.for_job(job_id).logs}/agent-1-0.log"


def _upload(job_id: str, text: str) -> None:
    storage.blob(_log_uri(job_id)).upload_from_string(text.encode(), content_type="text/plain")


def _requests(bucket: str) -> dict[str, int]:
    """Requests the emulator served on this test's bucket so far, by operation."""
    counts: dict[str, int] = {}
    for row in request_counts(os.environ["STORAGE_EMULATOR_HOST"], bucket):
        counts[row["op"]] = counts.get(row["op"], 0) + row["count"]
    return counts


def test_ten_followers_of_one_job_cost_one_feeds_storage_reads(api, bucket):
    from service.routes import streams

    job = api.post("/v1/jobs", json=digits_spec()).json()
    followers = [Follower(api, f"/v1/jobs/{job['id']}/logs?follow=true") for _ in range(FOLLOWERS)]
    for follower in followers:
        assert follower.next().name == "status"
    before, started = _requests(bucket), time.monotonic()

    text = ""
    for n in range(3):  # the agent re-uploads its grown log
        text += f"line {n}\n"
        _upload(job["id"], text)
        for follower in followers:
            assert follower.next().data["line"] == f"line {n}"
    api.post(f"/v1/jobs/{job['id']}/cancel")
    for follower in followers:
        assert follower.until("end")[-1].data == {"status": "CANCELLED"}
    polls = (time.monotonic() - started) / streams.POLL_S + 2
    after = _requests(bucket)

    listed = after.get("objects.ls", 0) - before.get("objects.ls", 0)
    read = after.get("objects.download(media)", 0) - before.get("objects.download(media)", 0)
    # One feed lists once a poll and reads each upload once (a loaded host only polls less); ten
    # streams polling on their own would list ten times a poll and read each upload ten times.
    assert listed <= polls, (listed, polls)
    assert read <= 3, read


def test_a_follower_that_stops_reading_does_not_stall_the_others(api, api_url, bucket):
    job = api.post("/v1/jobs", json=digits_spec()).json()
    reader = Follower(api, f"/v1/jobs/{job['id']}/logs?follow=true")
    assert reader.next().name == "status"
    # A client that sends its request and never reads: a small receive window, so what the server
    # sends it soon fills both sockets' buffers and its stream waits to write.
    address = urlparse(api_url)
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect((address.hostname, address.port))
    token = api.headers["Authorization"]
    stalled.sendall(f"GET /v1/jobs/{job['id']}/logs?follow=true HTTP/1.1\r\nHost: {address.netloc}\r\n"
                    f"Authorization: {token}\r\nAccept: text/event-stream\r\n\r\n".encode())
    try:
        # 3 MiB of log, about 5 MiB of events: more than the stalled stream's socket buffers hold.
        line = "x" * 90
        text = "".join(f"{n:07d} {line}\n" for n in range(32 * 1024))
        for part in range(1, 4):
            _upload(job["id"], text[: len(text) * part // 3])
        last = f"{32 * 1024 - 1:07d} {line}"

        lines = 0
        while (event := reader.next(timeout=30)).data.get("line") != last:  # each within a scaled 30 s
            lines += event.name == "log"
        assert lines == 32 * 1024 - 1  # every line before it too, in order of arrival
        # ... while the feed kept no more for the stalled stream than its window (the API is this process's).
        from service.routes.streams import LOG_WINDOW_BYTES
        from service.stream_feeds import FEEDS

        held = [sum(len(data) for _, data in feed.source.view.windows.values())  # type: ignore[attr-defined]
                for feed in FEEDS._feeds.values() if str(feed.key.job_id) == job["id"]]
        assert held and max(held) <= LOG_WINDOW_BYTES, held
    finally:
        stalled.close()
    api.post(f"/v1/jobs/{job['id']}/cancel")
    assert reader.until("end")[-1].data == {"status": "CANCELLED"}
