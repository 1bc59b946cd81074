"""/v1/jobs: submit, read, list, cancel, events. Routes own the transaction."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Query, Request, Response

from service.db import jobs as data
from service.db import quotas
from service.db.jobstate import JobStatus
from service.db.admission import Admission
from service.deps import ApiSecret, Factory, ReadFactory, SessionFactory, in_db_thread, project_transaction
from service.errors import ApiError, refused
from service.request_body import ParsedOffLoop, deferred, validated
from service.schemas import (
    AUTHED, EventList, EventPublic, JobList, JobPublic, error_responses, job_public, json_response,
)
from trainjobs.spec import JobSpec, label_problem
from trainjobs.spec.derived import job_accelerators

# Each route checks its key in the transaction it works in (project_transaction): one thread hop and
# one transaction per request, on the API's few database threads, first come first served
# (deps.in_db_thread). KeyCheckedFirst keeps an unknown key a 401 before a 422; ParsedOffLoop (one) parses
# and validates a submitted spec on the API's parsing threads, off the event loop (service/request_body.py).
router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=ParsedOffLoop)
JobSpecBody = Annotated[Any, Body(), deferred(JobSpec)]


def _not_found(job_id: uuid.UUID) -> ApiError:
    # Another project's job answers exactly like a missing one: ids leak nothing.
    return ApiError(404, f"job {job_id} not found")


@router.post("", status_code=201, response_model=JobPublic, responses={
    200: {"model": JobPublic, "description": "Replayed: this Idempotency-Key already made the job"},
    **error_responses(*AUTHED, 400, 409, 413)})
async def submit_job(
    request: Request, body: JobSpecBody, secret: ApiSecret, factory: Factory,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> Response:
    spec = await validated(request, JobSpec, body)
    return await in_db_thread(request, _submit, spec, secret, factory, idempotency_key)


def _submit(spec: JobSpec, secret: str, factory: SessionFactory, idempotency_key: str | None) -> Response:
    body = spec.model_dump(mode="json")
    # What a replay is compared by, as stored: keep its form. Only a keyed submit can be replayed.
    request_hash = b"" if idempotency_key is None else \
        hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest()
    accelerators = job_accelerators(spec)
    try:
        with project_transaction(factory, secret) as (project, session):
            admission = Admission.load(session, project)
            if refusals := admission.refusals(session, spec):
                raise refused(refusals)
            usage = admission.usage
            job, created = data.create_job(session, project, body, idempotency_key=idempotency_key,
                                           request_hash=request_hash, accelerators=accelerators)
            if created:  # the insert counted the queued jobs ahead of it
                reason = usage.wait_reason(accelerators, quotas.Ahead(job.ahead_jobs, job.ahead_accelerators))
            else:
                reason = quotas.wait_reasons(session, project, [job], usage).get(job.id)
            out = job_public(job, reason)
    except data.IdempotencyConflict as exc:
        raise ApiError(409, str(exc), "idempotency_conflict") from exc
    headers = {"Location": f"/v1/jobs/{job.id}"}
    if not created:
        headers["Idempotent-Replayed"] = "true"
    return json_response(out, 201 if created else 200, headers)


@router.get("/{job_id}", response_model=JobPublic, responses=error_responses(*AUTHED, 404))
async def get_job(request: Request, job_id: uuid.UUID, secret: ApiSecret, factory: ReadFactory) -> Response:
    return await in_db_thread(request, _get, job_id, secret, factory)


def _get(job_id: uuid.UUID, secret: str, factory: SessionFactory) -> Response:
    with project_transaction(factory, secret) as (project, session):
        job = data.get_job_row(session, project, job_id)
        if job is None:
            raise _not_found(job_id)
        out = job_public(job, quotas.wait_reasons(session, project, [job]).get(job.id))
    return json_response(out)


@router.get("", response_model=JobList, responses=error_responses(*AUTHED))
async def list_jobs(
    request: Request, secret: ApiSecret, factory: ReadFactory,
    status: Annotated[list[JobStatus] | None, Query()] = None,
    label: Annotated[list[str] | None, Query(description="key=value; repeat to require several")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
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
    return await in_db_thread(request, _list, secret, factory, status or [], labels, limit, cursor)


def _list(secret: str, factory: SessionFactory, statuses: list[JobStatus], labels: dict[str, str], limit: int,
          cursor: str | None) -> Response:
    try:
        with project_transaction(factory, secret) as (project, session):
            jobs, next_cursor = data.list_jobs(session, project, statuses=statuses, labels=labels, limit=limit,
                                               cursor=cursor)
            reasons = quotas.wait_reasons(session, project, jobs)
    except data.BadCursor as exc:
        raise ApiError(422, str(exc), "invalid_request", [{"field": "cursor", "reason": str(exc)}]) from exc
    return json_response({"jobs": [job_public(j, reasons.get(j.id)) for j in jobs], "next_cursor": next_cursor})


@router.post("/{job_id}/cancel", status_code=202, response_model=JobPublic,
             responses=error_responses(*AUTHED, 404, 409))
async def cancel_job(request: Request, job_id: uuid.UUID, secret: ApiSecret, factory: Factory) -> JobPublic:
    return await in_db_thread(request, _cancel, job_id, secret, factory)


def _cancel(job_id: uuid.UUID, secret: str, factory: SessionFactory) -> JobPublic:
    try:
        with project_transaction(factory, secret) as (project, session):
            job = data.request_cancel(session, project, job_id)
            if job is None:
                raise _not_found(job_id)
        return JobPublic.model_validate(job)
    except data.JobFinished as exc:
        raise ApiError(409, f"job {job_id} cannot be cancelled: {exc}", "job_finished") from exc


@router.get("/{job_id}/events", response_model=EventList, responses=error_responses(*AUTHED, 404))
async def job_events(request: Request, job_id: uuid.UUID, secret: ApiSecret, factory: ReadFactory) -> EventList:
    return await in_db_thread(request, _events, job_id, secret, factory)


def _events(job_id: uuid.UUID, secret: str, factory: SessionFactory) -> EventList:
    with project_transaction(factory, secret) as (project, session):
        if data.get_job(session, project, job_id) is None:
            raise _not_found(job_id)
        return EventList(events=[EventPublic.model_validate(e) for e in data.list_events(session, job_id)])
