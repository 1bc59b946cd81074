"""Data functions for jobs. Each takes the session first, flushes, never commits."""

from __future__ import annotations

import base64
import json
import math
import uuid
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import (
    ColumnElement, Row, Select, Text, bindparam, cast, func, literal, literal_column, select, text, true, tuple_,
)
from sqlalchemy.dialects.postgresql import JSONB, array, insert
from sqlalchemy.orm import Session

from service.db.jobstate import NOTIFY_QUEUED, JobStatus, clean_text, transition
from service.db.models import JOB_STATUS, IdempotencyKey, Job, JobEvent
from trainjobs.states import CANCELLABLE


class IdempotencyConflict(Exception):
    """Same Idempotency-Key, different body."""


class JobFinished(Exception):
    """The job already ended; it cannot be cancelled."""


class BadCursor(ValueError):
    pass


def create_job(
    session: Session, project_id: uuid.UUID, spec: dict[str, Any], *, idempotency_key: str | None, request_hash: bytes,
    accelerators: int = 0,
) -> tuple[Row[Any], bool]:
    """Insert a queued job; with an idempotency key, return the first job made with it instead.
    `accelerators` is what it will count against its project's quota (trainjobs.spec.derived.job_accelerators).
    Returns (job, created): job is a row of PUBLIC_COLUMNS plus, for a created job, `ahead_jobs` and
    `ahead_accelerators` (quotas.Ahead: the project's queued jobs before it)."""
    if idempotency_key is not None and (job := _job_for_key(session, project_id, idempotency_key, request_hash)):
        return job, False
    # With a key, a savepoint, so that losing the race for it undoes only our job row, not the caller's
    # transaction. Without one there is no race to lose, and no savepoint's two round trips to pay.
    savepoint = session.begin_nested() if idempotency_key is not None else None
    job_id = uuid.uuid4()
    job = session.execute(_SUBMIT, {
        "id": job_id, "project": project_id, "name": spec["name"], "spec": orjson.dumps(spec).decode(),
        "labels": orjson.dumps(spec.get("labels", {})).decode(), "accelerators": accelerators,
        "event_reason": "submitted", "channel": NOTIFY_QUEUED, "notify_id": str(job_id),
    }).one()
    if idempotency_key is not None:
        # ON CONFLICT waits for a concurrent inserter of the same key to commit, then does nothing:
        # exactly one of two racing requests creates the job.
        won = session.execute(
            insert(IdempotencyKey).values(project_id=project_id, key=idempotency_key, request_hash=request_hash,
                                          job_id=job_id).on_conflict_do_nothing().returning(IdempotencyKey.key)
        ).first()
        assert savepoint is not None
        if won is None:
            savepoint.rollback()
            winner = _job_for_key(session, project_id, idempotency_key, request_hash)
            assert winner is not None
            return winner, False
        savepoint.commit()
    return job, True


def _job_for_key(session: Session, project_id: uuid.UUID, key: str, request_hash: bytes) -> Row[Any] | None:
    row = session.get(IdempotencyKey, (project_id, key))
    if row is None:
        return None
    if row.request_hash != request_hash:
        raise IdempotencyConflict(f"Idempotency-Key {key!r} was already used with a different request body")
    return get_job_row(session, project_id, row.job_id)


def get_job(session: Session, project_id: uuid.UUID, job_id: uuid.UUID, *, lock: bool = False) -> Job | None:
    stmt = select(Job).where(Job.id == job_id, Job.project_id == project_id)
    if lock:
        stmt = stmt.with_for_update()
    return session.scalars(stmt).first()


# What GET /v1/jobs/{id} and the list show (schemas.JobPublic), plus what wait reasons and cursors
# need; the JSONB columns as their JSON text, which the route embeds unparsed: a job's spec is most
# of its row, and parsing it into dicts only to write it out again was a third of a list's time.
# Table columns, not ORM attributes: a statement of plain columns skips the ORM's compile and
# loading steps (a fifth of a primary-key read's Python time).
_jobs = Job.__table__.c
_JSON_TEXT = ("spec", "labels", "metrics", "runtime", "machines", "advice")
PUBLIC_COLUMNS = [cast(c, Text).label(c.name) if c.name in _JSON_TEXT else c
                  for c in _jobs
                  if c.name not in ("project_id", "dataset_uri", "artifacts", "wait_reason", "driver_failures",
                                    "lease_owner", "lease_expires_at")]


def get_job_row(session: Session, project_id: uuid.UUID, job_id: uuid.UUID) -> Row[Any] | None:
    """The job's public columns (PUBLIC_COLUMNS), JSON columns as text; None when not this project's."""
    return session.execute(select(*PUBLIC_COLUMNS).where(_jobs.id == job_id, _jobs.project_id == project_id)).first()


def _submit_statement() -> Select[Any]:
    """A submit in one round trip: the job row, its first event, the NOTIFY that wakes a worker
    (delivered at commit, so a woken worker always finds the row), and how many of the project's
    queued jobs are ahead of it (quotas.Ahead, by the claim's order). Before (issue 12) this was the
    ORM's unit of work and four statements more."""
    values = {"id": bindparam("id"), "project_id": bindparam("project"), "name": bindparam("name"),
              "spec": cast(bindparam("spec", type_=Text), JSONB), "labels": cast(bindparam("labels", type_=Text), JSONB),
              "status": JobStatus.QUEUED, "attempt": 0, "accelerators": bindparam("accelerators")}
    job = insert(Job).values(values).returning(*_jobs).cte("job")
    event = insert(JobEvent).from_select(
        ["job_id", "to_status", "reason"],
        select(job.c.id, literal(JobStatus.QUEUED, JOB_STATUS), bindparam("event_reason"))).cte("event")
    queued = Job.__table__.alias("queued")
    ahead = select(func.count().label("ahead_jobs"),
                   func.coalesce(func.sum(queued.c.accelerators), 0).label("ahead_accelerators")).where(
        queued.c.project_id == job.c.project_id, queued.c.status == JobStatus.QUEUED,
        tuple_(queued.c.created_at, queued.c.id) < tuple_(job.c.created_at, job.c.id)).lateral("ahead")
    columns = [cast(job.c[c.name], Text).label(c.name) if c.name in _JSON_TEXT else job.c[c.name]
               for c in PUBLIC_COLUMNS]
    return (select(*columns, ahead.c.ahead_jobs, ahead.c.ahead_accelerators,
                   func.pg_notify(bindparam("channel"), bindparam("notify_id")).label("notified"))
            .select_from(job.join(ahead, true())).add_cte(event))


_SUBMIT = _submit_statement()


def encode_cursor(job: Job | Row[Any]) -> str:
    raw = json.dumps([job.created_at.isoformat(), str(job.id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        created, job_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        return datetime.fromisoformat(created), uuid.UUID(job_id)
    except (ValueError, TypeError) as exc:
        raise BadCursor("cursor is not one this API returned") from exc


# A label filter first walks at most this many of the project's newest jobs (in the statuses asked
# for) in index order; if they hold a whole page, that was the cheapest plan. Else the labels are
# rare in the project (however common elsewhere, which is all the planner's statistics on labels can
# see) and the GIN index ix_jobs_project_labels finds exactly the project's jobs carrying them:
# jsonb_path_ops hashes each whole path, so {project id: {key: value}} is one index entry per
# project, key and value (migration 0005; plans at 100k jobs in bench/README.md).
LABEL_WALK_ROWS = 5000


def labels_in_project(project_id: ColumnElement[Any] | uuid.UUID, labels: ColumnElement[Any] | dict[str, str],
                      ) -> ColumnElement[Any]:
    """The expression ix_jobs_project_labels indexes, {project id: labels}, for the jobs table or for
    a query's value."""
    if isinstance(labels, dict):
        return bindparam(None, {str(project_id): labels}, type_=JSONB)
    # jsonb_set is immutable, as an index expression must be (jsonb_build_object is only stable).
    return func.jsonb_set(literal_column("'{}'::jsonb"), array([cast(project_id, Text)]), labels, type_=JSONB)


def list_jobs(
    session: Session, project_id: uuid.UUID, *, statuses: list[JobStatus], labels: dict[str, str], limit: int,
    cursor: str | None,
) -> tuple[list[Row[Any]], str | None]:
    """Newest first, keyset-paginated on (created_at, id): a page boundary is a position in that order,
    so jobs submitted while a client pages appear before its cursor and never shift later pages.
    Rows of PUBLIC_COLUMNS."""
    where = [_jobs.project_id == project_id]
    if statuses:
        where.append(_jobs.status.in_(statuses))
    if cursor:
        created, job_id = decode_cursor(cursor)
        where.append(tuple_(_jobs.created_at, _jobs.id) < tuple_(created, job_id))
    newest_first = (_jobs.created_at.desc(), _jobs.id.desc())
    page = select(*PUBLIC_COLUMNS).order_by(*newest_first).limit(limit + 1)
    if not labels:
        jobs = list(session.execute(page.where(*where)).all())
    else:
        walk = select(_jobs.id, _jobs.created_at, _jobs.labels).where(*where).order_by(*newest_first) \
            .limit(LABEL_WALK_ROWS).subquery()
        hits = select(walk.c.id).where(walk.c.labels.contains(labels)) \
            .order_by(walk.c.created_at.desc(), walk.c.id.desc()).limit(limit + 1)
        jobs = list(session.execute(page.where(_jobs.id.in_(hits.scalar_subquery()))).all())
        if len(jobs) <= limit:
            indexed = labels_in_project(_jobs.project_id, _jobs.labels).contains(labels_in_project(project_id, labels))
            jobs = list(session.execute(page.where(*where, indexed)).all())
    next_cursor = encode_cursor(jobs[limit - 1]) if len(jobs) > limit else None
    return jobs[:limit], next_cursor


def request_cancel(session: Session, project_id: uuid.UUID, job_id: uuid.UUID, *,
                   reason: str = "cancel requested by user") -> Job | None:
    """Cancel is idempotent: a queued job ends at once; a started one goes CANCELLING and its worker
    tears the machine down. Raises JobFinished for a job that already succeeded or failed. A `reason`
    of the system's own (a sweep pruning its trial) is also the job's error, for its user to read."""
    job = get_job(session, project_id, job_id, lock=True)  # row lock: no worker transition interleaves
    if job is None:
        return None
    if job.status in (JobStatus.CANCELLING, JobStatus.CANCELLED):
        return job
    if job.status not in CANCELLABLE:
        raise JobFinished(f"job already {job.status.value}")
    target = JobStatus.CANCELLED if job.status == JobStatus.QUEUED else JobStatus.CANCELLING
    transition(session, job.id, job.status, target, reason=reason,
               error=None if reason == "cancel requested by user" else reason)
    session.refresh(job)
    return job


def list_events(session: Session, job_id: uuid.UUID) -> list[JobEvent]:
    return list(session.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)))


_PROGRESS_COLUMNS = frozenset({"progress", "metrics", "runtime", "dataset_uri", "error", "artifacts", "advice"})
_JSON_COLUMNS = frozenset({"metrics", "runtime", "artifacts", "advice"})


def record_progress(session: Session, job_id: uuid.UUID, owner: str, **fields: Any) -> None:
    """Copy what the agent reports (progress, metrics, runtime) or staging found (dataset) onto the row."""
    if unknown := fields.keys() - _PROGRESS_COLUMNS:  # column names go into the SQL text: whitelist them
        raise ValueError(f"not progress columns: {sorted(unknown)}")
    sets = ", ".join(
        f"{k} = CAST(:{k} AS jsonb)" if k in _JSON_COLUMNS else f"{k} = :{k}" for k in fields
    )
    params = {k: json.dumps(_finite(v), allow_nan=False) if k in _JSON_COLUMNS and v is not None else v
              for k, v in fields.items()}
    if params.get("error") is not None:
        params["error"] = clean_text(params["error"])
    session.execute(text(f"UPDATE jobs SET {sets}, updated_at = now() WHERE id = :id AND lease_owner = :owner"),
                    {**params, "id": job_id, "owner": owner})


def _finite(value: Any) -> Any:
    """`value` as JSON (and PostgreSQL's jsonb) can hold it: a loss that diverged to NaN or infinity is
    null (the stored metrics.json and history keep the agent's own words). Before, such a number failed
    every driver step of the job ("Token NaN is invalid") until the job failed for it."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def count_driver_failure(session: Session, job_id: uuid.UUID, owner: str) -> int | None:
    """One more driver step failed in a row; the count after it, or None if the job is not ours."""
    return session.execute(
        text("""UPDATE jobs SET driver_failures = driver_failures + 1
                WHERE id = :id AND lease_owner = :owner RETURNING driver_failures"""),
        {"id": job_id, "owner": owner},
    ).scalar()


def reset_driver_failures(session: Session, job_id: uuid.UUID, owner: str) -> None:
    """A driver step worked: the failures are no longer in a row."""
    session.execute(text("UPDATE jobs SET driver_failures = 0 WHERE id = :id AND lease_owner = :owner"),
                    {"id": job_id, "owner": owner})


def count_by_status(session: Session) -> dict[JobStatus, int]:
    """Jobs of every project by status, in one grouped query (the API's /metrics, at scrape time)."""
    rows = session.execute(select(Job.status, func.count()).group_by(Job.status))
    return {JobStatus(status): count for status, count in rows}
