"""Issue 36, 1: one tenant's submit must not hold the API for everyone. The review's 29 KB sweep (32
parameters x 64 choices over a program job with 64 requirements and 96 environment variables) was
validated on the event loop for 30-40 s, and no other request of any project was answered meanwhile.

The tests hold a submit's validation in the middle (the job's consistency check waits for the test), so
what they see is the order of events, not how fast this machine is: another project's requests are
answered while the submit is held, and the submit then completes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

import trainjobs.spec.job
from tests.support import eventually, scaled
from tests.support.jobs import digits_spec, make_key
from tests.support.sweep_shapes import hostile_sweep
from tests.support.sweeps import sweep_spec


@contextmanager
def validation_held(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, threading.Event]]:
    """(entered, release): the first consistency check of a job spec from now on waits for `release`."""
    entered, release = threading.Event(), threading.Event()
    original = trainjobs.spec.job.check_consistency

    def held(spec: Any) -> None:
        if not entered.is_set():
            entered.set()
            release.wait(scaled(60))
        original(spec)

    monkeypatch.setattr(trainjobs.spec.job, "check_consistency", held)
    try:
        yield entered, release
    finally:
        release.set()


@pytest.mark.parametrize(("path", "body"), [("/v1/sweeps", hostile_sweep()), ("/v1/jobs", digits_spec())],
                         ids=["the review's sweep", "a job"])
def test_a_submit_being_validated_holds_up_no_other_projects_requests(
        api: Any, api_url: str, db: Any, bucket: str, monkeypatch: pytest.MonkeyPatch, path: str,
        body: dict[str, Any]) -> None:
    answers: dict[str, httpx.Response] = {}
    with validation_held(monkeypatch) as (entered, release):
        submit = threading.Thread(target=lambda: answers.update(submit=api.post(path, json=body)))
        submit.start()
        eventually(entered.is_set, 30, "the submit's validation started")
        with httpx.Client(base_url=api_url, timeout=scaled(20),
                          headers={"Authorization": f"Bearer {make_key(db, 'beta')}"}) as other:
            assert other.get("/healthz").status_code == 200
            assert other.get("/v1/jobs").json() == {"jobs": [], "next_cursor": None}
        assert submit.is_alive()  # still held: the answers above came while it was being validated
        release.set()
        submit.join(scaled(60))
    assert answers["submit"].status_code == 201, answers["submit"].text


def test_a_key_submits_at_most_its_sweeps_per_minute(api: Any, api_url: str, db: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINJOBS_SWEEPS_PER_MINUTE", "2")  # the API runs in this process
    assert [api.post("/v1/sweeps", json=sweep_spec()).status_code for _ in range(2)] == [201, 201]
    refused = api.post("/v1/sweeps", json=sweep_spec(parameters={"training.epochs": {"type": "int", "low": 1,
                                                                                      "high": 2}}))
    assert refused.status_code == 429, refused.text
    assert "TRAINJOBS_SWEEPS_PER_MINUTE" in refused.json()["error"]["message"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert len(api.get("/v1/sweeps").json()["sweeps"]) == 2
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {make_key(db, 'beta')}"}) as other:
        assert other.post("/v1/sweeps", json=sweep_spec()).status_code == 201  # another key's own count
