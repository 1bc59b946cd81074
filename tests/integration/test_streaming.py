"""GET /v1/jobs/{id}/logs?follow=true and /metrics?follow=true: server-sent events that resume from
Last-Event-ID and end with the job. How soon a line a real agent writes reaches a following client:
tests/e2e/test_streaming.py."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.support.jobs import digits_spec
from tests.support import scaled
from tests.support.streams import Follower
from tests.support.streams import queued_jobs_polled_like_running_ones  # noqa: F401 - an autouse fixture
from trainjobs import storage
from trainjobs.job_paths import JobPaths


def _log_uri(job_id: str, name: str = "agent-1-0.log") -> str:
    return f"{JobPaths.for_job(job_id).logs}/{name}"


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
    uri = JobPaths.for_job(job["id"]).metrics
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


@pytest.mark.parametrize(("doc", "epochs"), [
    ({"attempt": 1, "epochs": 3, "initial_epoch": 0, "history": [{"epoch": 1, "loss": 0.5}, "junk", {"epoch": 2}]},
     [{"epoch": 1, "loss": 0.5}, {"epoch": 2}]),
    ({"history": "not a list"}, []),
    ([{"epoch": 1}], []),
], ids=["the agent's", "a bad history", "not an object"])
def test_without_follow_the_metrics_are_the_epochs_the_stream_sends(api, bucket, doc, epochs):
    """Issue 37: `epochs` held metrics.json whole, and `trainjobs metrics` failed on every job that had one.
    The job's code can write the file: what is not an epoch's object is left out."""
    job = api.post("/v1/jobs", json=digits_spec()).json()
    storage.write_json(JobPaths.for_job(job["id"]).metrics, doc)
    assert api.get(f"/v1/jobs/{job['id']}/metrics").json() == {"epochs": epochs}


@pytest.mark.parametrize("route", ["logs", "metrics"])
def test_a_cursor_the_stream_never_sent_is_a_422(api, bucket, route):
    job = api.post("/v1/jobs", json=digits_spec()).json()
    response = api.get(f"/v1/jobs/{job['id']}/{route}?follow=true", headers={"Last-Event-ID": "not/a=cursor"})
    assert response.status_code == 422
    assert response.json()["error"]["details"][0]["field"] == "cursor"


def test_another_projects_job_cannot_be_followed(api, bucket, db, api_url):
    from tests.support.jobs import make_key

    job = api.post("/v1/jobs", json=digits_spec()).json()
    other = httpx.get(f"{api_url}/v1/jobs/{job['id']}/logs?follow=true",
                      headers={"Authorization": f"Bearer {make_key(db, 'beta')}"})
    assert other.status_code == 404


def test_an_idle_stream_sends_keep_alives_and_holds_no_database_connection(api, bucket, database_url, monkeypatch):
    from service.db.session import get_engine
    from service.routes import streams

    monkeypatch.setattr(streams, "PING_S", 0.2)  # the API runs in this process (conftest.api_url)
    job = api.post("/v1/jobs", json=digits_spec()).json()  # stays QUEUED: no worker here
    pool = get_engine(database_url).pool

    def sample() -> list[int]:
        seen = []
        for _ in range(20):
            seen.append(pool.checkedout())  # type: ignore[attr-defined]
            time.sleep(0.05)
        return seen

    # The pool is this process's: whatever else of it holds a connection (the test's own fixtures, a
    # worker of another test in this process) is counted before the streams start, and not held against them.
    before = sample()
    followers = [Follower(api, f"/v1/jobs/{job['id']}/logs?follow=true") for _ in range(3)]
    for follower in followers:
        assert follower.next().name == "status"
    checked_out = sample()
    # Each poll is one short transaction: three streams holding connections would add 3 throughout.
    assert min(checked_out) <= min(before) and max(checked_out) < max(before) + len(followers), (before, checked_out)
    with api.stream("GET", f"/v1/jobs/{job['id']}/metrics?follow=true", timeout=scaled(30)) as response:
        lines = response.iter_lines()
        assert any(next(lines) == ": ping" for _ in range(20))
    api.post(f"/v1/jobs/{job['id']}/cancel")
    for follower in followers:
        assert follower.until("end")[-1].data == {"status": "CANCELLED"}


# --- a real agent -------------------------------------------------------------------------------


