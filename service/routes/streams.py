"""A job's logs and metrics as server-sent events (`?follow=true` on /logs and /metrics).

Events: `log` (data {"line", "source"}) or `metric` (one epoch's entry of metrics.json), each with an
`id` that resumes right after it (`Last-Event-ID`, or `?cursor=`); `status` when the job's status
changes (the first one says where it is); `end` with the terminal status, after everything the job
wrote has been sent; `error` ({"code", "message"}) when the stream must stop before that: the key
was revoked or deleted (`key_revoked`), or the job wrote a document larger than the API reads
(`too_large`); a `: ping` comment every PING_S so proxies keep an idle stream open.

A stream holds nothing while it waits: it is an async generator that sleeps on the event loop. The
polling is shared (service/stream_feeds.py): one feed per job and kind in this process reads the
job's status (one short transaction) and its storage once per poll, for every follower; each follower
checks its own key every KEY_CHECK_S (one short transaction) and takes from the feed what is new to
it. The agent uploads its log about once a second when it grew (agent/status.py); each poll lists the
log objects and reads only the bytes past those already read (ranged), and metrics.json only when it
changed. A queued job writes nothing, so its feed polls every QUEUED_POLL_S. A key holds at most
TRAINJOBS_STREAMS_PER_KEY streams and a process TRAINJOBS_STREAMS_PER_PROCESS (stream_slots.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi.responses import Response, StreamingResponse
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from service import job_logs
from service.db.projects import hash_key, project_for_key
from service.db.session import transaction
from service.errors import error_response
from service.stream_feeds import FEEDS, Feed, FeedKey, Update
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
        """New (event, data, cursor after it) for this follower since its last read; `final`: the job
        has ended, so a last line without its newline is sent too."""
        ...

    @property
    def behind(self) -> bool:
        """The last read stopped at its limit: there is more to send now."""
        ...


@dataclass(frozen=True)
class LogView:
    """The job's log objects as the feed last listed them, in name order: (name, size, blob), and the
    bytes the feed read of each, {name: (offset of the first, bytes)}, up to the listed size."""

    listing: tuple[tuple[str, int, Any], ...] = ()
    windows: dict[str, tuple[int, bytes]] = field(default_factory=dict)


# How much of the log objects' newest bytes the feed keeps for its followers, shared by the objects it
# lists (a job's code can write many), at least LOG_WINDOW_MIN_BYTES each: a follower further behind
# reads the rest from storage itself. An agent uploads its log about once a second; a window is far
# more than it writes in that time.
LOG_WINDOW_BYTES = 256 << 10
LOG_WINDOW_MIN_BYTES = 4 << 10


class LogSource:
    """The feed's side of a log stream: one listing per poll and one ranged read per grown object, of
    the bytes past those already read. A follower starting at a cursor reads what lies before the
    window from storage itself (as each stream did before), then takes the rest from the window."""

    def __init__(self, logs_uri: str):
        self.logs_uri, self.view, self.behind = logs_uri, LogView(), False
        self._listed = False

    def refresh(self) -> bool:
        old, listing, windows, changed, behind = self.view, [], {}, False, False
        blobs = job_logs.log_objects(self.logs_uri)
        cap = max(LOG_WINDOW_MIN_BYTES, LOG_WINDOW_BYTES // max(1, len(blobs)))
        for blob in blobs:
            name, size = job_logs.object_name(blob), int(blob.size or 0)
            # An object already there when the feed started is read by each follower from its own
            # cursor; one that appears later is new to every follower, from its first byte.
            base, data = old.windows.get(name, (size if not self._listed else 0, b""))
            if size < base + len(data):  # replaced by a shorter one (the job's code can): start over
                base, data, changed = size, b"", True
            if size > base + len(data):
                stop = min(size, base + len(data) + cap)
                data += job_logs.read_range(blob, base + len(data), stop)
                behind, changed = behind or stop < size, True
            if len(data) > cap:
                base, data = base + len(data) - cap, data[-cap:]
            windows[name] = (base, data)
            listing.append((name, base + len(data), blob))
        # Swapped whole: followers read the view on other threads while the next one is built.
        self.view, self.behind, self._listed = LogView(tuple(listing), windows), behind, True
        return changed or len(listing) != len(old.listing)


class LogTail:
    """One follower's place in the job's log objects (one per attempt and task): {object name: bytes sent}."""

    def __init__(self, source: LogSource, offsets: dict[str, int]):
        self.source, self.offsets = source, offsets
        self.behind = False

    def read(self, final: bool) -> list[tuple[str, dict[str, Any], str]]:
        out: list[tuple[str, dict[str, Any], str]] = []
        left, self.behind = storage.LOG_PAGE_MAX_BYTES, False
        view = self.source.view
        for name, size, blob in view.listing:
            start = self.offsets.get(name, 0)
            if size <= start:
                continue
            if left <= 0:
                self.behind = True
                break
            capped = size - start > left
            stop = start + min(size - start, left)
            base, window = view.windows.get(name, (size, b""))
            raw = window[start - base:stop - base] if base <= start else job_logs.read_range(blob, start, stop)
            chunk = job_logs.whole_lines(raw, capped)
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


class MetricSource:
    """The feed's side of a metric stream: metrics.json's history, downloaded only when its generation or
    size changed since the last read (a metadata GET tells), within its cap."""

    behind = False

    def __init__(self, metrics_uri: str):
        self.metrics_uri = metrics_uri
        self.history: tuple[Any, ...] = ()
        self.seen: tuple[Any, Any] | None = None  # (generation, size) last read

    def refresh(self) -> bool:
        found = storage.get_blob(self.metrics_uri)
        if found is None or (found.generation, found.size) == self.seen:
            return False
        try:
            doc = storage.read_json_bounded(self.metrics_uri, storage.METRICS_MAX_BYTES, found=found)
        except ValueError:  # not JSON: the job's code wrote something else; nothing to send until it changes
            doc = None
        # Only once read: a read that failed (storage down) is tried again at the next poll.
        self.seen = (found.generation, found.size)
        history = doc.get("history") if isinstance(doc, dict) else None
        self.history = tuple(history) if isinstance(history, list) else ()
        return True


class MetricTail:
    """One follower's place in metrics.json's per-epoch entries: the cursor "<attempt>.<epoch>" (a
    resumed attempt re-runs epochs after its checkpoint, and those are new entries)."""

    behind = False

    def __init__(self, source: MetricSource, last: tuple[int, int]):
        self.source, self.last = source, last

    @staticmethod
    def decode(cursor: str | None) -> tuple[int, int]:
        if not cursor:
            return (-1, -1)
        attempt, sep, epoch = cursor.partition(".")
        if not sep or not attempt.isdigit() or not epoch.isdigit():
            raise bad_cursor(f"{cursor!r} is not a cursor this stream sent")
        return (int(attempt), int(epoch))

    def read(self, final: bool) -> list[tuple[str, dict[str, Any], str]]:
        out: list[tuple[str, dict[str, Any], str]] = []
        for entry in self.source.history:
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


def _key_still_valid(factory: sessionmaker[Session], who: Follower) -> bool:
    with transaction(factory) as session:
        return project_for_key(session, who.secret) == who.project


def _interval(status: JobStatus | None) -> float:
    return QUEUED_POLL_S if status == JobStatus.QUEUED else POLL_S  # read at each poll: tests change them


async def _events(factory: sessionmaker[Session], who: Follower, kind: type[LogSource | MetricSource],
                  make_tail: Callable[[Any], Tail], slot: Slot) -> AsyncIterator[str]:
    feed = None
    try:
        key = FeedKey(who.project, who.job_id, kind.__name__)
        uri = JobPaths.for_job(str(who.job_id))
        feed = FEEDS.join(key, lambda: Feed(key, factory, kind(uri.logs if kind is LogSource else uri.metrics),
                                            _interval))
        async for chunk in _send(factory, who, feed, make_tail(feed.source)):
            yield chunk
    finally:  # the client left, the job ended or the key went: the slot is free again
        if feed is not None:
            FEEDS.leave(feed)
        slot.release()


async def _send(factory: sessionmaker[Session], who: Follower, feed: Feed, tail: Tail) -> AsyncIterator[str]:
    """One follower: wakes at each of the feed's polls (or to ping), checks its key every KEY_CHECK_S,
    and sends what is new to it."""
    last_status: JobStatus | None = None
    last_sent = key_checked = time.monotonic()  # the route checked the key just now
    tick, taken = 0, -1  # the feed's update and source change this follower last took
    update: Update | None = None
    while True:
        if not tail.behind:  # behind: a page was read and more is waiting, so read on at once
            update = await feed.next(tick, max(0.01, PING_S - (time.monotonic() - last_sent)))
        if time.monotonic() - key_checked >= KEY_CHECK_S:
            try:
                if not await run_in_threadpool(_key_still_valid, factory, who):
                    yield event("error", {"code": "key_revoked", "message": "this API key was revoked or deleted"})
                    return
                key_checked = time.monotonic()
            except Exception as exc:  # an outage: keep the stream, check again at the next wake
                log.warning("job %s stream: %s: %s", who.job_id, type(exc).__name__, exc)
        if update is None:
            if time.monotonic() - last_sent >= PING_S:
                yield ": ping\n\n"
                last_sent = time.monotonic()
            continue
        tick = update.tick
        if update.error is not None:
            yield event("error", {"code": "too_large", "message": update.error})
            return
        if update.status is None and not update.failed:  # the row is gone
            yield event("end", {"status": last_status.value if last_status else None})
            return
        status, failed, items = update.status or last_status, update.failed, []
        if status is not None and (update.data != taken or tail.behind or status.terminal):
            try:
                items = await run_in_threadpool(tail.read, status.terminal)
                taken = update.data
            except Exception as exc:  # storage down while catching up: the next wake reads again
                log.warning("job %s stream: %s: %s", who.job_id, type(exc).__name__, exc)
                failed = True
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


def follow(factory: sessionmaker[Session], who: Follower, kind: type[LogSource | MetricSource],
           make_tail: Callable[[Any], Tail]) -> Response:
    """The stream, or 429 when the key or this process already holds as many as it may."""
    try:
        slot = SLOTS.take(hash_key(who.secret))
    except TooManyStreams as exc:
        return error_response(429, "too_many_streams", str(exc), headers={"Retry-After": str(RETRY_AFTER_S)})
    stream = _events(factory, who, kind, make_tail, slot)
    # A stream the server never starts (the client left before the first byte) never runs its
    # finally: the slot goes with the generator instead.
    weakref.finalize(stream, slot.release)
    return StreamingResponse(stream, media_type="text/event-stream", headers=SSE_HEADERS)


def follow_logs(factory: sessionmaker[Session], who: Follower, cursor: str | None) -> Response:
    offsets = job_logs.decode_cursor(cursor)  # a bad cursor is a 422 before the stream starts
    return follow(factory, who, LogSource, lambda source: LogTail(source, offsets))


def follow_metrics(factory: sessionmaker[Session], who: Follower, cursor: str | None) -> Response:
    last = MetricTail.decode(cursor)
    return follow(factory, who, MetricSource, lambda source: MetricTail(source, last))
