"""GET /v1/jobs/{id}/logs?follow=true and /metrics?follow=true: server-sent events that resume from
Last-Event-ID and end with the job; and, with a real agent in local mode, how soon a line it writes
reaches a following client."""

from __future__ import annotations

import json
import queue
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

import httpx
import pytest

from tests.conftest import digits_spec, scaled
from tests.test_end_to_end import local_stack  # noqa: F401 - the fixture: a worker with the local provisioner
from trainjobs import storage


@dataclass
class Event:
    name: str
    data: dict
    id: str | None
    received: float  # time.time() when it arrived


def sse(response: httpx.Response) -> Iterator[Event]:
    name, data, event_id = "message", "", None
    for line in response.iter_lines():
        if line == "":
            if data:
                yield Event(name, json.loads(data), event_id, time.time())
            name, data, event_id = "message", "", None
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                name = value
            elif field == "data":
                data += value
            elif field == "id":
                event_id = value


class Follower:
    """A client following a stream on a thread; events arrive on a queue."""

    def __init__(self, api: httpx.Client, path: str, headers: dict[str, str] | None = None):
        self.events: queue.Queue[Event | BaseException] = queue.Queue()
        self.status_code: int | None = None
        self.content_type = ""

        def run() -> None:
            try:
                with api.stream("GET", path, headers=headers or {}, timeout=scaled(120)) as response:
                    self.status_code, self.content_type = response.status_code, response.headers["content-type"]
                    for event in sse(response):
                        self.events.put(event)
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                self.events.put(exc)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def next(self, timeout: float = 10) -> Event:
        item = self.events.get(timeout=scaled(timeout))
        if isinstance(item, BaseException):
            raise item
        return item

    def until(self, name: str, timeout: float = 10) -> list[Event]:
        seen = []
        while True:
            seen.append(self.next(timeout))
            if seen[-1].name == name:
                return seen


@pytest.fixture(autouse=True)
def queued_jobs_polled_like_running_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests follow queued jobs (no worker runs here) as if they ran; that a queued job's
    stream polls slowly is tests/test_stream_limits.py's. The API runs in this process."""
    from service.routes import streams

    monkeypatch.setattr(streams, "QUEUED_POLL_S", streams.POLL_S)


def _log_uri(job_id: str, name: str = "agent-1-0.log") -> str:
    return f"{storage.JobPaths.for_job(job_id).logs}/{name}"


def _upload(uri: str, text: str) -> None:
    storage.blob(uri).upload_from_string(text.encode(), content_type="text/plain")


def test_log_stream_sends_whole_lines_then_ends_with_the_job(api, bucket):
    job = api.post("/v1/jobs", json=digits_spec()).json()
    _upload(_log_uri(job["id"]), "first\nsecond\n")
    follower = Follower(api, f"/v1/jobs/{job['id']}/logs?follow=true")
    assert follower.next().name == "status" and follower.status_code == 200
    assert follower.content_type.startswith("text/event-stream")
    assert [(e.name, e.data["line"]) for e in (follower.next(), follower.next())] == [("log", "first"), ("log", "second")]

    _upload(_log_uri(job["id"]), "first\nsecond\nthird\nhalf a li")  # the agent re-uploads the grown file
    third = follower.next()
    assert (third.name, third.data["line"]) == ("log", "third")

    assert api.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202
    rest = follower.until("end")
    # The line without its newline waits for the rest of it, or, as here, for the job's end.
    assert [(e.name, e.data) for e in rest] == [("status", {"status": "CANCELLED"}),
                                                ("log", {"line": "half a li", "source": "agent-1-0.log"}),
                                                ("end", {"status": "CANCELLED"})]


def test_log_stream_resumes_after_the_last_event_id(api, bucket):
    job = api.post("/v1/jobs", json=digits_spec()).json()
    _upload(_log_uri(job["id"]), "one\ntwo\n")
    _upload(_log_uri(job["id"], "agent-1-1.log"), "other task\n")
    api.post(f"/v1/jobs/{job['id']}/cancel")
    first = Follower(api, f"/v1/jobs/{job['id']}/logs?follow=true").until("end")
    lines = [e for e in first if e.name == "log"]
    assert [e.data["line"] for e in lines] == ["one", "two", "other task"]

    resumed = Follower(api, f"/v1/jobs/{job['id']}/logs?follow=true", headers={"Last-Event-ID": lines[0].id})
    assert [e.data["line"] for e in resumed.until("end") if e.name == "log"] == ["two", "other task"]
    by_query = Follower(api, f"/v1/jobs/{job['id']}/logs?follow=true&cursor={lines[1].id}")
    assert [e.data["line"] for e in by_query.until("end") if e.name == "log"] == ["other task"]


def test_metric_stream_sends_each_epoch_once_and_resumes(api, bucket):
    job = api.post("/v1/jobs", json=digits_spec()).json()
    uri = storage.JobPaths.for_job(job["id"]).metrics
    entry = {"attempt": 1, "epoch": 1, "loss": 1.5, "accuracy": 0.5, "examples_per_sec": 900.0,
             "input_wait_fraction": 0.1}
    storage.write_json(uri, {"history": [entry]})
    follower = Follower(api, f"/v1/jobs/{job['id']}/metrics?follow=true")
    assert follower.next().name == "status"
    first = follower.next()
    assert (first.name, first.data) == ("metric", entry)

    second = dict(entry, epoch=2, loss=0.9)
    storage.write_json(uri, {"history": [entry, second]})
    assert follower.next().data == second
    api.post(f"/v1/jobs/{job['id']}/cancel")
    assert [e.name for e in follower.until("end")] == ["status", "end"]

    resumed = Follower(api, f"/v1/jobs/{job['id']}/metrics?follow=true", headers={"Last-Event-ID": first.id})
    assert [e.data for e in resumed.until("end") if e.name == "metric"] == [second]


def test_without_follow_the_json_answers_are_unchanged(api, bucket):
    job = api.post("/v1/jobs", json=digits_spec()).json()
    _upload(_log_uri(job["id"]), "hello\n")
    assert api.get(f"/v1/jobs/{job['id']}/logs").json() == {"text": "==> agent-1-0.log <==\nhello\n",
                                                             "next_cursor": None, "end_cursor": "agent-1-0.log=6"}
    assert api.get(f"/v1/jobs/{job['id']}/metrics").json() == {"epochs": []}


@pytest.mark.parametrize("route", ["logs", "metrics"])
def test_a_cursor_the_stream_never_sent_is_a_422(api, bucket, route):
    job = api.post("/v1/jobs", json=digits_spec()).json()
    response = api.get(f"/v1/jobs/{job['id']}/{route}?follow=true", headers={"Last-Event-ID": "not/a=cursor"})
    assert response.status_code == 422
    assert response.json()["error"]["details"][0]["field"] == "cursor"


def test_another_projects_job_cannot_be_followed(api, bucket, db, api_url):
    from tests.conftest import make_key

    job = api.post("/v1/jobs", json=digits_spec()).json()
    other = httpx.get(f"{api_url}/v1/jobs/{job['id']}/logs?follow=true",
                      headers={"Authorization": f"Bearer {make_key(db, 'beta')}"})
    assert other.status_code == 404


def test_an_idle_stream_sends_keep_alives_and_holds_no_database_connection(api, bucket, database_url, monkeypatch):
    from service.db.session import get_engine
    from service.routes import streams

    monkeypatch.setattr(streams, "PING_S", 0.2)  # the API runs in this process (conftest.api_url)
    job = api.post("/v1/jobs", json=digits_spec()).json()  # stays QUEUED: no worker here
    followers = [Follower(api, f"/v1/jobs/{job['id']}/logs?follow=true") for _ in range(3)]
    for follower in followers:
        assert follower.next().name == "status"
    pool = get_engine(database_url).pool
    checked_out = []
    for _ in range(20):
        checked_out.append(pool.checkedout())  # type: ignore[attr-defined]
        time.sleep(0.05)
    # Each poll is one short transaction: three streams holding connections would show 3 throughout.
    assert min(checked_out) == 0 and max(checked_out) < len(followers), checked_out
    with api.stream("GET", f"/v1/jobs/{job['id']}/metrics?follow=true", timeout=scaled(30)) as response:
        lines = response.iter_lines()
        assert any(next(lines) == ": ping" for _ in range(20))
    api.post(f"/v1/jobs/{job['id']}/cancel")
    for follower in followers:
        assert follower.until("end")[-1].data == {"status": "CANCELLED"}


# --- a real agent -------------------------------------------------------------------------------

LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


@pytest.mark.tf
def test_a_line_the_agent_writes_reaches_a_following_client_within_2_seconds(api, local_stack):
    """The delay is measured per line: the time the client got it minus the time in the line, which
    the agent's logging stamped as it wrote it (same clock). Lines the agent wrote before the client
    was following are left out: those measure when the test connected, not the stream."""
    spec = digits_spec(model={"name": "mlp"}, strategy="default", accelerator={"type": "cpu"},
                       training={"epochs": 12})
    job = api.post("/v1/jobs", json=spec).json()
    follower = Follower(api, f"/v1/jobs/{job['id']}/logs?follow=true")
    events = follower.until("end", timeout=300)
    assert events[-1].data == {"status": "SUCCEEDED"}
    lines = [e for e in events if e.name == "log"]
    assert any("epoch 12/12" in e.data["line"] for e in lines)
    connected = events[0].received
    delays = []
    for event in lines:
        if match := LOG_TIME.match(event.data["line"]):
            written = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if written > connected + 0.5:
                delays.append(event.received - written)
    epoch_lines = [e for e in lines if "epoch " in e.data["line"] and LOG_TIME.match(e.data["line"])]
    assert len(delays) >= 10 and epoch_lines, f"too few lines written while following: {len(delays)}"
    delays.sort()
    median, p90 = delays[len(delays) // 2], delays[len(delays) * 9 // 10]
    summary = f"over {len(delays)} lines: median {median:.2f} s, p90 {p90:.2f} s, max {delays[-1]:.2f} s"
    print("line delay " + summary)
    # By design a line waits at most one log flush (1 s) and one poll (0.5 s) plus two storage round
    # trips. Nine lines in ten must make 2 s; the slowest may have lost the CPU for a while, as it does
    # when the suite's three processes share two cores (2.31 s seen in a CI run), but a stream that
    # stalls (a missed poll, a flush that waits for the epoch) still shows here.
    assert p90 <= scaled(2.0), summary
    assert delays[-1] <= scaled(5.0), summary
