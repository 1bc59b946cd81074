"""Submit-time checks of what a job names as its data and code (the rules: trainjobs/source_rules.py).
Another project's uploads or jobs, other folders of our bucket, buckets the operator does not list,
host paths the operator does not allow and URLs the worker would not fetch are refused before
anything is stored: a 422 naming the field. The worker applies the same rules again at staging. A
program's requirement that names its own URL is held to the operator's hosts and folders here (the
spec alone cannot read the deployment's settings). A distillation's teacher job is named too
(service/db/teachers.py)."""

from __future__ import annotations

import uuid

from sqlalchemy.orm import Session

from service.db.jobs import get_job
from service.db.teachers import teacher_problem
from service.errors import ApiError
from trainjobs import storage
from trainjobs.source_rules import DataAccessRules, SourceRefused, check_source
from trainjobs.spec import JobSpec


def check_job_sources(session: Session, project_id: uuid.UUID, spec: JobSpec) -> None:
    rules = DataAccessRules.from_env()

    def own_job(job_id: str) -> bool:
        return get_job(session, project_id, uuid.UUID(job_id)) is not None

    named = dict([("dataset.source", spec.dataset.source)] if spec.dataset is not None else [])
    if spec.code is not None:
        named[spec.code[0]] = spec.code[1]
    for field, value in named.items():
        try:
            check_source(value, rules=rules, bucket=storage.bucket_name(), project_id=str(project_id), own_job=own_job)
        except SourceRefused as exc:
            raise _refused(field, str(exc)) from None
    for i, line in enumerate(spec.program.requirements if spec.program is not None else []):
        try:
            rules.check_requirement(line)
        except SourceRefused as exc:
            raise _refused(f"program.requirements.{i}", str(exc)) from None
    if problem := teacher_problem(session, project_id, spec):
        raise _refused(*problem)


def _refused(field: str, reason: str) -> ApiError:
    return ApiError(422, f"invalid request: {field}: {reason}", "invalid_spec", [{"field": field, "reason": reason}])
