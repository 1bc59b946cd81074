"""Issue 18, finding 7 and its low item: a follow-stream re-checks its key while it lasts and ends
with an `error` event once the key is revoked or deleted; a key holds at most 20 streams and a
process TRAINJOBS_STREAMS_PER_PROCESS, over either a 429 with Retry-After; a queued job's stream
polls slowly. Against the real API (in this process), PostgreSQL and the GCS emulator."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from sqlalchemy import text

from service.db.projects import hash_key, revoke_api_key
from service.db.session import transaction
from service.routes import streams
from service.stream_slots import PER_KEY_ENV, PER_PROCESS_ENV, SLOTS, StreamSlots
from tests.support.jobs import digits_spec, make_key
from tests.support import eventually, scaled
from tests.support.streams import Follower


def _client(api_url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {key}"}, timeout=scaled(30))


def _revoke(db, key: str) -> None:
    with transaction(db) as session:
        revoke_api_key(session, key)


def _delete(db, key: str) -> None:
    with transaction(db) as session:
        session.execute(text("DELETE FROM api_keys WHERE key_hash = :h"), {"h": hash_key(key)})


@pytest.mark.parametrize("take_away", [_revoke, _delete], ids=["revoked", "deleted"])
def test_a_stream_ends_with_an_error_event_once_its_key_is_revoked_or_deleted(db, api_url, bucket, take_away,
                                                                                monkeypatch):
    monkeypatch.setattr(streams, "QUEUED_POLL_S", 1.0)  # keeps the test short; the key is checked all the same
    key = make_key(db, "alpha")
    with _client(api_url, key) as client:
        job = client.post("/v1/jobs", json=digits_spec()).json()  # stays QUEUED: no worker here
        follower = Follower(client, f"/v1/jobs/{job['id']}/logs?follow=true")
        assert follower.next().data == {"status": "QUEUED"}

        take_away(db, key)

        # Within a key check and a queued job's poll; the stream would otherwise run until the job ends.
        ended = follower.next(timeout=streams.KEY_CHECK_S + streams.QUEUED_POLL_S + 10)
        assert (ended.name, ended.data["code"]) == ("error", "key_revoked")
        follower.thread.join(scaled(10))
        assert not follower.thread.is_alive() and follower.events.empty()  # closed, nothing after it


def test_a_key_holds_at_most_20_streams_and_the_next_is_a_429_with_retry_after(db, api_url, bucket, monkeypatch):
    monkeypatch.delenv(PER_KEY_ENV, raising=False)
    monkeypatch.setattr(streams, "QUEUED_POLL_S", 1.0)  # the streams end sooner once their job is cancelled
    key = make_key(db, "alpha")
    with _client(api_url, key) as client, _client(api_url, make_key(db, "beta")) as other:
        job = client.post("/v1/jobs", json=digits_spec()).json()
        path = f"/v1/jobs/{job['id']}/metrics?follow=true"
        followers = [Follower(client, path) for _ in range(20)]
        for follower in followers:
            assert follower.next().name == "status"

        with client.stream("GET", path) as refused:  # a stream, were it not refused: its body never ends
            assert refused.status_code == 429 and refused.headers["Retry-After"].isdigit()
            error = json.loads(refused.read())["error"]
        assert error["error"] == "too_many_streams" and "20 streams, the most one key may" in error["message"]
        other_job = other.post("/v1/jobs", json=digits_spec()).json()
        assert Follower(other, f"/v1/jobs/{other_job['id']}/logs?follow=true").next().name == "status"
        other.post(f"/v1/jobs/{other_job['id']}/cancel")

        client.post(f"/v1/jobs/{job['id']}/cancel")  # the 20 streams end with the job, and free their places
        for follower in followers:
            assert follower.until("end", timeout=streams.QUEUED_POLL_S + 10)[-1].name == "end"
        eventually(lambda: client.get(path).status_code == 200, 10, f"{path} answered 200 again")


def test_a_process_holds_at_most_its_limit_of_streams(db, api_url, bucket, monkeypatch):
    # A table of this test's own: streams other tests left may end at any moment and free a place.
    monkeypatch.setattr(streams, "SLOTS", StreamSlots())
    monkeypatch.setenv(PER_PROCESS_ENV, "2")
    monkeypatch.setattr(streams, "QUEUED_POLL_S", 1.0)  # the streams end sooner once their job is cancelled
    clients = [_client(api_url, make_key(db, name)) for name in ("alpha", "beta", "gamma")]
    try:
        jobs = [c.post("/v1/jobs", json=digits_spec()).json()["id"] for c in clients]
        followers = [Follower(client, f"/v1/jobs/{job_id}/logs?follow=true")
                     for client, job_id in list(zip(clients, jobs))[:2]]
        for follower in followers:
            assert follower.next().name == "status"

        with clients[2].stream("GET", f"/v1/jobs/{jobs[2]}/logs?follow=true") as refused:
            assert refused.status_code == 429 and "Retry-After" in refused.headers
            assert "the most it takes" in json.loads(refused.read())["error"]["message"]
        for client, job_id in zip(clients, jobs):
            client.post(f"/v1/jobs/{job_id}/cancel")
        for follower in followers:  # ended before the next test counts polls
            assert follower.until("end", timeout=streams.QUEUED_POLL_S + 10)[-1].name == "end"
    finally:
        for client in clients:
            client.close()


def test_a_queued_jobs_stream_polls_slowly(db, api, bucket, monkeypatch):
    from service import stream_feeds

    # Each poll is up to three trips to a thread: the feed's status and storage, the follower's key check.
    hops: list[float] = []
    real_run = streams.run_in_threadpool

    def counted(*args):  # type: ignore[no-untyped-def]
        hops.append(time.monotonic())
        return real_run(*args)

    # Only this test's stream may poll while they are counted: the others this process served have ended.
    eventually(lambda: SLOTS.in_use() == 0, streams.QUEUED_POLL_S + 10, "every stream of the process ended")
    monkeypatch.setattr(streams, "run_in_threadpool", counted)  # the API runs in this process
    monkeypatch.setattr(stream_feeds, "run_in_threadpool", counted)
    job = api.post("/v1/jobs", json=digits_spec()).json()
    follower = Follower(api, f"/v1/jobs/{job['id']}/metrics?follow=true")
    assert follower.next().data == {"status": "QUEUED"}
    watched = scaled(2 * streams.POLL_S * 4)
    time.sleep(watched)

    # A loaded host only makes fewer polls; a stream polling a queued job every POLL_S makes ~16 here.
    assert len(hops) <= 3 * (1 + watched / streams.QUEUED_POLL_S + 1), hops
    api.post(f"/v1/jobs/{job['id']}/cancel")
    assert follower.until("end", timeout=streams.QUEUED_POLL_S + 10)[-1].data == {"status": "CANCELLED"}


def test_the_client_raises_the_revocation_instead_of_resuming_the_stream(db, api_url, bucket, monkeypatch):
    from trainjobs.client.api import ApiError, Client

    monkeypatch.setattr(streams, "QUEUED_POLL_S", 1.0)  # keeps the test short
    key = make_key(db, "alpha")
    client = Client(api_url, key)
    try:
        job = client.submit(digits_spec())
        events = client.follow(job["id"], "logs")
        assert next(events).data == {"status": "QUEUED"}
        _revoke(db, key)
        with pytest.raises(ApiError) as err:
            next(events)
        assert (err.value.status, err.value.code) == (401, "key_revoked")
    finally:
        client.close()
