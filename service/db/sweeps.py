"""Sweeps and their trials in PostgreSQL (issue 22). The API creates, reads and cancels them; the
worker's sweep engine (worker/sweeps.py) leases the active ones and records each trial. Optuna's study
itself lives in schema `optuna` (migration 0007), written only through Optuna's storage."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session

from service.db.models import Job, Sweep, SweepTrial
from service.db.quotas import env_int
from trainjobs.states import SWEEP_CANCELLABLE, SweepStatus

ACTIVE_SWEEP = (SweepStatus.RUNNING.value, SweepStatus.CANCELLING.value)
NOTIFY_SWEEP = "trainjobs_sweep"  # a sweep was submitted or cancelled: the workers' sweep loops look now


# Sweeps a project may have active at once (issue 36, finding 4): every active sweep is stepped in turn,
# so each one a project adds delays every other sweep's next step by one step's time.
MAX_ACTIVE_SWEEPS_ENV, MAX_ACTIVE_SWEEPS_DEFAULT = "TRAINJOBS_MAX_ACTIVE_SWEEPS", 10


def active_sweeps_refusal(session: Session, project_id: uuid.UUID) -> str | None:
    """Why the project may not start another sweep now, or None. Holds a lock on the project's sweep
    count until the transaction ends, so two submits at once cannot both take the last place."""
    limit = env_int(MAX_ACTIVE_SWEEPS_ENV, MAX_ACTIVE_SWEEPS_DEFAULT)
    session.execute(text("SELECT pg_advisory_xact_lock(hashtext('trainjobs-sweeps-' || :p))"), {"p": str(project_id)})
    active = session.scalar(select(func.count()).select_from(Sweep)
                            .where(Sweep.project_id == project_id, Sweep.status.in_(ACTIVE_SWEEP))) or 0
    if active < limit:
        return None
    return (f"the project has {active} active sweeps, the most it may have at once ({MAX_ACTIVE_SWEEPS_ENV}="
            f"{limit}); cancel one or wait until one ends")


def create_sweep(session: Session, project_id: uuid.UUID, spec: dict[str, Any]) -> Sweep:
    sweep = Sweep(project_id=project_id, name=spec["name"], spec=spec, status=SweepStatus.RUNNING.value)
    session.add(sweep)
    session.flush()
    session.refresh(sweep)
    # Wakes the workers' sweep loops at once (they poll too).
    session.execute(text("SELECT pg_notify(:channel, :id)"), {"channel": NOTIFY_SWEEP, "id": str(sweep.id)})
    return sweep


def get_sweep(session: Session, project_id: uuid.UUID, sweep_id: uuid.UUID) -> Sweep | None:
    return session.scalars(select(Sweep).where(Sweep.id == sweep_id, Sweep.project_id == project_id)).first()


def list_sweeps(session: Session, project_id: uuid.UUID, limit: int = 50) -> list[Sweep]:
    return list(session.scalars(select(Sweep).where(Sweep.project_id == project_id)
                                .order_by(Sweep.created_at.desc(), Sweep.id.desc()).limit(limit)))


def trials_with_jobs(session: Session, sweep_id: uuid.UUID) -> list[tuple[SweepTrial, Job]]:
    """Every trial of a sweep with its job, by trial number."""
    rows = session.execute(select(SweepTrial, Job).join(Job, Job.id == SweepTrial.job_id)
                           .where(SweepTrial.sweep_id == sweep_id).order_by(SweepTrial.number)).all()
    return [(t, j) for t, j in rows]


def request_cancel(session: Session, project_id: uuid.UUID, sweep_id: uuid.UUID) -> Sweep | None:
    """A running sweep goes CANCELLING; the worker cancels its trials' jobs and ends it. Idempotent."""
    sweep = session.scalars(select(Sweep).where(Sweep.id == sweep_id, Sweep.project_id == project_id)
                            .with_for_update()).first()
    if sweep is not None and SweepStatus(sweep.status) in SWEEP_CANCELLABLE:
        sweep.status = SweepStatus.CANCELLING.value
        sweep.note = "cancel requested by user"
        session.execute(text("SELECT pg_notify(:channel, :id)"), {"channel": NOTIFY_SWEEP, "id": str(sweep.id)})
        session.flush()
    return sweep


# --- the worker's ---------------------------------------------------------------------------------

# Which active sweeps a worker steps next (issue 36, finding 4). A lease lasts one step: the worker
# releases it when the step ends (release_stepped), so every tick any worker takes the most overdue
# sweeps, and a sweep whose trials only wait (on quota, on a machine) holds no worker's place.
LEASE_SQL = text(f"""
WITH free AS (  -- active, due (not stepped in the last every_s), and no worker is about to step it
               -- (a lease that lapsed is nobody's)
    SELECT id, project_id, stepped_at, created_at FROM sweeps
     WHERE status IN ('{ACTIVE_SWEEP[0]}', '{ACTIVE_SWEEP[1]}')
       AND (lease_owner IS NULL OR lease_expires_at < now())
       AND (stepped_at IS NULL OR stepped_at < now() - make_interval(secs => :every_s))
), turns AS (  -- each project's most overdue sweep is its turn 1: every project's turn 1 comes before
               -- any project's turn 2, so one project's many sweeps never crowd out another's one
    SELECT id, stepped_at, created_at,
           row_number() OVER (PARTITION BY project_id ORDER BY stepped_at NULLS FIRST, created_at, id) AS turn
      FROM free
), picked AS (  -- locked and re-checked: another worker may have leased one since `free` was read
    SELECT s.id, t.turn, t.stepped_at, t.created_at FROM sweeps s JOIN turns t ON t.id = s.id
     WHERE s.status IN ('{ACTIVE_SWEEP[0]}', '{ACTIVE_SWEEP[1]}')
       AND (s.lease_owner IS NULL OR s.lease_expires_at < now())
       AND (s.stepped_at IS NULL OR s.stepped_at < now() - make_interval(secs => :every_s))
     ORDER BY t.turn, t.stepped_at NULLS FIRST, t.created_at, s.id
     FOR UPDATE OF s SKIP LOCKED LIMIT :limit
)
UPDATE sweeps SET lease_owner = :owner, lease_expires_at = now() + make_interval(secs => :lease_s)
  FROM picked WHERE sweeps.id = picked.id
RETURNING sweeps.id, picked.turn, picked.stepped_at, picked.created_at
""")


def lease_sweeps(session: Session, owner: str, lease_s: float, limit: int, every_s: float = 0.0) -> list[uuid.UUID]:
    """Up to `limit` active sweeps for this worker to step now, of those not stepped in the last every_s,
    the most overdue first, in turns across projects; each leased until its step ends (release_stepped)
    or lease_s passes (the worker stopped)."""
    rows = list(session.execute(LEASE_SQL, {"owner": owner, "lease_s": lease_s, "limit": limit, "every_s": every_s}))
    far_past = datetime.min.replace(tzinfo=timezone.utc)
    rows.sort(key=lambda r: (r.turn, r.stepped_at is not None, r.stepped_at or far_past, r.created_at))
    return [r.id for r in rows]


def release_stepped(session: Session, sweep_id: uuid.UUID, owner: str) -> None:
    """The step ended (or failed): the sweep goes back to the end of its project's turns, leased by nobody.
    Stepped at the database's now(), the clock LEASE_SQL judges by, not the worker's."""
    session.execute(update(Sweep).where(Sweep.id == sweep_id, Sweep.lease_owner == owner)
                    .values(lease_owner=None, lease_expires_at=None, stepped_at=func.now()))


def release_sweeps(session: Session, owner: str) -> None:
    """Every lease this worker holds (leased, not yet stepped) lapses now: on shutdown."""
    session.execute(update(Sweep).where(Sweep.lease_owner == owner).values(lease_owner=None, lease_expires_at=None))


def leased_sweep(session: Session, sweep_id: uuid.UUID, owner: str) -> Sweep | None:
    """The sweep, locked, while this worker holds its lease."""
    return session.scalars(select(Sweep).where(Sweep.id == sweep_id, Sweep.lease_owner == owner)
                           .with_for_update()).first()


def add_trial(session: Session, sweep_id: uuid.UUID, number: int, optuna_trial_id: int, job_id: uuid.UUID,
              params: dict[str, Any]) -> None:
    session.add(SweepTrial(sweep_id=sweep_id, number=number, optuna_trial_id=optuna_trial_id, job_id=job_id,
                           params=params, state="RUNNING", curve=[]))
    session.flush()


def finish_sweep(session: Session, sweep: Sweep, status: SweepStatus, note: str | None, now: datetime) -> None:
    sweep.status = status.value
    sweep.note = note
    sweep.finished_at = now
    sweep.updated_at = now
    sweep.lease_owner = None
    sweep.lease_expires_at = None
