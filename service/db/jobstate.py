"""Job states and the only place that changes them.

Order of phases: QUEUED -> STAGING -> PROVISIONING -> RUNNING -> SUCCEEDED | FAILED.
Staging comes before provisioning on purpose: bad data fails the job before any machine is paid
for, and the machine boots with its data already in GCS.

Every transition is one conditional `UPDATE ... WHERE id = :id AND status = :from [AND lease_owner = :me]`
plus an event row, in the caller's transaction. Zero rows updated means someone else moved the job
first (a cancel, a lease takeover): `StaleTransition`, and the caller re-reads.
"""

from __future__ import annotations

import re
import uuid

from sqlalchemy import text
from sqlalchemy.orm import Session

from trainjobs.states import ACTIVE, HOLDING, TERMINAL, JobStatus

__all__ = ["ALLOWED", "CLAIM_MOVES", "NOTIFY_CHANGED", "NOTIFY_QUEUED", "IllegalTransition", "JobStatus",
           "StaleTransition", "claim_target_sql", "clean_text", "transition"]

# LISTEN/NOTIFY channels (payload: the job id). Workers treat both as hints and still poll.
NOTIFY_QUEUED = "trainjobs_job_queued"  # a job was submitted
NOTIFY_CHANGED = "trainjobs_job_changed"  # a job ended or is being cancelled: its driver should look now

# Written in the groups of trainjobs/states.py (ACTIVE, HOLDING, CANCELLABLE, TERMINAL).
S = JobStatus

ALLOWED: frozenset[tuple[JobStatus, JobStatus]] = frozenset({
    (S.QUEUED, S.STAGING),  # claim
    (S.QUEUED, S.CANCELLED),  # nothing was started, nothing to tear down
    (S.STAGING, S.PROVISIONING),
    (S.STAGING, S.FAILED),  # bad data, before any machine
    (S.PROVISIONING, S.RUNNING),
    (S.PROVISIONING, S.FAILED),
    (S.RUNNING, S.SUCCEEDED),
    (S.RUNNING, S.FAILED),
    *((s, S.RECOVERING) for s in ACTIVE),  # lost machine / takeover
    (S.RECOVERING, S.STAGING),
    (S.RECOVERING, S.PROVISIONING),
    (S.RECOVERING, S.RUNNING),  # adopted: the machine and agent were still alive
    (S.RECOVERING, S.SUCCEEDED),  # the agent had finished while nobody watched (its worker died)
    (S.RECOVERING, S.FAILED),  # retries exhausted, or the agent had failed
    *((s, S.CANCELLING) for s in ACTIVE),  # a started job's cancel (CANCELLABLE is QUEUED and ACTIVE)
    (S.CANCELLING, S.CANCELLING),  # takeover of a half-done teardown
    (S.CANCELLING, S.CANCELLED),
})

# The moves the claim makes (service/db/queue.py runs them as one statement, with claim_target_sql):
# a queued job starts STAGING; a job whose worker stopped heartbeating goes RECOVERING, so its new
# owner adopts or re-creates whatever the dead worker had provisioned; a half-done cancel stays
# CANCELLING. Besides QUEUED, the keys are HOLDING: the only statuses a lease can be taken over in.
CLAIM_MOVES: dict[JobStatus, JobStatus] = {
    S.QUEUED: S.STAGING,
    **{s: S.RECOVERING for s in ACTIVE},
    S.CANCELLING: S.CANCELLING,
}
if CLAIM_MOVES.keys() - {S.QUEUED} != HOLDING:
    raise ImportError("a lease can be taken over in the HOLDING statuses, and only there")


def claim_target_sql(column: str) -> str:
    """CLAIM_MOVES as a SQL CASE over `column`, so the claim statement moves jobs by this table."""
    for pair in CLAIM_MOVES.items():
        if pair not in ALLOWED:
            raise IllegalTransition(f"claim move {pair[0].value} -> {pair[1].value} is not an allowed transition")
    whens = " ".join(f"WHEN '{f.value}' THEN '{t.value}'::job_status" for f, t in CLAIM_MOVES.items())
    return f"CASE {column} {whens} END"


# Columns stamped when a job enters a phase.
_PHASE_COLUMN = {
    S.STAGING: "staging_at",
    S.PROVISIONING: "provisioning_at",
    S.RUNNING: "running_at",
    S.SUCCEEDED: "finished_at",
    S.FAILED: "finished_at",
    S.CANCELLED: "finished_at",
}

# Error text comes from anywhere: user data quoted in an exception, an agent's log lines, a cloud's
# message. PostgreSQL refuses NUL in text (that error stranded a job, issue 8), escape codes recolour
# the terminal of whoever reads `trainjobs status`, a lone surrogate cannot be encoded at all, and a
# cap keeps one huge traceback out of every read of the job.
MAX_TEXT = 4000
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # all but \t and \n
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def clean_text(value: str, limit: int = MAX_TEXT) -> str:
    """`value` as it is safe to store and show: no escape codes or control characters but newlines
    and tabs, lone surrogates replaced, at most `limit` characters."""
    value = _SURROGATE.sub("\ufffd", _CONTROL.sub("", _ANSI.sub("", value)))
    return value if len(value) <= limit else value[: limit - 1] + "…"


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
        {"id": job_id, "from": from_status.value, "to": to_status.value, "reason": clean_text(reason),
         "worker": worker or owner, "owner": owner, "error": None if error is None else clean_text(error)},
    ).first()
    if row is None:
        raise StaleTransition(f"job {job_id} was not {from_status.value}" + (f" under lease {owner}" if owner else ""))
    if to_status in TERMINAL or to_status == S.CANCELLING:
        session.execute(text("SELECT pg_notify(:channel, :id)"), {"channel": NOTIFY_CHANGED, "id": str(job_id)})
