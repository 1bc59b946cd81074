"""training.distillation's teacher (issue 23): which earlier job a job may learn from. One rule, read at
submit (service/db/admission.py, for jobs, sweeps and each trial alike) and again by the worker at staging
(worker/driver.py), when the student's classes are known from its staged data.

A teacher is a job of the same project that SUCCEEDED, trained by the managed trainer (its artifacts
are a SavedModel whose outputs labels.json explains) on the same task, with artifacts. Another
project's job reads exactly like a missing one: ids leak nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from service.db.jobs import get_job
from service.db.jobstate import JobStatus
from trainjobs.spec import JobSpec, parse_stored

FIELD = "training.distillation.teacher_job"


def teacher_problem(session: Session, project_id: uuid.UUID, spec: JobSpec,
                    class_names: Sequence[str] | None = None) -> tuple[str, str] | None:
    """(field, reason) when the spec's teacher cannot teach it, else None (also when it names none).
    `class_names`: the student's classes, once its data is staged."""
    if spec.training.distillation is None:
        return None
    teacher_id = spec.training.distillation.teacher_job
    teacher = get_job(session, project_id, uuid.UUID(teacher_id))
    if teacher is None:
        return FIELD, f"no job {teacher_id} in this project"
    if teacher.status != JobStatus.SUCCEEDED:
        return FIELD, f"job {teacher_id} is {teacher.status.value}: a teacher is a job that SUCCEEDED"
    taught = parse_stored(teacher.spec)
    if taught.model is None:
        return FIELD, f"job {teacher_id} ran a program: a teacher is a job of the managed trainer (model)"
    if taught.task != spec.task:
        return FIELD, f"job {teacher_id} learned task {taught.task}, this job's task is {spec.task}"
    if not any(a.get("path", "").startswith("saved_model/") for a in teacher.artifacts or []):
        return FIELD, f"job {teacher_id} has no exported SavedModel"
    if class_names is not None:
        theirs = _class_names(teacher.runtime)
        if theirs is not None and list(theirs) != list(class_names):
            return FIELD, (f"job {teacher_id} learned other classes: {_listed(theirs)}; this job's data has "
                           f"{_listed(class_names)} (the same names, in the same order, are needed)")
    return None


def _class_names(runtime: dict[str, Any] | None) -> list[str] | None:
    """The classes the teacher's agent recorded of its data (runtime.dataset, agent/data.py summary)."""
    names = ((runtime or {}).get("dataset") or {}).get("class_names")
    return [str(n) for n in names] if isinstance(names, list) else None


def _listed(names: Sequence[str], most: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:most])
    return f"{len(names)} classes ({shown}{', ...' if len(names) > most else ''})"
