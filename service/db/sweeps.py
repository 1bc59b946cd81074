"""Sweeps and their trials in PostgreSQL (issue 22). The API creates, reads and cancels them; the
worker's sweep engine (worker/sweeps.py) leases the active ones and records each trial. Optuna's study
itself lives in schema `optuna` (migration 0007), written only through Optuna's storage."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import select, text, update
from sqlalchemy.orm import Session

from service.db.models import Job, Sweep, SweepTrial
from trainjobs.states import SWEEP_CANCELLABLE, SweepStatus

ACTIVE_SWEEP = (SweepStatus.RUNNING.value, SweepStatus.CANCELLING.value)
NOTIFY_SWEEP = "trainjobs_sweep"  # a sweep was submitted or cancelled: the workers' sweep loops look now


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

LEASE_SQL = text(f"""
UPDATE sweeps SET lease_owner = :owner, lease_expires_at = now() + make_interval(secs => :lease_s)
 WHERE id IN (SELECT id FROM sweeps
               WHERE status IN ('{ACTIVE_SWEEP[0]}', '{ACTIVE_SWEEP[1]}')
                 AND (lease_owner IS NULL OR lease_owner = :owner OR lease_expires_at < now())
               ORDER BY created_at FOR UPDATE SKIP LOCKED LIMIT :limit)
RETURNING id
""")


def lease_sweeps(session: Session, owner: str, lease_s: float, limit: int) -> list[uuid.UUID]:
    """The active sweeps this worker drives now: its own (renewed), and any nobody holds or whose
    worker stopped renewing."""
    return [r.id for r in session.execute(LEASE_SQL, {"owner": owner, "lease_s": lease_s, "limit": limit})]


def release_sweep(session: Session, sweep_id: uuid.UUID, owner: str) -> None:
    session.execute(update(Sweep).where(Sweep.id == sweep_id, Sweep.lease_owner == owner)
                    .values(lease_owner=None, lease_expires_at=None))


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
