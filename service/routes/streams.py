"""A job's logs and metrics as server-sent events (`?follow=true` on /logs and /metrics).

Events: `log` (data {"line", "source"}) or `metric` (one epoch's entry of metrics.json), each with an
`id` that resumes right after it (`Last-Event-ID`, or `?cursor=`); `status` when the job's status
changes (the first one says where it is); `end` with the terminal status, after everything the job
wrote has been sent; a `: ping` comment every PING_S so proxies keep an idle stream open.

A stream holds nothing while it waits: it is an async generator that sleeps on the event loop, and
each poll is one short transaction (the job's status) and one or two storage calls, run on a worker
thread and let go at once. The agent uploads its log about once a second when it grew
(worker/agent/status.py); each poll reads only the bytes past the cursor (ranged reads), as whole lines.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Protocol

from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from service.db import jobs as data
from service.db.session import transaction
from service.errors import ApiError
from trainjobs import storage
from trainjobs.states import JobStatus

log = logging.getLogger("trainjobs.api")

POLL_S = 0.5  # a following client sees a line at most this long after the agent's upload
PING_S = 15.0
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Tail(Protocol):
    def read(self, final: bool) -> list[tuple[str, dict[str, Any], str]]:
        """New (event, data, cursor after it) since the last read; `final`: the job has ended, so a
        last line without its newline is sent too."""
        ...


def bad_cursor(reason: str) -> ApiError:
    return ApiError(422, f"cursor: {reason}", "invalid_request", [{"field": "cursor", "reason": reason}])


class LogTail:
    """The job's log objects (one per attempt and task) past the cursor: {object name: bytes sent}."""

    def __init__(self, logs_uri: str, cursor: str | None):
        self.logs_uri, self.offsets = logs_uri.rstrip("/") + "/", self.decode(cursor)

    @staticmethod
    def decode(cursor: str | None) -> dict[str, int]:
        offsets: dict[str, int] = {}
        for part in (cursor or "").split(";"):
            if not part:
                continue
            name, sep, offset = part.rpartition("=")
            if not sep or not name or "/" in name or not offset.isdigit():
                raise bad_cursor(f"{cursor!r} is not a cursor this stream sent")
            offsets[name] = int(offset)
        return offsets

    def encode(self) -> str:
        return ";".join(f"{name}={offset}" for name, offset in sorted(self.offsets.items()))

    def read(self, final: bool) -> list[tuple[str, dict[str, Any], str]]:
        bucket, prefix = storage.split_uri(self.logs_uri)
        out: list[tuple[str, dict[str, Any], str]] = []
        for blob in sorted(storage.client().list_blobs(bucket, prefix=prefix), key=lambda b: b.name):
            name, start = blob.name.rsplit("/", 1)[-1], self.offsets.get(blob.name.rsplit("/", 1)[-1], 0)
            size = int(blob.size or 0)
            if size <= start:
                continue
            # The agent re-uploads a file it only appends to, so bytes past the cursor are new ones
            # whichever generation answers.
            chunk: bytes = blob.download_as_bytes(start=start, end=size - 1)
            position = start
            for piece in chunk.splitlines(keepends=True):
                if not piece.endswith((b"\n", b"\r")) and not final:
                    break  # half a line: the next upload completes it
                position += len(piece)
                self.offsets[name] = position
                line = piece.rstrip(b"\r\n").decode("utf-8", "replace")
                out.append(("log", {"line": line, "source": name}, self.encode()))
        return out


class MetricTail:
    """metrics.json's per-epoch entries past the cursor "<attempt>.<epoch>": a resumed attempt
    re-runs epochs after its checkpoint, and those are new entries."""

    def __init__(self, metrics_uri: str, cursor: str | None):
        self.metrics_uri, self.last = metrics_uri, self.decode(cursor)

    @staticmethod
    def decode(cursor: str | None) -> tuple[int, int]:
        if not cursor:
            return (-1, -1)
        attempt, sep, epoch = cursor.partition(".")
        if not sep or not attempt.isdigit() or not epoch.isdigit():
            raise bad_cursor(f"{cursor!r} is not a cursor this stream sent")
        return (int(attempt), int(epoch))

    def read(self, final: bool) -> list[tuple[str, dict[str, Any], str]]:
        doc = storage.read_json(self.metrics_uri)
        history = doc.get("history") if isinstance(doc, dict) else None
        out: list[tuple[str, dict[str, Any], str]] = []
        for entry in history if isinstance(history, list) else []:
            if not isinstance(entry, dict):
                continue
            key = (int(entry.get("attempt") or 0), int(entry.get("epoch") or 0))
            if key > self.last:
                self.last = key
                out.append(("metric", entry, f"{key[0]}.{key[1]}"))
        return out


def event(name: str, payload: dict[str, Any], event_id: str | None = None) -> str:
    head = f"event: {name}\n" + (f"id: {event_id}\n" if event_id is not None else "")
    return head + f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def _status(factory: sessionmaker[Session], project: uuid.UUID, job_id: uuid.UUID) -> JobStatus | None:
    with transaction(factory) as session:
        job = data.get_job(session, project, job_id)
        return None if job is None else JobStatus(job.status)


async def _events(factory: sessionmaker[Session], project: uuid.UUID, job_id: uuid.UUID,
                  tail: Tail) -> AsyncIterator[str]:
    last_status: JobStatus | None = None
    last_sent = time.monotonic()
    while True:
        try:
            # Status first: when it is terminal, everything the job wrote is in storage by now, so
            # the read that follows is the last one needed.
            status = await run_in_threadpool(_status, factory, project, job_id)
            if status is None:  # the row is gone
                yield event("end", {"status": last_status.value if last_status else None})
                return
            items = await run_in_threadpool(tail.read, status.terminal)
        except Exception as exc:  # an outage: keep the stream, try again at the next poll
            log.warning("job %s stream: %s: %s", job_id, type(exc).__name__, exc)
            items, status = [], last_status
        out = []
        if status is not None and status != last_status:
            out.append(event("status", {"status": status.value}))
            last_status = status
        out += [event(name, payload, cursor) for name, payload, cursor in items]
        if status is not None and status.terminal:
            out.append(event("end", {"status": status.value}))
        if out:
            yield "".join(out)
            last_sent = time.monotonic()
            if status is not None and status.terminal:
                return
        elif time.monotonic() - last_sent >= PING_S:
            yield ": ping\n\n"
            last_sent = time.monotonic()
        await asyncio.sleep(POLL_S)


def follow(factory: sessionmaker[Session], project: uuid.UUID, job_id: uuid.UUID, tail: Tail) -> StreamingResponse:
    return StreamingResponse(_events(factory, project, job_id, tail), media_type="text/event-stream",
                             headers=SSE_HEADERS)


def follow_logs(factory: sessionmaker[Session], project: uuid.UUID, job_id: uuid.UUID,
                cursor: str | None) -> StreamingResponse:
    tail = LogTail(storage.JobPaths.for_job(str(job_id)).logs, cursor)
    return follow(factory, project, job_id, tail)


def follow_metrics(factory: sessionmaker[Session], project: uuid.UUID, job_id: uuid.UUID,
                   cursor: str | None) -> StreamingResponse:
    tail = MetricTail(storage.JobPaths.for_job(str(job_id)).metrics, cursor)
    return follow(factory, project, job_id, tail)
