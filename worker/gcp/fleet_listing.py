"""One listing of a product's machines per fleet, not per worker (issue 25; service/db/machine_listings.py).

Each worker's MachineWatch keeps its schedule, but its fetch goes through the database first: the worker
holding the row's lease lists the cloud and stores the listing (unless another worker's, e.g. its reaper's,
began within 80% of an interval: then that one is the fleet's); every other worker's watch reads the
stored one (one small query per interval per worker, whatever its jobs) and answers its jobs from it. So a
fleet of W workers lists each zone once per interval, not W times. A lister that dies stops renewing its
lease, and the next worker to look once it lapsed (its watch looks every soon_s while the stored listing
is overdue) lists instead: within about 1.5 intervals.

The schedule is the fleet's: the lister writes its watch's interval (stretched by rate limits) with the
lease and the others adopt it; a worker refused for the rate quota stamps the row, and the lister slows
down as for a refusal of its own. A worker that created a machine after the stored listing began lists
itself, soon, as a lone worker does (and stores it for everyone): its new jobs would otherwise read their
own machines until the lister's next turn. Where the database cannot be reached, a worker lists for
itself: its jobs stay watched.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy.orm import Session, sessionmaker

from service.db.machine_listings import StoredListing, exchange_listing, store_listing
from service.db.session import transaction
from worker.gcp.machine_watch import Listing, MachineWatch
from worker.ports import RateLimited

log = logging.getLogger("trainjobs.worker")
T = TypeVar("T")
LEASE_INTERVALS = 1.5  # a lease outlives one interval's jitter and a slow listing, not two intervals
FRESH_INTERVALS = 0.8  # the lister takes a listing someone else began this recently (at most one interval ago)


@dataclass(frozen=True)
class Codec(Generic[T]):
    """A product's record of a machine to JSON and back (the provisioner's own types, e.g. proto messages)."""

    encode: Callable[[T], Any]
    decode: Callable[[Any], T]


class FleetListing(Generic[T]):
    def __init__(self, factory: sessionmaker[Session], product: str, scope: str,
                 fetch: Callable[[], dict[str, tuple[str, T]]], codec: Codec[T], *, me: str | None = None,
                 clock: Callable[[], float] = time.monotonic):
        """scope: what a listing covers (the project and its zones): workers configured alike share one."""
        self.factory, self.product, self.scope, self.fetch, self.codec, self.clock = (
            factory, product, scope, fetch, codec, clock)
        self.me = me or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.watch: MachineWatch[T] | None = None  # bound once the watch that calls this exists
        self._reported = -math.inf  # this worker's last refusal stamped in the row (watch clock)
        self._noted: float | None = None  # the row's last refusal this lister acted on (database epoch)

    def __call__(self) -> dict[str, tuple[str, T]] | Listing[T]:
        watch = self.watch
        assert watch is not None, "bind the watch first"
        refused_at = watch.refused_at
        try:
            with transaction(self.factory) as session:
                stored = exchange_listing(session, self.product, self.scope, self.me,
                                          lease_s=LEASE_INTERVALS * watch.interval_s, interval_s=watch.interval_s,
                                          fresh_s=FRESH_INTERVALS * watch.interval_s,
                                          refused=refused_at > self._reported)
        except Exception as exc:
            log.warning("%s: the fleet's listing is out of reach (%s); this worker lists for itself", self.product, exc)
            return self.fetch()
        asked = self.clock()
        stamped = refused_at > self._reported
        self._reported = max(self._reported, refused_at)
        started = asked - stored.age_s if stored.age_s is not None else None
        created = watch.created_at
        # A stored listing answers unless it predates this worker's create (its new jobs need one after it).
        usable = stored.machines is not None and started is not None and (created is None or started >= created)
        if stored.mine:
            self._note_refusal(watch, stored, stamped)
        else:
            watch.adopt_interval(stored.interval_s)
        if not usable or stored.machines is None or started is None:
            return self._list()
        return Listing(started, {name: (m["zone"], self.codec.decode(m["record"])) for name, m in stored.machines.items()})

    def store(self, started: float, machines: dict[str, tuple[str, T]]) -> None:
        """A complete listing begun at `started` (this clock), for every worker; a newer one stored stays."""
        record = {name: {"zone": zone, "record": self.codec.encode(m)} for name, (zone, m) in machines.items()}
        try:
            with transaction(self.factory) as session:
                store_listing(session, self.product, self.scope, age_s=max(0.0, self.clock() - started),
                              machines=record)
        except Exception as exc:
            log.warning("%s: could not store the listing for the fleet: %s", self.product, exc)

    def _list(self) -> dict[str, tuple[str, T]]:
        started = self.clock()
        machines = self.fetch()  # a failure is the watch's to handle (its schedule is the retry)
        self.store(started, machines)
        return machines

    def _note_refusal(self, watch: MachineWatch[T], stored: StoredListing, stamped: bool) -> None:
        """Another worker was refused for the rate quota since this lister last looked: the fleet slows as
        for a refusal of the lister's own (`stamped`: the stamp is this worker's, already counted)."""
        at = stored.refused_epoch
        if at is None or (self._noted is not None and at <= self._noted):
            return
        self._noted = at
        recent = stored.refused_age_s is not None and stored.refused_age_s < watch.interval_s
        if not stamped and recent:  # a stamp older than an interval is one a previous lister acted on
            watch.rate_limited(RateLimited(f"another worker's {self.product} call was refused for the rate quota"))
