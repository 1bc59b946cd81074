"""The agent's watchdog on a clock of the test's own: a job directory unreachable for longer than the
limit, or a read that hangs, stops the agent. Stop requests through storage:
tests/integration/test_watchdog.py."""

from __future__ import annotations

import threading
import time
from typing import Any

from tests.support import scaled
from agent.watchdog import Watchdog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


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
