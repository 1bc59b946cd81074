"""The agent's watchdog: a machine stops when its job is stopped or its job directory is gone."""

from __future__ import annotations

from trainjobs.job_paths import JobPaths
from agent.watchdog import Watchdog
from trainjobs.stop_request import request_stop


def test_a_stop_request_from_the_worker_stops_the_agent(bucket: str) -> None:
    job_dir = JobPaths.for_job("j1", bucket).root
    dog = Watchdog(job_dir, on_stop=lambda reason: None)
    dog.poll()
    assert dog.verdict() is None
    request_stop(job_dir, "job cancelled")
    dog.poll()
    assert dog.verdict() == "stop requested: job cancelled"


def test_a_stop_request_for_an_earlier_attempt_leaves_a_later_one_running(bucket: str) -> None:
    job_dir = JobPaths.for_job("j2", bucket).root
    request_stop(job_dir, "attempt 1 was given up", attempt=1)
    first, second = (Watchdog(job_dir, on_stop=lambda reason: None, attempt=n) for n in (1, 2))
    first.poll()
    second.poll()
    assert first.verdict() == "stop requested: attempt 1 was given up"
    assert second.verdict() is None
    request_stop(job_dir, "job cancelled")  # no attempt: every agent of the job
    second.poll()
    assert second.verdict() == "stop requested: job cancelled"
