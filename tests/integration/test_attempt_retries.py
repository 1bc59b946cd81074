"""Which failed attempts the worker retries (issue 37): a program killed by a signal failed for the machine's
reason and gets another attempt within limits.max_retries, as a lost machine does; a program that exits
non-zero by itself fails the job at once. The worker against real PostgreSQL, the in-memory cloud's agents
reporting as agent/program.py does. Through the real agent and program: tests/e2e/test_program_kills.py."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from service.db.jobstate import JobStatus
from service.db.models import JobEvent
from service.db.session import transaction
from tests.support import eventually
from tests.support.worker import make_worker, path, submit, wait_for
from trainjobs.vm_metadata import LABEL_JOB
from worker.memory_cloud import MemoryCloud

S = JobStatus
KILLED = ("the program was killed by signal 9 (SIGKILL: often the kernel's out-of-memory killer: the machine ran "
          "out of memory); an attempt that failed for the machine's reason, retried within limits.max_retries; "
          "its last output:\nEpoch 3/8")
EXITED = "the program exited with status 1; its last output:\nValueError: the CSV has no column 'price'"


def _reasons(factory, job_id) -> list[str]:  # type: ignore[no-untyped-def]
    with transaction(factory) as s:
        return list(s.scalars(select(JobEvent.reason).where(JobEvent.job_id == job_id).order_by(JobEvent.id)))


@pytest.mark.parametrize(("killed", "failed", "ends", "attempts"), [
    ([KILLED], [], S.SUCCEEDED, 2),
    ([KILLED, KILLED], [], S.SUCCEEDED, 3),
    ([KILLED], [EXITED], S.FAILED, 2),
    ([], [EXITED], S.FAILED, 1),
], ids=["killed once", "killed twice", "killed, then exits by itself", "exits by itself"])
def test_a_killed_program_is_retried_and_one_that_exits_non_zero_fails_the_job(
        db, database_url, running_workers, killed: list[str], failed: list[str], ends: JobStatus,  # type: ignore[no-untyped-def]
        attempts: int) -> None:
    cloud = MemoryCloud(killed_next=list(killed), fail_next=list(failed))
    w = make_worker(database_url, cloud, "w1")
    running_workers.append(w)
    w.start()
    [job_id] = submit(db)  # limits.max_retries: the default 2
    job = wait_for(db, job_id, {ends})
    assert job.attempt == attempts and len(cloud.created) == attempts
    assert path(db, job_id).count("RECOVERING") == len(killed)
    # Why each attempt was retried, in the job's events: the signal and what it most often means.
    retried = [r for r in _reasons(db, job_id) if r.startswith("attempt ")]
    assert retried == [f"attempt {n} failed: {KILLED.splitlines()[0]}" for n in range(1, len(killed) + 1)]
    if ends == S.FAILED:
        assert job.error == f"RuntimeError: {EXITED}"  # as before: the program's own status and output
    eventually(lambda: cloud.list({LABEL_JOB: str(job_id)}) == [], 5, "every attempt's machine deleted")


def test_a_program_killed_on_every_attempt_fails_once_its_retries_are_spent_saying_why(
        db, database_url, running_workers) -> None:  # type: ignore[no-untyped-def]
    cloud = MemoryCloud(killed_next=[KILLED] * 3)
    w = make_worker(database_url, cloud, "w1")
    running_workers.append(w)
    w.start()
    [job_id] = submit(db, limits={"max_retries": 1})
    job = wait_for(db, job_id, {S.FAILED})
    assert job.attempt == 2 and len(cloud.created) == 2
    assert job.error == f"attempt 2 failed and limits.max_retries is 1: ProgramKilled: {KILLED}"
    assert path(db, job_id)[-2:] == ["RECOVERING", "FAILED"]
