"""API schemas (kept apart from the ORM tables)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

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


class JobList(BaseModel):
    jobs: list[JobPublic]
    next_cursor: str | None


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
