"""Per-project quotas: how many jobs, and how many accelerators, a project may hold at once.

A job holds a machine (and counts against its project) from the claim until it ends: the HOLDING
statuses (trainjobs/states.py). The claim (service/db/queue.py) enforces the
limits; this module reads them, sets them, and says why a queued job waits. Why a job waits is
computed when it is read, not stored: it changes whenever another job of the project starts or
ends, and writing it on every such change would put a write on the claim's hot path.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import select, text, update
from sqlalchemy.orm import Session

from service.db.models import Project
from trainjobs.states import HOLDING, JobStatus, in_order, sql_list

HOLDING_SQL = sql_list(HOLDING)
# HOLDING is one run of the job_status enum's order (migration 0001 lists the values as JobStatus
# does), so a claim reads it as one index range, not one index descent per status.
_HOLDING = in_order(HOLDING)
if list(JobStatus)[list(JobStatus).index(_HOLDING[0]):][:len(_HOLDING)] != _HOLDING:
    raise ImportError("HOLDING must be consecutive job statuses: the claim reads it as a range")
HOLDING_RANGE_SQL = f"'{_HOLDING[0].value}' AND '{_HOLDING[-1].value}'"


def env_int(name: str, default: int) -> int:
    """A whole-number setting from the environment; a bad value names the variable."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a whole number") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r} must not be negative")
    return value


@dataclass(frozen=True)
class QuotaDefaults:
    """The deployment's limits for a project that has none of its own (a NULL column)."""

    max_running_jobs: int
    max_accelerators: int

    @classmethod
    def from_env(cls) -> QuotaDefaults:
        # Read on every call, not cached: an operator's change applies at the next claim.
        return cls(env_int("TRAINJOBS_DEFAULT_MAX_RUNNING_JOBS", 8),
                   env_int("TRAINJOBS_DEFAULT_MAX_ACCELERATORS", 64))


@dataclass(frozen=True)
class ProjectUsage:
    max_running_jobs: int
    max_accelerators: int
    running_jobs: int
    accelerators_in_use: int

    def wait_reason(self, job_accelerators: int, ahead: Ahead) -> str | None:
        """Why a queued job cannot start now, by the claim's rule (queue.CLAIM_SQL): its project's jobs
        and accelerators held, plus those of its older queued jobs, which start first. None: it may."""
        if self.running_jobs + ahead.jobs >= self.max_running_jobs:
            return (f"project at quota: {self.running_jobs} of {self.max_running_jobs} running jobs"
                    + (f", {ahead.jobs} queued before this one" if ahead.jobs else ""))
        if self.accelerators_in_use + ahead.accelerators + job_accelerators > self.max_accelerators:
            return (f"project at quota: {self.accelerators_in_use} of {self.max_accelerators} accelerators in use, "
                    f"this job needs {job_accelerators}"
                    + (f" after {ahead.accelerators} for jobs queued before it" if ahead.accelerators else ""))
        return None


@dataclass(frozen=True)
class Ahead:
    """A queued job's older queued jobs in its project: they start first."""

    jobs: int = 0
    accelerators: int = 0


_USAGE_SQL = text(f"""
SELECT COALESCE(p.max_running_jobs, :default_jobs) AS max_running_jobs,
       COALESCE(p.max_accelerators, :default_accelerators) AS max_accelerators,
       count(j.id) AS running_jobs, COALESCE(sum(j.accelerators), 0) AS accelerators_in_use
  FROM projects p LEFT JOIN jobs j ON j.project_id = p.id AND j.status IN ({HOLDING_SQL})
 WHERE p.id = :project GROUP BY p.id
""")


def project_usage(session: Session, project_id: uuid.UUID) -> ProjectUsage:
    d = QuotaDefaults.from_env()
    row = session.execute(_USAGE_SQL, {"project": project_id, "default_jobs": d.max_running_jobs,
                                       "default_accelerators": d.max_accelerators}).one()
    return ProjectUsage(row.max_running_jobs, row.max_accelerators, row.running_jobs, row.accelerators_in_use)


# Only the asked-for jobs' rows come back: a page of 50 in a project with thousands queued (a sweep)
# no longer ships every queued job to Python.
_AHEAD_SQL = text("""
SELECT id, jobs, accelerators FROM (
  SELECT id, count(*) OVER w - 1 AS jobs, sum(accelerators) OVER w - accelerators AS accelerators
    FROM jobs WHERE project_id = :project AND status = 'QUEUED'
  WINDOW w AS (ORDER BY created_at, id)) ahead
 WHERE id = ANY(:ids)
""")


class QueuedJob(Protocol):
    """What wait_reasons reads of a job: a Job, or a row of its columns."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def status(self) -> JobStatus: ...
    @property
    def accelerators(self) -> int: ...


def wait_reasons(session: Session, project_id: uuid.UUID, jobs: Sequence[QueuedJob],
                 usage: ProjectUsage | None = None) -> dict[uuid.UUID, str]:
    """Why each of `jobs` that is QUEUED waits, for those that wait on a quota. Computed when read (see
    the module docstring); costs nothing when none of them is queued. `usage`: the project's, if the
    caller has read it in this transaction already."""
    queued = [j for j in jobs if j.status == JobStatus.QUEUED]
    if not queued:
        return {}
    usage = usage or project_usage(session, project_id)
    ahead = {r.id: Ahead(r.jobs, r.accelerators)
             for r in session.execute(_AHEAD_SQL, {"project": project_id, "ids": [j.id for j in queued]})}
    reasons = {j.id: usage.wait_reason(j.accelerators, ahead.get(j.id, Ahead())) for j in queued}
    return {job_id: reason for job_id, reason in reasons.items() if reason is not None}


class UnknownProject(LookupError):
    pass


def set_quota(session: Session, name: str, **limits: int | None) -> uuid.UUID:
    """Set a project's max_running_jobs and/or max_accelerators; None returns a limit to the
    deployment default. Returns the project's id."""
    if unknown := limits.keys() - {"max_running_jobs", "max_accelerators"}:
        raise ValueError(f"not quota columns: {sorted(unknown)}")
    project_id = session.scalars(
        update(Project).where(Project.name == name).values(**limits).returning(Project.id)
        if limits else select(Project.id).where(Project.name == name)
    ).first()
    if project_id is None:
        raise UnknownProject(f"no project named {name!r}")
    return project_id
