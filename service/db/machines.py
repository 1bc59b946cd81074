"""When each of a job's machines was requested, became ready, was first heard from by its agent and was
deleted (jobs.machines), and when the job's first training step ran (issue 10 §4). The worker's driver
writes these as it sees them; the caller owns the transaction. And which machines are still of use to
a job, for the worker's reaper."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Literal

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.db.models import Job
from trainjobs.states import TERMINAL

MachineEvent = Literal["requested_at", "ready_at", "first_report_at", "deleted_at"]


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def note_machine(session: Session, job_id: uuid.UUID, owner: str, name: str, attempt: int, event: MachineEvent,
                 at: datetime) -> bool:
    """Record the first time `event` happened to this machine; a later one is ignored. False when the job
    is no longer this worker's."""
    machines = session.execute(select(Job.machines).where(Job.id == job_id, Job.lease_owner == owner)
                               .with_for_update()).first()
    if machines is None:
        return False
    entries = [dict(m) for m in machines[0] or []]
    entry = next((m for m in entries if m.get("name") == name and m.get("attempt") == attempt), None)
    if entry is None:
        entry = {"name": name, "attempt": attempt, "requested_at": None, "ready_at": None, "first_report_at": None,
                 "deleted_at": None}
        entries.append(entry)
    if entry.get(event) is not None:
        return True
    entry[event] = _iso(at)
    session.execute(update(Job).where(Job.id == job_id).values(machines=entries))
    return True


def note_first_step(session: Session, job_id: uuid.UUID, owner: str, at: datetime) -> None:
    """The job's first training step, once; time_to_first_step_s counts from when that attempt's first
    machine was requested (the whole of provisioning, booting, installing and loading, as the user waits)."""
    row = session.execute(select(Job.machines, Job.attempt, Job.first_step_at)
                          .where(Job.id == job_id, Job.lease_owner == owner).with_for_update()).first()
    if row is None or row.first_step_at is not None:
        return
    requested = [datetime.fromisoformat(m["requested_at"]) for m in row.machines or []
                 if m.get("attempt") == row.attempt and m.get("requested_at")]
    since = (at - min(requested)).total_seconds() if requested else None
    session.execute(update(Job).where(Job.id == job_id).values(first_step_at=at, time_to_first_step_s=since))


def attempts_in_use(session: Session, job_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, int]:
    """The reaper's query: for each of `job_ids` whose job has not ended, the attempt its machines may
    serve (an earlier attempt's machine is no longer any use). A job missing from the answer has ended
    or does not exist: none of its machines is."""
    if not job_ids:
        return {}
    rows = session.execute(select(Job.id, Job.attempt).where(Job.id.in_(job_ids), Job.status.not_in(TERMINAL)))
    return {row.id: max(row.attempt, 1) for row in rows}
