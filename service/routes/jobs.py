"""/v1/jobs: submit, read, list, cancel, events. Routes own the transaction."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Annotated

from fastapi import APIRouter, Header, Query, Response

from service.db import jobs as data
from service.db import quotas
from service.db.jobstate import JobStatus
from service.db.models import Job
from service.db.session import transaction
from service.deps import Factory, ProjectId
from service.errors import ApiError
from service.limits import JobSizeLimits, beyond_project_quota
from service.schemas import AUTHED, EventList, EventPublic, JobList, JobPublic, error_responses
from service.sources import check_job_sources
from trainjobs.spec import JobSpec, label_problem

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


def _public(job: Job, wait_reasons: dict[uuid.UUID, str]) -> JobPublic:
    out = JobPublic.model_validate(job)
    out.wait_reason = wait_reasons.get(job.id)
    return out


def _not_found(job_id: uuid.UUID) -> ApiError:
    # Another project's job answers exactly like a missing one: ids leak nothing.
    return ApiError(404, f"job {job_id} not found")


@router.post("", status_code=201, response_model=JobPublic, responses={
    200: {"model": JobPublic, "description": "Replayed: this Idempotency-Key already made the job"},
    **error_responses(*AUTHED, 400, 409, 413)})
def submit_job(
    spec: JobSpec, project: ProjectId, factory: Factory, response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> JobPublic:
    if refusals := JobSizeLimits.from_env().refusals(spec):
        raise ApiError(422, "; ".join(f"{d['field']}: {d['reason']}" for d in refusals), "invalid_spec", refusals)
    body = spec.model_dump(mode="json")
    request_hash = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest()
    accelerators = quotas.job_accelerators(spec)
    try:
        with transaction(factory) as session:
            check_job_sources(session, project, spec)
            usage = quotas.project_usage(session, project)
            if refusal := beyond_project_quota(usage, accelerators):
                raise ApiError(422, refusal["reason"], "over_quota", [refusal])
            job, created = data.create_job(session, project, body, idempotency_key=idempotency_key,
                                           request_hash=request_hash, accelerators=accelerators)
            out = _public(job, quotas.wait_reasons(session, project, [job], usage))
    except data.IdempotencyConflict as exc:
        raise ApiError(409, str(exc), "idempotency_conflict") from exc
    if not created:
        response.status_code = 200
        response.headers["Idempotent-Replayed"] = "true"
    response.headers["Location"] = f"/v1/jobs/{out.id}"
    return out


@router.get("/{job_id}", response_model=JobPublic, responses=error_responses(*AUTHED, 404))
def get_job(job_id: uuid.UUID, project: ProjectId, factory: Factory) -> JobPublic:
    with transaction(factory) as session:
        job = data.get_job(session, project, job_id)
        if job is None:
            raise _not_found(job_id)
        return _public(job, quotas.wait_reasons(session, project, [job]))


@router.get("", response_model=JobList, responses=error_responses(*AUTHED))
def list_jobs(
    project: ProjectId, factory: Factory,
    status: Annotated[list[JobStatus] | None, Query()] = None,
    label: Annotated[list[str] | None, Query(description="key=value; repeat to require several")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> JobList:
    labels: dict[str, str] = {}
    for item in label or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ApiError(422, f"label filter {item!r} must be key=value", "invalid_request",
                           [{"field": "label", "reason": "expected key=value"}])
        # A filter no job's labels could match is a mistake, and some (NUL) PostgreSQL cannot even compare.
        if problem := label_problem(key, value):
            raise ApiError(422, f"label filter: {problem}", "invalid_request", [{"field": "label", "reason": problem}])
        labels[key] = value
    try:
        with transaction(factory) as session:
            jobs, next_cursor = data.list_jobs(session, project, statuses=status or [], labels=labels, limit=limit,
                                               cursor=cursor)
            reasons = quotas.wait_reasons(session, project, jobs)
            return JobList(jobs=[_public(j, reasons) for j in jobs], next_cursor=next_cursor)
    except data.BadCursor as exc:
        raise ApiError(422, str(exc), "invalid_request", [{"field": "cursor", "reason": str(exc)}]) from exc


@router.post("/{job_id}/cancel", status_code=202, response_model=JobPublic,
             responses=error_responses(*AUTHED, 404, 409))
def cancel_job(job_id: uuid.UUID, project: ProjectId, factory: Factory) -> JobPublic:
    try:
        with transaction(factory) as session:
            job = data.request_cancel(session, project, job_id)
            if job is None:
                raise _not_found(job_id)
            return JobPublic.model_validate(job)
    except data.JobFinished as exc:
        raise ApiError(409, f"job {job_id} cannot be cancelled: {exc}", "job_finished") from exc


@router.get("/{job_id}/events", response_model=EventList, responses=error_responses(*AUTHED, 404))
def job_events(job_id: uuid.UUID, project: ProjectId, factory: Factory) -> EventList:
    with transaction(factory) as session:
        if data.get_job(session, project, job_id) is None:
            raise _not_found(job_id)
        return EventList(events=[EventPublic.model_validate(e) for e in data.list_events(session, job_id)])
