"""The agent's watchdog: a machine stops when its job is stopped or its job directory is gone."""

from __future__ import annotations

import threading
import time
from typing import Any

from tests.support import scaled
from trainjobs import storage
from agent.watchdog import Watchdog
from trainjobs.stop_request import request_stop


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_stop_request_from_the_worker_stops_the_agent(bucket: str) -> None:
    job_dir = storage.JobPaths.for_job("j1", bucket).root
    dog = Watchdog(job_dir, on_stop=lambda reason: None)
    dog.poll()
    assert dog.verdict() is None
    request_stop(job_dir, "job cancelled")
    dog.poll()
    assert dog.verdict() == "stop requested: job cancelled"


def test_an_unreachable_job_directory_stops_the_agent_after_the_limit() -> None:
    clock = Clock()

    def unreachable(uri: str) -> Any:
        raise ConnectionError("storage is gone")

    dog = Watchdog("gs://b/jobs/j1", on_stop=lambda reason: None, unreachable_s=300, read=unreachable, clock=clock)
    clock.now = 299
    dog.poll()
    assert dog.verdict() is None
    clock.now = 301
    dog.poll()
    assert dog.verdict() == "job directory gs://b/jobs/j1 unreachable for 301s"


def test_a_read_that_hangs_counts_as_unreachable() -> None:
    stopped: list[str] = []
    called = threading.Event()
    hang = threading.Event()

    def hanging(uri: str) -> Any:
        hang.wait()  # a storage client retrying a dead endpoint

    def on_stop(reason: str) -> None:
        stopped.append(reason)
        called.set()

    dog = Watchdog("gs://b/jobs/j1", on_stop=on_stop, every_s=0.05, unreachable_s=0.3, read=hanging)
    start = time.monotonic()
    dog.start()
    assert called.wait(scaled(10)), "the watchdog did not stop the agent"
    hang.set()
    assert stopped[0].startswith("job directory gs://b/jobs/j1 unreachable for")
    assert time.monotonic() - start >= 0.3


def test_a_stop_request_for_an_earlier_attempt_leaves_a_later_one_running(bucket: str) -> None:
    job_dir = storage.JobPaths.for_job("j2", bucket).root
    request_stop(job_dir, "attempt 1 was given up", attempt=1)
    first, second = (Watchdog(job_dir, on_stop=lambda reason: None, attempt=n) for n in (1, 2))
    first.poll()
    second.poll()
    assert first.verdict() == "stop requested: attempt 1 was given up"
    assert second.verdict() is None
    request_stop(job_dir, "job cancelled")  # no attempt: every agent of the job
    second.poll()
    assert second.verdict() == "stop requested: job cancelled"
