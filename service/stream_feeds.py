"""One poller per followed job and stream kind in this API process, whatever the number of followers
(issue 25: before, every follow-stream polled PostgreSQL and storage on its own, twice a second).

A `Feed` polls the job's status and reads its storage once per poll into a `Source`, and publishes
the latest `Update`; every follower of that job (service/routes/streams.py) wakes on it and takes what
is new to it from the source. Nothing is queued per follower: a follower that stops reading (a client
that does not drain its socket) only falls behind, and the next time it runs it skips ahead to the
latest update and reads what it missed from the source's window, or from storage itself when it is
further behind than that. So a slow follower neither stalls the others nor makes the feed hold more.

The feed stops when its last follower leaves, polls a queued job at the queued rate, and stops
polling once the job ended (the end is delivered to those following; a later follower gets a new
feed, which polls once).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from service.db import jobs as data
from service.db.session import transaction
from trainjobs import storage
from trainjobs.states import JobStatus

log = logging.getLogger("trainjobs.api")


class Source(Protocol):
    """What the feed reads from storage each poll, shared by every follower."""

    def refresh(self) -> bool:
        """Read what is new in storage (on a worker thread); True when followers have something to take."""
        ...

    @property
    def behind(self) -> bool:
        """The last refresh stopped at its limit: there is more to read now."""
        ...


@dataclass(frozen=True)
class Update:
    tick: int  # one more per poll
    status: JobStatus | None  # None: the row is gone
    data: int  # one more each time the source changed
    failed: bool = False  # this poll could not be made (an outage): keep going, read again
    error: str | None = None  # the job wrote more than the API reads: the stream ends with this


@dataclass(frozen=True)
class FeedKey:
    project: uuid.UUID
    job_id: uuid.UUID
    kind: str  # what is followed: the name of its Source


def _job_status(factory: sessionmaker[Session], key: FeedKey) -> JobStatus | None:
    with transaction(factory) as session:
        job = data.get_job(session, key.project, key.job_id)
        return None if job is None else JobStatus(job.status)


class Feed:
    def __init__(self, key: FeedKey, factory: sessionmaker[Session], source: Source,
                 interval: Callable[[JobStatus | None], float]):
        self.key, self.factory, self.source, self.interval = key, factory, source, interval
        self.update: Update | None = None
        self.followers = 0
        self._published = asyncio.Event()  # replaced at each publish: waiters hold the one they waited on
        self._task: asyncio.Task[None] | None = None

    async def next(self, after_tick: int, timeout: float) -> Update | None:
        """The latest update if it is newer than `after_tick`, else the next one within `timeout`."""
        published = self._published
        if self.update is not None and self.update.tick > after_tick:
            return self.update
        try:
            await asyncio.wait_for(published.wait(), timeout)
        except asyncio.TimeoutError:
            return None
        return self.update

    def _publish(self, update: Update) -> None:
        self.update = update
        published, self._published = self._published, asyncio.Event()
        published.set()

    async def _run(self) -> None:
        tick = changes = 0
        status: JobStatus | None = None
        while self.followers > 0:
            failed, error = False, None
            try:
                # Status first: when it is terminal, everything the job wrote is in storage by now.
                status = await run_in_threadpool(_job_status, self.factory, self.key)
                if status is not None and await run_in_threadpool(self.source.refresh):
                    changes += 1
            except storage.ObjectTooLarge as exc:
                error = str(exc)
            except Exception as exc:  # an outage: the followers keep their streams, the next poll tries again
                log.warning("job %s feed: %s: %s", self.key.job_id, type(exc).__name__, exc)
                failed = True
            tick += 1
            self._publish(Update(tick, status, changes, failed, error))
            if error is not None or (not failed and (status is None or status.terminal) and not self.source.behind):
                return  # nothing more will come: those following deliver the end
            await asyncio.sleep(0 if self.source.behind and not failed else self.interval(status))


class Feeds:
    """This process's feeds, one per FeedKey while anyone follows it. Used on the event loop only."""

    def __init__(self) -> None:
        self._feeds: dict[FeedKey, Feed] = {}

    def join(self, key: FeedKey, make: Callable[[], Feed]) -> Feed:
        feed = self._feeds.get(key)
        if feed is None or (feed._task is not None and feed._task.done()):  # ended: a new follower polls anew
            feed = self._feeds[key] = make()
        feed.followers += 1
        if feed._task is None:
            feed._task = asyncio.get_running_loop().create_task(feed._run())
        return feed

    def leave(self, feed: Feed) -> None:
        feed.followers -= 1
        if feed.followers > 0:
            return
        if feed._task is not None and not feed._task.done():
            feed._task.cancel()
        if self._feeds.get(feed.key) is feed:
            del self._feeds[feed.key]

    def __len__(self) -> int:
        return len(self._feeds)


FEEDS = Feeds()
