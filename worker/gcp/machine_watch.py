"""One listing of a product's machines in every zone, shared by every job a worker drives (issue 25).

A driver looks at its job's machine every step (about once a second). Asking Google once per job per
step spends the project's read quota in proportion to the jobs: Compute Engine's default of 1,500 read
requests a minute runs out at about 25 jobs, and past it every look fails with 403 rateLimitExceeded.
Instead the provisioner lists its machines (our label) in each zone on a schedule every job shares, and
a job's look is answered from the latest listing. A job reads its own machine only when the listing
cannot answer: the machine is not in it (created since, or gone), this process created or deleted it
after the listing began, or the listing is too old.

Rate limits (any of the provisioner's calls answered 403 rateLimitExceeded / 429) stretch the schedule:
the interval doubles, up to a cap, with jitter so that workers do not list in step; a listing that
succeeds after two intervals without a refusal halves it again (halving at every success flapped: the
quota refuses every other listing at the base interval). Meanwhile the last listing keeps answering, so no job fails for it; a job it
cannot answer for is told RateLimited at once instead of reading its own machine, until a listing
succeeds: a read per job is what exhausted the quota, and the listing needs what is left of it.

Several workers (fleet_listing.py): `fetch` may return a Listing made elsewhere (another worker's, stored
in the database) with its own start; then the next look at the store comes just after that listing's
next one is due, and the store's schedule (interval_s) is this watch's.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from worker import prometheus
from worker.gcp.errors import cloud_message, is_rate_limited
from worker.ports import RateLimited

log = logging.getLogger("trainjobs.worker")
T = TypeVar("T")


@dataclass(frozen=True)
class WatchConfig:
    every_s: float = 20.0  # how often the machines are listed: a preemption shows within this
    soon_s: float = 2.0  # after this process created or deleted a machine, the next listing within this
    max_every_s: float = 60.0  # rate limits double the interval up to this (a preemption still shows in a minute)
    max_age_s: float = 180.0  # an older listing answers nothing: each job reads its own machine instead


@dataclass(frozen=True)
class Listing(Generic[T]):
    started: float  # when its first request went out: it knows nothing that changed after this
    machines: dict[str, tuple[str, T]]  # machine name -> (zone, the product's own record of it)


class MachineWatch(Generic[T]):
    def __init__(self, product: str, fetch: Callable[[], dict[str, tuple[str, T]] | Listing[T]], config: WatchConfig,
                 clock: Callable[[], float] = time.monotonic, jitter: Callable[[], float] = random.random):
        """fetch(): every zone's machines of ours, one attempt per request (the schedule is the retry), or a
        complete listing made elsewhere."""
        self.product, self.fetch, self.config, self.clock, self.jitter = product, fetch, config, clock, jitter
        self._lock = threading.Lock()
        self._listing: Listing[T] | None = None
        self._refreshing = False
        self._next = -math.inf  # when the next listing is due
        self._interval = config.every_s  # now: longer while backing off from rate limits
        self._escalated_at = -math.inf
        self._refused_at = -math.inf
        self._holding = False  # rate-limited since the last listing: jobs do not read their own machines
        self._touched: dict[str, float] = {}  # machine -> when this process last created or deleted it
        self._created_at: float | None = None  # the first create since the last listing began: one is due soon
        prometheus.LISTING_INTERVAL.labels(product).set(self._interval)

    @property
    def interval_s(self) -> float:
        return self._interval

    @property
    def refused_at(self) -> float:
        """When a call of this product was last refused for the rate quota (-inf: never)."""
        return self._refused_at

    @property
    def created_at(self) -> float | None:
        """The first create since the last listing began: a listing begun after it is wanted soon."""
        return self._created_at

    def adopt_interval(self, interval: float) -> None:
        """The fleet's schedule, set by the worker that lists (fleet_listing.py)."""
        with self._lock:
            self._set_interval(interval, None)

    @property
    def latest(self) -> Listing[T] | None:
        with self._lock:
            return self._listing

    def find(self, name: str) -> tuple[str, T] | None:
        """(zone, record) from the shared listing, or None when it cannot answer: then read the machine.
        Raises RateLimited when it cannot answer while the product is rate-limited."""
        self._refresh_if_due()
        with self._lock:
            listing, touched, holding = self._listing, self._touched.get(name, -math.inf), self._holding
        answer = None
        if listing is not None and self.clock() - listing.started <= self.config.max_age_s and touched < listing.started:
            answer = listing.machines.get(name)
        if answer is None and holding:
            raise RateLimited(f"{self.product} is rate-limited: {name} is looked at in the next listing")
        prometheus.MACHINE_LOOKUPS.labels(self.product, "listing" if answer is not None else "get").inc()
        return answer

    def touched(self, name: str, *, soon: bool = True) -> None:
        """This process is creating or deleting `name`: listings begun before now cannot answer for it.
        After a create (`soon`) the next listing comes within soon_s, one for all the creates of those
        seconds, so the new machines' jobs stop reading their own; nobody looks at a deleted one again."""
        now = self.clock()
        with self._lock:
            self._touched[name] = now
            if soon and self._interval <= self.config.every_s:  # not while backing off: the jobs read their own
                self._created_at = now if self._created_at is None else self._created_at
                self._next = min(self._next, now + self.config.soon_s)

    def offer(self, listing: Listing[T]) -> None:
        """A complete listing made elsewhere (list(): a driver's teardown, the reaper): every job reads from
        it, and the scheduled one waits its interval from it."""
        with self._lock:
            self._install(listing)

    def rate_limited(self, exc: BaseException) -> None:
        """A call of this product was refused for the rate quota: list less often (at most one step per
        base interval, however many jobs saw the refusal at once)."""
        now = self.clock()
        with self._lock:
            self._holding = True
            self._refused_at = now
            if now - self._escalated_at < self.config.every_s or self._interval >= self.config.max_every_s:
                return
            self._escalated_at = now
            self._set_interval(min(self._interval * 2, self.config.max_every_s), cloud_message(exc))
            self._next = max(self._next, now + self._jittered())

    # --- the schedule ---

    def _refresh_if_due(self) -> None:
        with self._lock:
            if self._refreshing or self.clock() < self._next:
                return
            self._refreshing = True
        try:
            started = self.clock()
            try:
                fetched = self.fetch()
            except Exception as exc:
                self._failed(exc)
                return
            if isinstance(fetched, Listing):  # made elsewhere: look again just after its next one is due
                with self._lock:
                    self._install(fetched, own=False)
                    self._next = max(fetched.started + self._interval + self.config.soon_s,
                                     self.clock() + self.config.soon_s)
                return
            prometheus.MACHINE_LISTINGS.labels(self.product, "ok").inc()
            with self._lock:
                self._install(Listing(started, fetched))
        finally:
            with self._lock:
                self._refreshing = False

    def _failed(self, exc: Exception) -> None:
        if is_rate_limited(exc):
            prometheus.MACHINE_LISTINGS.labels(self.product, "rate_limited").inc()
            self.rate_limited(exc)
            with self._lock:
                self._next = max(self._next, self.clock() + self._jittered())
            return
        prometheus.MACHINE_LISTINGS.labels(self.product, "error").inc()
        log.warning("listing %s machines failed (%s); the jobs read their own machines until the next listing",
                    self.product, cloud_message(exc))
        with self._lock:
            self._next = self.clock() + self._jittered()

    def _install(self, listing: Listing[T], own: bool = True) -> None:
        """Under the lock. `own`: this process listed (or was offered its list()); the schedule of a listing
        made elsewhere is its lister's, adopted as it is."""
        self._holding = False
        if self._listing is None or listing.started >= self._listing.started:
            self._listing = listing
            self._touched = {n: t for n, t in self._touched.items() if t >= listing.started}
        if own and self._interval > self.config.every_s and self.clock() - self._refused_at >= 2 * self._interval:
            self._set_interval(max(self.config.every_s, self._interval / 2), None)
        self._next = listing.started + self._jittered()
        # A listing begun before a create (one offered by list()) leaves the create's soon listing due.
        if self._created_at is not None and listing.started >= self._created_at:
            self._created_at = None
        if self._created_at is not None:
            self._next = min(self._next, self._created_at + self.config.soon_s)

    def _jittered(self) -> float:
        # Between 80% and 100% of the interval: workers started together drift apart, none waits longer.
        return self._interval * (0.8 + 0.2 * self.jitter())

    def _set_interval(self, interval: float, why: str | None) -> None:
        """Logged when the backoff starts (a warning, with Google's words), steps, and ends."""
        if interval == self._interval:
            return
        self._interval = interval
        prometheus.LISTING_INTERVAL.labels(self.product).set(interval)
        if why is not None:
            log.warning("%s rate-limited (%s): listing its machines every %.0fs", self.product, why, interval)
        elif interval > self.config.every_s:
            log.info("%s: no rate limit for a while: listing its machines every %.0fs", self.product, interval)
        else:
            log.info("%s: no rate limit for a while: listing its machines every %.0fs again", self.product, interval)
