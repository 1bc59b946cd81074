"""Job states and the only place that changes them.

Order of phases: QUEUED -> STAGING -> PROVISIONING -> RUNNING -> SUCCEEDED | FAILED.
Staging comes before provisioning on purpose: bad data fails the job before any machine is paid
for, and the machine boots with its data already in GCS.

Every transition is one conditional `UPDATE ... WHERE id = :id AND status = :from [AND lease_owner = :me]`
plus an event row, in the caller's transaction. Zero rows updated means someone else moved the job
first (a cancel, a lease takeover): `StaleTransition`, and the caller re-reads.
"""

from __future__ import annotations

import enum
import uuid

from sqlalchemy import text
from sqlalchemy.orm import Session


class JobStatus(str, enum.Enum):
    QUEUED = "QUEUED"  # stored, waiting for a worker
    STAGING = "STAGING"  # claimed; dataset being validated and pushed to GCS
    PROVISIONING = "PROVISIONING"  # machine being created, agent starting
    RUNNING = "RUNNING"  # agent reports training
    RECOVERING = "RECOVERING"  # machine lost, preempted or its worker died; being adopted or re-provisioned
    CANCELLING = "CANCELLING"  # user asked to cancel; machine being torn down
    SUCCEEDED = "SUCCEEDED"  # artifacts written (terminal)
    FAILED = "FAILED"  # error recorded (terminal)
    CANCELLED = "CANCELLED"  # torn down after a cancel (terminal)


S = JobStatus
TERMINAL = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED})
# States a worker holds a lease on: if the lease expires, another worker takes the job over.
LEASED = frozenset({S.STAGING, S.PROVISIONING, S.RUNNING, S.RECOVERING, S.CANCELLING})
CANCELLABLE = frozenset({S.QUEUED, S.STAGING, S.PROVISIONING, S.RUNNING, S.RECOVERING})

ALLOWED: frozenset[tuple[JobStatus, JobStatus]] = frozenset({
    (S.QUEUED, S.STAGING),  # claim
    (S.QUEUED, S.CANCELLED),  # nothing was started, nothing to tear down
    (S.STAGING, S.PROVISIONING),
    (S.STAGING, S.FAILED),  # bad data, before any machine
    (S.PROVISIONING, S.RUNNING),
    (S.PROVISIONING, S.FAILED),
    (S.RUNNING, S.SUCCEEDED),
    (S.RUNNING, S.FAILED),
    *((s, S.RECOVERING) for s in (S.STAGING, S.PROVISIONING, S.RUNNING, S.RECOVERING)),  # lost machine / takeover
    (S.RECOVERING, S.STAGING),
    (S.RECOVERING, S.PROVISIONING),
    (S.RECOVERING, S.RUNNING),  # adopted: the machine and agent were still alive
    (S.RECOVERING, S.FAILED),  # retries exhausted
    *((s, S.CANCELLING) for s in (S.STAGING, S.PROVISIONING, S.RUNNING, S.RECOVERING)),
    (S.CANCELLING, S.CANCELLING),  # takeover of a half-done teardown
    (S.CANCELLING, S.CANCELLED),
})

# Columns stamped when a job enters a phase.
_PHASE_COLUMN = {
    S.STAGING: "staging_at",
    S.PROVISIONING: "provisioning_at",
    S.RUNNING: "running_at",
    S.SUCCEEDED: "finished_at",
    S.FAILED: "finished_at",
    S.CANCELLED: "finished_at",
}


class IllegalTransition(ValueError):
    """(from, to) is not in ALLOWED."""


class StaleTransition(RuntimeError):
    """The job was not in the expected state (or not ours): somebody else moved it first."""


def transition(
    session: Session,
    job_id: uuid.UUID,
    from_status: JobStatus,
    to_status: JobStatus,
    *,
    reason: str,
    worker: str | None = None,
    owner: str | None = None,
    error: str | None = None,
    bump_attempt: bool = False,
    release_lease: bool | None = None,
) -> None:
    """Move one job from -> to, or raise. `owner` adds the lease-owner condition (worker calls)."""
    if (from_status, to_status) not in ALLOWED:
        raise IllegalTransition(f"{from_status.value} -> {to_status.value} is not an allowed transition")
    sets = ["status = CAST(:to AS job_status)", "updated_at = now()"]
    if col := _PHASE_COLUMN.get(to_status):
        sets.append(f"{col} = COALESCE({col}, now())" if to_status not in TERMINAL else f"{col} = now()")
    if error is not None:
        sets.append("error = :error")
    if bump_attempt:
        sets.append("attempt = attempt + 1")
    if release_lease if release_lease is not None else to_status in TERMINAL:
        sets.append("lease_owner = NULL, lease_expires_at = NULL")
    where = "id = :id AND status = CAST(:from AS job_status)"
    if owner is not None:
        where += " AND lease_owner = :owner"
    # One statement: the conditional UPDATE and the event row commit or roll back together.
    row = session.execute(
        text(
            f"""WITH moved AS (UPDATE jobs SET {', '.join(sets)} WHERE {where} RETURNING id)
            INSERT INTO job_events (job_id, from_status, to_status, reason, worker)
            SELECT id, CAST(:from AS job_status), CAST(:to AS job_status), :reason, :worker FROM moved
            RETURNING job_id"""
        ),
        {"id": job_id, "from": from_status.value, "to": to_status.value, "reason": reason,
         "worker": worker or owner, "owner": owner, "error": error},
    ).first()
    if row is None:
        raise StaleTransition(f"job {job_id} was not {from_status.value}" + (f" under lease {owner}" if owner else ""))
    if to_status in TERMINAL or to_status == S.CANCELLING:
        session.execute(text("SELECT pg_notify('trainjobs_job_changed', :id)"), {"id": str(job_id)})
