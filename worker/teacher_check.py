"""A distillation's teacher checked again at staging (service/db/teachers.py holds the rule): the teacher
may have been deleted or re-run since submit, a sweep's trial was never submitted through the API, and
only now are the student's classes known, from the staged dataset's manifest (which only the worker
writes). A refusal fails the job before any machine is paid for."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from service.db.models import Job
from service.db.session import transaction
from service.db.teachers import teacher_problem
from trainjobs import storage
from trainjobs.job_paths import dataset_manifest
from trainjobs.spec import JobSpec


def teacher_refusal(factory: sessionmaker[Session], job: Job, spec: JobSpec, dataset_uri: str) -> str | None:
    """Why the job's teacher cannot teach it ('field: reason'), or None (also when it names none)."""
    if spec.training.distillation is None:
        return None
    # A gs:// dataset has a manifest (a mem:// one, the in-memory cloud of tests, has none to read).
    manifest = storage.read_json(dataset_manifest(dataset_uri)) if dataset_uri.startswith("gs://") else None
    names = (manifest or {}).get("class_names") or None
    with transaction(factory) as session:
        problem = teacher_problem(session, job.project_id, spec, names)
    return None if problem is None else f"{problem[0]}: {problem[1]}"
