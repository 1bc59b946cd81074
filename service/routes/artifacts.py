"""A job's outputs in GCS: artifacts (listing + download), logs, per-epoch metrics."""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Header, Query
from fastapi.responses import Response

from service import job_logs as job_log_pages
from service.artifact_download import verified_download
from service.db import jobs as data
from service.db.session import transaction
from service.deps import ApiSecret, Factory, ProjectId
from service.errors import ApiError
from service.routes import streams
from service.schemas import AUTHED, ArtifactList, ArtifactPublic, JobLogs, JobMetrics, error_responses
from trainjobs import storage
from trainjobs.job_paths import ARTIFACT_MANIFEST, JobPaths

router = APIRouter(prefix="/v1/jobs", tags=["artifacts"])
SIGNED_URL_TTL = timedelta(minutes=15)


def _paths(factory: Factory, project: uuid.UUID, job_id: uuid.UUID) -> JobPaths:
    with transaction(factory) as session:
        if data.get_job(session, project, job_id) is None:
            raise ApiError(404, f"job {job_id} not found")
    return JobPaths.for_job(str(job_id))


def _artifacts(factory: Factory, project: uuid.UUID, job_id: uuid.UUID) -> tuple[JobPaths, list[dict[str, Any]]]:
    """The job's paths and its artifacts as the worker copied them from the agent's manifest when the
    job succeeded (none before): the job's code cannot change that copy; what it could change in
    storage is checked against it (service/artifact_download.py)."""
    with transaction(factory) as session:
        job = data.get_job(session, project, job_id)
        if job is None:
            raise ApiError(404, f"job {job_id} not found")
        items = list(job.artifacts or [])
    return JobPaths.for_job(str(job_id)), items


def safe_artifact_path(path: str) -> str:
    """A relative path that stays inside the job's artifacts/ directory, or ApiError 400."""
    norm = posixpath.normpath(path)
    if path.startswith("/") or "\\" in path or norm.startswith("..") or norm in (".", "") or "\x00" in path:
        raise ApiError(400, f"artifact path {path!r} leaves the job's artifact directory", "bad_path")
    return norm


def _signer(paths: JobPaths) -> Callable[[str], str] | None:
    """Signed V4 URLs when the credentials can sign (a service account key, or IAM signBlob);
    None when they cannot (the emulator's anonymous credentials, user credentials)."""
    def sign(rel: str) -> str:
        url: str = storage.blob(paths.artifact(rel)).generate_signed_url(
            version="v4", expiration=SIGNED_URL_TTL, method="GET")
        return url
    try:
        sign(ARTIFACT_MANIFEST)
    except Exception:  # AttributeError / google.auth errors: these credentials cannot sign
        return None
    return sign


@router.get("/{job_id}/artifacts", response_model=ArtifactList, responses=error_responses(*AUTHED, 404))
def list_artifacts(job_id: uuid.UUID, project: ProjectId, factory: Factory) -> ArtifactList:
    paths, items = _artifacts(factory, project, job_id)
    sign = _signer(paths) if items else None
    out = []
    for item in items:
        rel = safe_artifact_path(item["path"])
        url = sign(rel) if sign else f"/v1/jobs/{job_id}/artifacts/{rel}"
        out.append(ArtifactPublic(path=rel, size=item["size"], sha256=item["sha256"],
                                  uri=paths.artifact(rel), download_url=url))
    return ArtifactList(artifacts=out, signed=sign is not None)


@router.get("/{job_id}/artifacts/{path:path}", response_class=Response, responses={
    200: {"content": {"application/octet-stream": {}}, "description": "The artifact's bytes"},
    **error_responses(*AUTHED, 400, 404, 409)})
def download_artifact(job_id: uuid.UUID, path: str, project: ProjectId, factory: Factory) -> Response:
    rel = safe_artifact_path(path)
    paths, items = _artifacts(factory, project, job_id)
    if (item := next((i for i in items if i["path"] == rel), None)) is None:
        raise ApiError(404, f"job {job_id} has no artifact {rel!r}")
    return verified_download(storage.blob(paths.artifact(rel)), item, posixpath.basename(rel))


# ?follow=true answers with server-sent events until the job ends (service/routes/streams.py). It is
# left out of the OpenAPI document: a generated client (or the fuzzer) would wait on it forever.
FOLLOW = Query(default=False, include_in_schema=False)
STREAM_CURSOR = Query(default=None, max_length=4096, include_in_schema=False)
LAST_EVENT_ID = Header(default=None, max_length=4096, include_in_schema=False)


def _too_large(exc: storage.ObjectTooLarge) -> ApiError:
    return ApiError(422, f"{exc}: the job's code wrote it, and the API does not read it whole", "too_large")


@router.get("/{job_id}/logs", response_model=JobLogs, responses=error_responses(*AUTHED, 404))
def job_logs(job_id: uuid.UUID, project: ProjectId, secret: ApiSecret, factory: Factory,
             tail: int | None = Query(default=None, ge=1, le=100_000, description="last N lines"),
             limit_bytes: int = Query(default=storage.LOG_PAGE_MAX_BYTES, ge=1, le=storage.LOG_PAGE_MAX_BYTES,
                                      description="at most this many bytes of log in this page"),
             cursor: str | None = Query(default=None, max_length=4096,
                                        description="next_cursor (or end_cursor) of an earlier page"),
             follow: bool = FOLLOW, last_event_id: str | None = LAST_EVENT_ID) -> JobLogs | Response:
    """The job's logs a page at a time: follow `next_cursor` until it is null; `end_cursor` reads on
    later from where the text ends. With ?tail=N, the last N lines (within one page of bytes). With
    ?follow=true, `text/event-stream` until the job ends (README: Watching a job)."""
    paths = _paths(factory, project, job_id)
    if follow:
        return streams.follow_logs(factory, streams.Follower(project, secret, job_id), last_event_id or cursor)
    page = job_log_pages.log_tail(paths.logs, tail, limit_bytes) if tail else \
        job_log_pages.log_page(paths.logs, cursor, limit_bytes)
    return JobLogs(text=page.text, next_cursor=page.next_cursor, end_cursor=page.end_cursor)


@router.get("/{job_id}/metrics", response_model=JobMetrics, responses=error_responses(*AUTHED, 404, 422))
def job_metrics(job_id: uuid.UUID, project: ProjectId, secret: ApiSecret, factory: Factory, follow: bool = FOLLOW,
                cursor: str | None = STREAM_CURSOR, last_event_id: str | None = LAST_EVENT_ID) -> JobMetrics | Response:
    """Per-epoch metrics so far (loss, accuracy, examples/s, step time, input-wait fraction), one
    object per epoch in `epochs`; with ?follow=true, `text/event-stream` with one event per epoch until
    the job ends. A metrics.json over storage.METRICS_MAX_BYTES (the job's code can write it) is a 422,
    not read."""
    paths = _paths(factory, project, job_id)
    if follow:
        return streams.follow_metrics(factory, streams.Follower(project, secret, job_id), last_event_id or cursor)
    try:
        doc = storage.read_json_bounded(paths.metrics, storage.METRICS_MAX_BYTES)
    except storage.ObjectTooLarge as exc:
        raise _too_large(exc) from None
    except (ValueError, RecursionError) as exc:  # the job's code wrote something that is not JSON there, or
        # JSON nested deeper than the parser follows (it raises RecursionError, a 500 otherwise)
        raise ApiError(422, f"the job's metrics.json is not JSON ({exc})", "not_json") from None
    return job_metrics_of(doc)


def job_metrics_of(doc: Any) -> JobMetrics:
    """metrics.json ({attempt, epochs, initial_epoch, history: [...]}: agent/run.py, agent/program.py) as
    the API answers it: its history, the entries the stream sends one by one (service/routes/streams.py).
    Until issue 37 the whole document was answered under `epochs`, where clients expect the list."""
    history = doc.get("history") if isinstance(doc, dict) else None
    return JobMetrics(epochs=[e for e in history if isinstance(e, dict) and _nested_within(e, EPOCH_MAX_DEPTH)]
                      if isinstance(history, list) else [])


# An epoch's entry is names and numbers (a record or two inside at most): one nested deeper is the job's
# code's, and one past 255 levels fails the response's serialization (pydantic's limit), a 500.
EPOCH_MAX_DEPTH = 16


def _nested_within(value: Any, depth: int) -> bool:
    """No list or object in value lies more than `depth` levels inside it."""
    todo = [(value, 0)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, dict | list):
            if level >= depth:
                return False
            todo.extend((x, level + 1) for x in (item.values() if isinstance(item, dict) else item))
    return True
