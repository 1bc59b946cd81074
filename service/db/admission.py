"""What this deployment admits (issue 36, 5): the one home of the rules a job passes before it is queued,
beyond its spec's own. POST /v1/jobs calls it for the job; POST /v1/sweeps for the sweep's job and the
trial of every value it checks of every parameter; the sweep engine (worker/sweeps.py) for every trial
Optuna draws, which never went through the API. A rule written in the jobs route only was how a sweep made
trials of 64 CPU replicas and of 64 workers that POST /v1/jobs refuses.

- Sizes: the spec's own bounds are what any cloud could run; these are what this deployment's
  provisioners can. Locally every worker is a TensorFlow process and every CPU replica a logical device
  on this host, so the defaults fit a laptop; an operator with real clouds raises them
  (TRAINJOBS_MAX_WORKERS, TRAINJOBS_MAX_CPU_REPLICAS).
- Quota sizing: a job needing more accelerators than its project may ever hold at once would wait forever.
- Sources (the rules: trainjobs/source_rules.py) of the dataset, the code and a program's channels: another
  project's uploads or jobs, other folders of our bucket, buckets the operator does not list, host paths
  the operator does not allow and URLs the worker would not fetch; a program's requirement that names its
  own URL is held to the operator's hosts and folders (the spec alone cannot read the deployment's
  settings). The worker applies the data and requirement rules again at staging.
- Teacher (service/db/teachers.py): a distillation's teacher job.

Every setting is read at each call: an operator's change needs no restart, and applies to the trials a
sweep submitted before it draws after it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy.orm import Session

from service.db.jobs import get_job
from service.db.quotas import ProjectUsage, env_int, project_usage
from service.db.teachers import teacher_problem
from trainjobs import storage
from trainjobs.source_rules import DataAccessRules, SourceRefused, check_source
from trainjobs.spec import CpuAccelerator, JobSpec
from trainjobs.spec.derived import job_accelerators

INVALID = "invalid_spec"
OVER_QUOTA = "over_quota"


@dataclass(frozen=True)
class Refusal:
    """Why a job is not admitted: the field to change, and the API's error code for it."""

    field: str
    reason: str
    code: str = INVALID

    def detail(self) -> dict[str, str]:
        return {"field": self.field, "reason": self.reason}


@dataclass(frozen=True)
class JobSizeLimits:
    max_workers: int
    max_cpu_replicas: int

    @classmethod
    def from_env(cls) -> JobSizeLimits:
        return cls(env_int("TRAINJOBS_MAX_WORKERS", 4), env_int("TRAINJOBS_MAX_CPU_REPLICAS", 8))

    def refusals(self, spec: JobSpec) -> list[Refusal]:
        """Each size this deployment cannot run; empty when the job fits."""
        out = []
        if spec.workers > self.max_workers:
            out.append(Refusal("workers", f"{spec.workers} workers: this deployment runs at most "
                                          f"{self.max_workers} (TRAINJOBS_MAX_WORKERS)"))
        acc = spec.accelerator
        if isinstance(acc, CpuAccelerator) and acc.replicas > self.max_cpu_replicas:
            out.append(Refusal("accelerator.replicas", f"{acc.replicas} CPU replicas: this deployment runs at "
                                                       f"most {self.max_cpu_replicas} (TRAINJOBS_MAX_CPU_REPLICAS)"))
        return out


def beyond_project_quota(usage: ProjectUsage, accelerators: int) -> Refusal | None:
    if accelerators <= usage.max_accelerators:
        return None
    return Refusal("accelerator", f"this job needs {accelerators} accelerators; the project may hold at most "
                                  f"{usage.max_accelerators} at once (its quota)", OVER_QUOTA)


@dataclass(frozen=True)
class Admission:
    """The rules for one project's jobs, read once for a request (or a sweep's step) that checks many."""

    project_id: uuid.UUID
    limits: JobSizeLimits
    usage: ProjectUsage

    @classmethod
    def load(cls, session: Session, project_id: uuid.UUID) -> Admission:
        return cls(project_id, JobSizeLimits.from_env(), project_usage(session, project_id))

    def sizing(self, spec: JobSpec) -> list[Refusal]:
        """What the deployment's sizes and the project's quota refuse of `spec`: no database, so a sweep's
        every checked value costs microseconds."""
        refusals = self.limits.refusals(spec)
        if refusal := beyond_project_quota(self.usage, job_accelerators(spec)):
            refusals.append(refusal)
        return refusals

    def refusals(self, session: Session, spec: JobSpec) -> list[Refusal]:
        """Everything this deployment refuses of `spec`: its sizes, else the first of its sources; empty
        when it is admitted."""
        return self.sizing(spec) or source_refusals(session, self.project_id, spec)


def source_refusals(session: Session, project_id: uuid.UUID, spec: JobSpec) -> list[Refusal]:
    """The first of the job's data, code, requirements and teacher this deployment refuses, or []."""
    rules = DataAccessRules.from_env()

    def own_job(job_id: str) -> bool:
        return get_job(session, project_id, uuid.UUID(job_id)) is not None

    named = dict([("dataset.source", spec.dataset.source)] if spec.dataset is not None else [])
    if spec.code is not None:
        named[spec.code[0]] = spec.code[1]
    for name, source in (spec.program.channels if spec.program is not None else {}).items():
        named[f"program.channels.{name}"] = source  # a program's channels obey its data's rules
    for field, value in named.items():
        try:
            check_source(value, rules=rules, bucket=storage.bucket_name(), project_id=str(project_id), own_job=own_job)
        except SourceRefused as exc:
            return [Refusal(field, str(exc))]
    for i, line in enumerate(spec.program.requirements if spec.program is not None else []):
        try:
            rules.check_requirement(line)
        except SourceRefused as exc:
            return [Refusal(f"program.requirements.{i}", str(exc))]
    if problem := teacher_problem(session, project_id, spec):
        return [Refusal(*problem)]
    return []



class NotAdmitted(Exception):
    """A job (a sweep's trial, in the worker) this deployment refuses; the message names each field."""

    def __init__(self, refusals: list[Refusal]) -> None:
        super().__init__("; ".join(f"{r.field}: {r.reason}" for r in refusals))
        self.refusals = refusals
