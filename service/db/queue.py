"""The queue's SQL, each statement named: claim, lease renewal, release. Every statement here is one
round trip; callers own the transaction."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, text
from sqlalchemy.orm import Session

from service.db.jobstate import JobStatus, claim_target_sql
from service.db.quotas import HOLDING_RANGE_SQL, QuotaDefaults
from trainjobs.states import HOLDING, sql_list

# A worker may serve only some accelerator types (`trainjobs worker --accelerators tpu`), so one fleet
# can split TPU and GPU work; NULL serves all.
_SERVES = "(CAST(:serves AS text[]) IS NULL OR {t}spec->'accelerator'->>'type' = ANY(CAST(:serves AS text[])))"

# The claim and the takeover share their CTEs: `expired` finds a job whose worker's lease ran out, `queued`
# (the claim's alone) the oldest queued job its project's quotas let start, and `_MOVE` moves the
# `candidate` by jobstate.CLAIM_MOVES, the state machine's table (not a rule of this file), with its event.
_EXPIRED = f"""expired AS (
    -- Jobs whose worker stopped heartbeating come first: their machines may be billing with nobody
    -- watching. Partial index ix_jobs_lease holds only leased rows, so this probe is cheap. A lease
    -- is taken over only while the job holds a machine (HOLDING, trainjobs/states.py).
    SELECT id, status FROM jobs
     WHERE lease_owner IS NOT NULL AND lease_expires_at < now() AND status IN ({sql_list(HOLDING)})
       AND {_SERVES.format(t="")}
     ORDER BY lease_expires_at LIMIT 1 FOR UPDATE SKIP LOCKED
)"""

_QUEUED = f"""queued AS (
    -- Otherwise the oldest queued job (partial index ix_jobs_queued) that its project's quotas
    -- (service/db/quotas.py) let start now. A job whose project is at a quota is passed over, not
    -- waited on, so one project's backlog never holds another project's jobs behind it; passing a
    -- row of that backlog costs a few index probes. SKIP LOCKED lets concurrent workers pass over
    -- each other's rows instead of queueing behind them; LIMIT 1 locks one row.
    SELECT j.id, j.status FROM jobs j
     WHERE j.status = 'QUEUED' AND NOT EXISTS (SELECT 1 FROM expired) AND {_SERVES.format(t="j.")}
       AND (SELECT taken.jobs < quota.jobs AND taken.accelerators + j.accelerators <= quota.accelerators
              FROM (SELECT GREATEST(COALESCE(p.max_running_jobs, :default_jobs), 0) AS jobs,  -- a LIMIT: never < 0
                           COALESCE(p.max_accelerators, :default_accelerators) AS accelerators
                      FROM projects p WHERE p.id = j.project_id) quota
             CROSS JOIN LATERAL (
                -- Taken: the jobs the project holds now, and its queued jobs ahead of this one. Within
                -- a project the queue is first in, first out, so a big job is not overtaken forever by
                -- small ones. Counting those ahead also keeps concurrent claims within the quota
                -- although each counts from its own snapshot: a job another claim took meanwhile is
                -- still queued in ours, so it is counted (and skipped as locked or no longer queued).
                -- Only jobs committed out of created_at order can slip past. Reading stops at the job
                -- quota, so the work per row is bounded, and a project at its quota never reads its
                -- queue. Both halves are probes of ix_jobs_project_status_created.
                SELECT count(*) AS jobs, COALESCE(sum(t.accelerators), 0) AS accelerators FROM (
                    (SELECT h.accelerators FROM jobs h
                      WHERE h.project_id = j.project_id AND h.status BETWEEN {HOLDING_RANGE_SQL} LIMIT quota.jobs)
                    UNION ALL
                    (SELECT a.accelerators FROM jobs a
                      WHERE a.project_id = j.project_id AND a.status = 'QUEUED'
                        AND (a.created_at, a.id) < (j.created_at, j.id) LIMIT quota.jobs)
                    LIMIT quota.jobs) t) taken)
     ORDER BY j.created_at LIMIT 1 FOR UPDATE SKIP LOCKED
)"""

_MOVE = f"""claimed AS (
    -- jobstate.CLAIM_MOVES: queued -> STAGING, taken over -> RECOVERING, cancelling stays. A taken-over
    -- job keeps its staging_at and attempt.
    UPDATE jobs j SET
        status = {claim_target_sql("c.status")},
        staging_at = CASE WHEN c.status = 'QUEUED' THEN now() ELSE j.staging_at END,
        attempt = CASE WHEN c.status = 'QUEUED' THEN 1 ELSE j.attempt END,
        lease_owner = :owner,
        lease_expires_at = now() + make_interval(secs => :lease_s),
        updated_at = now()
    FROM candidate c WHERE j.id = c.id
    RETURNING j.id, c.status AS from_status, j.status AS to_status
),
event AS (
    -- The claim is a state transition like any other: it gets its event row in the same statement.
    INSERT INTO job_events (job_id, from_status, to_status, reason, worker)
    SELECT id, from_status, to_status,
           CASE WHEN from_status = 'QUEUED' THEN 'claimed' ELSE 'lease expired; taken over' END, :owner
      FROM claimed
)
SELECT id, from_status, to_status FROM claimed"""

# claim_next_job: one statement takes a job whose worker's lease ran out, else the oldest queued job.
CLAIM_SQL = text(f"""
WITH {_EXPIRED},
{_QUEUED},
candidate AS (SELECT * FROM expired UNION ALL SELECT * FROM queued),
{_MOVE}
""")


@dataclass(frozen=True)
class Claim:
    job_id: uuid.UUID
    from_status: JobStatus
    to_status: JobStatus

    @property
    def takeover(self) -> bool:
        return self.from_status != JobStatus.QUEUED


def claim_next_job(conn: Session | Connection, owner: str, lease_s: float,
                   serves: Sequence[str] | None = None) -> Claim | None:
    """Atomic on its own, so the worker runs it on an autocommit connection: one round trip. `serves`:
    only jobs of these accelerator types (None: all)."""
    quota = QuotaDefaults.from_env()
    row = conn.execute(CLAIM_SQL, {"owner": owner, "lease_s": lease_s, "default_jobs": quota.max_running_jobs,
                                   "default_accelerators": quota.max_accelerators,
                                   "serves": list(serves) if serves is not None else None}).first()
    if row is None:
        return None
    return Claim(row.id, JobStatus(row.from_status), JobStatus(row.to_status))


# take_over_expired_job: the claim without its queued half, for a worker whose slots are all busy: an
# orphaned machine may be billing with nobody watching, so it must not wait behind queued jobs for a
# slot (issue 8).
TAKEOVER_SQL = text(f"""
WITH {_EXPIRED},
candidate AS (SELECT * FROM expired),
{_MOVE}
""")


def take_over_expired_job(conn: Session | Connection, owner: str, lease_s: float,
                          serves: Sequence[str] | None = None) -> Claim | None:
    """Like claim_next_job, but never a queued job: for the takeover slots beyond a worker's concurrency."""
    row = conn.execute(TAKEOVER_SQL, {"owner": owner, "lease_s": lease_s,
                                      "serves": list(serves) if serves is not None else None}).first()
    if row is None:
        return None
    return Claim(row.id, JobStatus(row.from_status), JobStatus(row.to_status))


def renew_leases(session: Session, owner: str, job_ids: list[uuid.UUID], lease_s: float) -> dict[uuid.UUID, JobStatus]:
    """Heartbeat the jobs this worker is driving right now; returns their current statuses, so the
    caller also learns of cancels. A job missing from the result is no longer ours. Only the ids
    given: a job whose driver died keeps its old expiry, lapses, and is taken over."""
    if not job_ids:
        return {}
    rows = session.execute(
        text("""UPDATE jobs SET lease_expires_at = now() + make_interval(secs => :lease_s)
                WHERE lease_owner = :owner AND id = ANY(:ids) RETURNING id, status"""),
        {"owner": owner, "ids": job_ids, "lease_s": lease_s},
    ).all()
    return {r.id: JobStatus(r.status) for r in rows}


def release_lease(session: Session, job_id: uuid.UUID, owner: str) -> None:
    """Give a job back on shutdown: its lease expires at once, so the next worker's claim takes it
    over (and adopts its machine) immediately instead of waiting out the lease."""
    session.execute(
        text("UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = :id AND lease_owner = :owner"),
        {"id": job_id, "owner": owner},
    )


def release_leases_of(session: Session, owner: str) -> int:
    """Give back every job a worker known to be dead still holds (a killed `trainjobs up`'s, found by its
    lifeline or by the next `up`, stack/lifetime.py): the next claim takes each over at once instead of
    waiting out its lease. Returns how many."""
    result = session.execute(
        text("""UPDATE jobs SET lease_expires_at = now() - interval '1 second'
                WHERE lease_owner = :owner AND lease_expires_at > now()"""),
        {"owner": owner},
    )
    return int(getattr(result, "rowcount", 0) or 0)
