"""A job's logs and metrics as server-sent events (`?follow=true` on /logs and /metrics).

Events: `log` (data {"line", "source"}) or `metric` (one epoch's entry of metrics.json), each with an
`id` that resumes right after it (`Last-Event-ID`, or `?cursor=`); `status` when the job's status
changes (the first one says where it is); `end` with the terminal status, after everything the job
wrote has been sent; `error` ({"code", "message"}) when the stream must stop before that: the key
was revoked or deleted (`key_revoked`), or the job wrote a document larger than the API reads
(`too_large`); a `: ping` comment every PING_S so proxies keep an idle stream open.

A stream holds nothing while it waits: it is an async generator that sleeps on the event loop, and
each poll is one short transaction (the job's status, and every KEY_CHECK_S the caller's key) and
one or two storage calls, run on a worker thread and let go at once. The agent uploads its log about
once a second when it grew (agent/status.py); each poll reads only the bytes past the cursor
(ranged reads, at most a page of them), as whole lines, and metrics.json only when it changed. A
queued job writes nothing, so its stream polls every QUEUED_POLL_S. A key holds at most
TRAINJOBS_STREAMS_PER_KEY streams and a process TRAINJOBS_STREAMS_PER_PROCESS (stream_slots.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi.responses import Response, StreamingResponse
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from service import job_logs
from service.db import jobs as data
from service.db.projects import hash_key, project_for_key
from service.db.session import transaction
from service.errors import error_response
from service.stream_slots import RETRY_AFTER_S, SLOTS, Slot, TooManyStreams
from trainjobs import storage
from trainjobs.job_paths import JobPaths
from trainjobs.states import JobStatus

log = logging.getLogger("trainjobs.api")

POLL_S = 0.5  # a following client sees a line at most this long after the agent's upload
QUEUED_POLL_S = 5.0  # nothing to read before the job starts: thousands of waiting streams cost little
KEY_CHECK_S = 2.0  # a revoked key's stream ends within this, or QUEUED_POLL_S while the job waits
PING_S = 15.0
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
bad_cursor = job_logs.bad_cursor


class Tail(Protocol):
    def read(self, final: bool) -> list[tuple[str, dict[str, Any], str]]:
        """New (event, data, cursor after it) since the last read; `final`: the job has ended, so a
        last line without its newline is sent too."""
        ...

    @property
    def behind(self) -> bool:
        """The last read stopped at its limit: there is more to send now."""
        ...


class LogTail:
    """The job's log objects (one per attempt and task) past the cursor: {object name: bytes sent}."""

    def __init__(self, logs_uri: str, cursor: str | None):
        self.logs_uri, self.offsets = logs_uri, job_logs.decode_cursor(cursor)
        self.behind = False

    def read(self, final: bool) -> list[tuple[str, dict[str, Any], str]]:
        out: list[tuple[str, dict[str, Any], str]] = []
        left, self.behind = storage.LOG_PAGE_MAX_BYTES, False
        for blob in job_logs.log_objects(self.logs_uri):
            name, size = job_logs.object_name(blob), int(blob.size or 0)
            start = self.offsets.get(name, 0)
            if size <= start:
                continue
            if left <= 0:
                self.behind = True
                break
            capped = size - start > left
            chunk = job_logs.whole_lines(job_logs.read_range(blob, start, start + min(size - start, left)), capped)
            left -= len(chunk)
            self.behind = self.behind or capped
            position = start
            for piece in chunk.splitlines(keepends=True):
                if not piece.endswith((b"\n", b"\r")) and not final and not capped:
                    break  # half a line: the next upload completes it
                position += len(piece)
                self.offsets[name] = position
                line = piece.rstrip(b"\r\n").decode("utf-8", "replace")
                out.append(("log", {"line": line, "source": name}, job_logs.encode_cursor(self.offsets)))
        return out


class MetricTail:
    """metrics.json's per-epoch entries past the cursor "<attempt>.<epoch>": a resumed attempt
    re-runs epochs after its checkpoint, and those are new entries. The object is downloaded only
    when its generation or size changed since the last read (a metadata GET tells), within its cap."""

    behind = False

    def __init__(self, metrics_uri: str, cursor: str | None):
        self.metrics_uri, self.last = metrics_uri, self.decode(cursor)
        self.seen: tuple[Any, Any] | None = None  # (generation, size) last read

    @staticmethod
    def decode(cursor: str | None) -> tuple[int, int]:
        if not cursor:
            return (-1, -1)
        attempt, sep, epoch = cursor.partition(".")
        if not sep or not attempt.isdigit() or not epoch.isdigit():
            raise bad_cursor(f"{cursor!r} is not a cursor this stream sent")
        return (int(attempt), int(epoch))

    def read(self, final: bool) -> list[tuple[str, dict[str, Any], str]]:
        found = storage.get_blob(self.metrics_uri)
        if found is None or (found.generation, found.size) == self.seen:
            return []
        try:
            doc = storage.read_json_bounded(self.metrics_uri, storage.METRICS_MAX_BYTES, found=found)
        except ValueError:  # not JSON: the job's code wrote something else; nothing to send until it changes
            doc = None
        # Only once read: a read that failed (storage down) is tried again at the next poll.
        self.seen = (found.generation, found.size)
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


@dataclass(frozen=True)
class Follower:
    """Who follows which job: the key is checked again while the stream lasts."""

    project: uuid.UUID
    secret: str
    job_id: uuid.UUID


KEY_GONE = "key_gone"


def _poll(factory: sessionmaker[Session], who: Follower, check_key: bool) -> JobStatus | str | None:
    """The job's status (None: the row is gone), or KEY_GONE when the key no longer names the project."""
    with transaction(factory) as session:
        if check_key and project_for_key(session, who.secret) != who.project:
            return KEY_GONE
        job = data.get_job(session, who.project, who.job_id)
        return None if job is None else JobStatus(job.status)


async def _events(factory: sessionmaker[Session], who: Follower, tail: Tail, slot: Slot) -> AsyncIterator[str]:
    try:
        async for chunk in _poll_and_send(factory, who, tail):
            yield chunk
    finally:  # the client left, the job ended or the key went: the slot is free again
        slot.release()


async def _poll_and_send(factory: sessionmaker[Session], who: Follower, tail: Tail) -> AsyncIterator[str]:
    last_status: JobStatus | None = None
    last_sent = key_checked = time.monotonic()  # the route checked the key just now
    while True:
        check_key = time.monotonic() - key_checked >= KEY_CHECK_S
        status: JobStatus | None
        try:
            # Status first: when it is terminal, everything the job wrote is in storage by now, so
            # the read that follows is the last one needed.
            polled = await run_in_threadpool(_poll, factory, who, check_key)
            if check_key:
                key_checked = time.monotonic()
            if polled == KEY_GONE:
                yield event("error", {"code": "key_revoked", "message": "this API key was revoked or deleted"})
                return
            if polled is None:  # the row is gone
                yield event("end", {"status": last_status.value if last_status else None})
                return
            status = JobStatus(polled)
            items = await run_in_threadpool(tail.read, status.terminal)
        except storage.ObjectTooLarge as exc:
            yield event("error", {"code": "too_large", "message": str(exc)})
            return
        except Exception as exc:  # an outage: keep the stream, try again at the next poll
            log.warning("job %s stream: %s: %s", who.job_id, type(exc).__name__, exc)
            items, status, failed = [], last_status, True
        else:
            failed = False
        out = []
        if status is not None and status != last_status:
            out.append(event("status", {"status": status.value}))
            last_status = status
        out += [event(name, payload, cursor) for name, payload, cursor in items]
        ended = status is not None and status.terminal and not tail.behind and not failed  # failed: read again
        if ended and status is not None:
            out.append(event("end", {"status": status.value}))
        if out:
            yield "".join(out)
            last_sent = time.monotonic()
            if ended:
                return
        elif time.monotonic() - last_sent >= PING_S:
            yield ": ping\n\n"
            last_sent = time.monotonic()
        if failed or not tail.behind:  # behind: a page was read and more is waiting, so read on at once
            await asyncio.sleep(QUEUED_POLL_S if status == JobStatus.QUEUED else POLL_S)


def follow(factory: sessionmaker[Session], who: Follower, tail: Tail) -> Response:
    """The stream, or 429 when the key or this process already holds as many as it may."""
    try:
        slot = SLOTS.take(hash_key(who.secret))
    except TooManyStreams as exc:
        return error_response(429, "too_many_streams", str(exc), headers={"Retry-After": str(RETRY_AFTER_S)})
    stream = _events(factory, who, tail, slot)
    # A stream the server never starts (the client left before the first byte) never runs its
    # finally: the slot goes with the generator instead.
    weakref.finalize(stream, slot.release)
    return StreamingResponse(stream, media_type="text/event-stream", headers=SSE_HEADERS)


def follow_logs(factory: sessionmaker[Session], who: Follower, cursor: str | None) -> Response:
    return follow(factory, who, LogTail(JobPaths.for_job(str(who.job_id)).logs, cursor))


def follow_metrics(factory: sessionmaker[Session], who: Follower, cursor: str | None) -> Response:
    return follow(factory, who, MetricTail(JobPaths.for_job(str(who.job_id)).metrics, cursor))
