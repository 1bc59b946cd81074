"""What tests share beyond fixtures: one way to scale a wait for a loaded machine, and one way to wait
for something to happen. Builders and stand-ins live beside this file (jobs.py, agent.py, worker.py...)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def scaled(seconds: float) -> float:
    """A wait or deadline in a test, scaled for a loaded machine: TRAINJOBS_TEST_TIME_SCALE=3 triples it.
    No test may pass or fail on time alone at scale 1 on a quiet machine either."""
    return seconds * float(os.environ.get("TRAINJOBS_TEST_TIME_SCALE", "1"))


def eventually(condition: Callable[[], T | None], timeout: float, what: str | Callable[[], str], every: float = 0.05) -> T:
    """Call `condition` until it returns something truthy and return that; after `timeout` seconds
    (scaled for a loaded machine) fail saying what never happened (`what`, or what it returns then:
    a message that can name the last state seen). An exception from `condition` is not retried: a
    check that cannot even be made is a failure of its own.

    Waiting on what a test can observe, never a fixed sleep, is what keeps a test both fast on a quiet
    machine and honest on a loaded one."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        if result := condition():
            return result
        if time.monotonic() >= deadline:
            said = what if isinstance(what, str) else what()
            raise AssertionError(f"never happened within {scaled(timeout):.0f} s: {said}")
        time.sleep(every)
