"""API schemas (kept apart from the ORM tables)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

from service.db.jobstate import JobStatus


class JobPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    name: str
    status: JobStatus
    attempt: int
    spec: dict[str, Any]
    labels: dict[str, str]
    created_at: datetime
    updated_at: datetime
    staging_at: datetime | None
    provisioning_at: datetime | None
    running_at: datetime | None
    finished_at: datetime | None
    progress: float | None
    metrics: dict[str, Any] | None
    runtime: dict[str, Any] | None
    error: str | None
    # Each machine of each attempt: {name, attempt, requested_at, ready_at, first_report_at, deleted_at}
    # (ISO 8601 UTC); and when the first training step ran, in seconds after its machine was requested.
    machines: list[dict[str, Any]] | None = None
    first_step_at: datetime | None = None
    time_to_first_step_s: float | None = None
    # The advisor's (trainjobs/advice.py): [{rule, evidence: {name: number or text}, suggestion, expected_gain}].
    advice: list[dict[str, Any]] | None = None
    # Why a QUEUED job has not started, e.g. "project at quota: 8 of 8 running jobs"; computed when read.
    wait_reason: str | None = None


class JobList(BaseModel):
    jobs: list[JobPublic]
    next_cursor: str | None


# The hot routes (GET, list, submit) answer with JSON written straight from the row, not a
# JobPublic validated and dumped again (issue 12): same fields in the same order, JSONB columns
# embedded as the text PostgreSQL sent (orjson.Fragment), timestamps as pydantic writes them (UTC
# as "Z"). tests/integration/test_api_jobs.py checks the two agree, so a field added to JobPublic needs no change
# here as long as the row has a column of that name.
_JOB_FIELDS = tuple(name for name in JobPublic.model_fields if name != "wait_reason")


def job_public(row: Any, wait_reason: str | None) -> dict[str, Any]:
    """A JobPublic's JSON, as a dict for orjson, from a row of service.db.jobs.PUBLIC_COLUMNS (JSON
    columns as text)."""
    columns = row._mapping  # by name through the mapping: a fifth of getattr's time on a Row
    out = {name: columns[name] for name in _JOB_FIELDS}
    for name in ("spec", "labels", "metrics", "runtime", "machines", "advice"):
        if isinstance(out[name], str):
            out[name] = orjson.Fragment(out[name])
    out["wait_reason"] = wait_reason
    return out


def json_response(body: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body, option=orjson.OPT_UTC_Z), status_code, headers, media_type="application/json")


class EventPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    from_status: JobStatus | None
    to_status: JobStatus
    reason: str
    worker: str | None
    at: datetime


class EventList(BaseModel):
    events: list[EventPublic]


class ErrorDetail(BaseModel):
    field: str
    reason: str


class ErrorBody(BaseModel):
    """The one error shape for every 4xx and 5xx."""

    error: str  # machine-readable code, e.g. invalid_spec, not_found
    message: str
    details: list[ErrorDetail] = []


class ErrorResponse(BaseModel):
    error: ErrorBody


_ERROR_MEANINGS = {
    400: "The request body could not be parsed (not UTF-8, not multipart)",
    401: "Missing, unknown or revoked API key",
    404: "No such job (or artifact) in this project",
    409: "Conflicts with the job's state or an earlier request",
    413: "The request body is over its size limit",
    422: "Invalid request; `details` names each field and why",
    429: "Too many requests (e.g. unknown API keys from this address): retry after `Retry-After` seconds",
    503: "The database or storage is unavailable; retry later",
}
# Every /v1 route: the key is checked in the database, parameters are validated, and an address that
# sent too many unknown keys waits (service/middleware.py: ThrottleFailedAuth).
AUTHED = (401, 422, 429, 503)


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """A route's `responses=`: each error status it can answer, all in the ErrorResponse shape, so the
    OpenAPI document lists exactly what a client will see."""
    return {status: {"model": ErrorResponse, "description": _ERROR_MEANINGS[status]} for status in sorted(statuses)}


class ArtifactPublic(BaseModel):
    path: str  # relative to the job's artifacts/ directory
    size: int
    sha256: str
    uri: str  # gs://BUCKET/jobs/<id>/artifacts/<path>
    download_url: str  # a V4 signed URL (15 minutes) or an API path that streams it


class ArtifactList(BaseModel):
    artifacts: list[ArtifactPublic]
    signed: bool


class JobLogs(BaseModel):
    """One page of a job's logs (service/job_logs.py)."""

    text: str
    next_cursor: str | None = None  # more to read now: pass as ?cursor= for the next page
    end_cursor: str | None = None  # where this text ends: ?cursor= (or ?follow=true&cursor=) reads what comes after


class JobMetrics(BaseModel):
    """A job's per-epoch metrics so far: the entries of its metrics.json, which the agent rewrites each
    epoch (the job's code can write that file too: what is not an epoch's object is left out)."""

    epochs: list[dict[str, Any]]  # one object per epoch, oldest first: `epoch`, `attempt`, loss, val_*, ...


class DatasetPublic(BaseModel):
    dataset: str  # use as dataset.source in a job spec
    sha256: str
    size: int
    filename: str


class ModulePublic(BaseModel):
    module: str  # gs:// URI; use as model.module
    sha256: str
    size: int


class TrialPublic(BaseModel):
    """One trial of a sweep: its parameters, its job, and how it did."""

    number: int
    state: str  # RUNNING, COMPLETE, PRUNED, FAIL (trainjobs.states.TrialState)
    params: dict[str, Any]
    value: float | None  # the objective's final value (COMPLETE)
    curve: list[list[float]]  # [epoch, the objective's value] as the trial reported it
    job_id: uuid.UUID
    job_status: JobStatus
    job_error: str | None
    cost_usd: float
    accelerator_seconds: float
    created_at: datetime
    finished_at: datetime | None
    wait_reason: str | None = None  # its job's, while queued


class SweepPublic(BaseModel):
    id: uuid.UUID
    name: str
    status: str  # RUNNING, CANCELLING, SUCCEEDED, FAILED, CANCELLED (trainjobs.states.SweepStatus)
    spec: dict[str, Any]
    objective: dict[str, Any]  # {metric, goal}: the goal resolved
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    note: str | None  # why it stopped asking for trials, why it failed, or who cancelled it
    trials: dict[str, int]  # trials by state, and `planned` (the most it runs)
    best: TrialPublic | None  # the best completed trial so far
    cost_usd: float  # its trials' together
    accelerator_seconds: float
    wait_reason: str | None = None  # a queued trial's, when trials wait on the project's quota


class SweepList(BaseModel):
    sweeps: list[SweepPublic]


class TrialList(BaseModel):
    trials: list[TrialPublic]
