"""ORM tables. API schemas live in service/schemas.py; these are storage only."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger, DateTime, Enum, Float, ForeignKey, Index, Integer, LargeBinary, String, Text, func, text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from trainjobs.states import JobStatus


class Base(DeclarativeBase):
    pass


JOB_STATUS = Enum(JobStatus, name="job_status", values_callable=lambda e: [m.value for m in e])


class Project(Base):
    __tablename__ = "projects"
    id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True, server_default=text("gen_random_uuid()"))
    name: Mapped[str] = mapped_column(String(100), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # Quotas; NULL means the deployment's default.
    max_running_jobs: Mapped[int | None] = mapped_column(Integer)
    max_accelerators: Mapped[int | None] = mapped_column(Integer)


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True, server_default=text("gen_random_uuid()"))
    project_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    # sha256 of the secret: keys are 256-bit random, so a fast hash is enough and lookups stay O(1).
    key_hash: Mapped[bytes] = mapped_column(LargeBinary(32), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))  # shown in listings so users can tell keys apart
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True, server_default=text("gen_random_uuid()"))
    project_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB)
    labels: Mapped[dict[str, str]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    status: Mapped[JobStatus] = mapped_column(JOB_STATUS, server_default=JobStatus.QUEUED.value)
    attempt: Mapped[int] = mapped_column(Integer, server_default="0")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    staging_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    provisioning_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    running_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    error: Mapped[str | None] = mapped_column(Text)
    progress: Mapped[float | None] = mapped_column()
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    runtime: Mapped[dict[str, Any] | None] = mapped_column(JSONB)  # strategy, replicas, batch, lr chosen
    dataset_uri: Mapped[str | None] = mapped_column(Text)
    # The agent's artifact manifest, copied out of the job's reach when it succeeded.
    artifacts: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
    wait_reason: Mapped[str | None] = mapped_column(Text)  # why a queued job has not started
    # Each machine of each attempt: name, attempt, requested_at, ready_at, first_report_at, deleted_at
    # (ISO 8601), written by the worker (service/db/machines.py); the first training step and how long
    # after its machine was requested it ran (issue 10 §4).
    machines: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
    first_step_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    time_to_first_step_s: Mapped[float | None] = mapped_column()
    # The advisor's advice (trainjobs/advice.py): [{rule, evidence, suggestion, expected_gain}], written by
    # the worker as the job progresses and when it ends (migration 0008).
    advice: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
    accelerators: Mapped[int] = mapped_column(Integer, server_default="0")  # chips/GPUs held while running
    driver_failures: Mapped[int] = mapped_column(Integer, server_default="0")  # consecutive failed driver steps
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (
        # The claim scans queued jobs oldest first; a partial index keeps that O(queued), not O(all jobs).
        Index("ix_jobs_queued", "created_at", postgresql_where=text("status = 'QUEUED'")),
        # Lease takeover looks only at leased jobs whose lease ran out.
        Index("ix_jobs_lease", "lease_expires_at", postgresql_where=text("lease_owner IS NOT NULL")),
        # Listing: a project's jobs newest first, optionally by status; keyset on (created_at, id).
        Index("ix_jobs_project_created", "project_id", text("created_at DESC"), text("id DESC")),
        Index("ix_jobs_project_status_created", "project_id", "status", text("created_at DESC"), text("id DESC")),
        # Label filters within a project: one entry per (project, key, value); see migration 0005 and
        # service/db/jobs.py:labels_in_project, which writes the same expression.
        Index("ix_jobs_project_labels", text("(jsonb_set('{}', ARRAY[project_id::text], labels)) jsonb_path_ops"),
              postgresql_using="gin"),
    )


class JobEvent(Base):
    __tablename__ = "job_events"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    from_status: Mapped[JobStatus | None] = mapped_column(JOB_STATUS)
    to_status: Mapped[JobStatus] = mapped_column(JOB_STATUS)
    reason: Mapped[str] = mapped_column(Text)
    worker: Mapped[str | None] = mapped_column(String(200))
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class IdempotencyKey(Base):
    __tablename__ = "idempotency_keys"
    project_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    request_hash: Mapped[bytes] = mapped_column(LargeBinary(32))
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Sweep(Base):
    """A sweep (issue 22): its spec, status and the worker that drives it; its trials below, its study in
    Optuna's own tables (schema optuna, migration 0007)."""

    __tablename__ = "sweeps"
    id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True, server_default=text("gen_random_uuid()"))
    project_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB)
    status: Mapped[str] = mapped_column(String(16), server_default="RUNNING")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    note: Mapped[str | None] = mapped_column(Text)  # why it stopped asking, or why it failed
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    stepped_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # by a worker, last (0010)

    __table_args__ = (
        Index("ix_sweeps_project_created", "project_id", text("created_at DESC"), text("id DESC")),
        Index("ix_sweeps_active", "lease_expires_at", postgresql_where=text("status IN ('RUNNING', 'CANCELLING')")),
    )


class SweepTrial(Base):
    __tablename__ = "sweep_trials"
    sweep_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True)  # Optuna's trial number, from 0
    optuna_trial_id: Mapped[int] = mapped_column(Integer)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), unique=True)
    params: Mapped[dict[str, Any]] = mapped_column(JSONB)
    state: Mapped[str] = mapped_column(String(16), server_default="RUNNING")
    value: Mapped[float | None] = mapped_column(Float)
    curve: Mapped[list[list[float]]] = mapped_column(JSONB, server_default=text("'[]'::jsonb"))  # [epoch, value]
    cost_usd: Mapped[float] = mapped_column(Float, server_default="0")
    accelerator_s: Mapped[float] = mapped_column(Float, server_default="0")  # accelerators x seconds held
    # The generation of the job's metrics.json whose epochs are all on the curve: read again only once changed.
    metrics_generation: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
