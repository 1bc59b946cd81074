"""What the Cloud TPU and the Compute Engine provisioners share: a machine lives in one of the
configured zones, calls are retried with backoff (errors.py), and the VMs' storage tokens go on for as
long as the machine lives (job_tokens.py, sealed to each VM by token_delivery.py).

Zones: create() tries them in the configured order, a stockout moving on to the next; get() asks first
the zone a machine was last seen in, so a job that reads its own machine costs one read per step, not
one per zone. With a MachineWatch (machine_watch.py), most looks cost no read at all: they are answered
from one listing per zone that every job shares.

Rate limits: every call's refusals for the project's rate quota slow the watch's schedule, and one
still refused after its retries is raised as the port's RateLimited, which the driver does not hold
against the job.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from worker.gcp.config import GcpConfig
from worker.gcp.errors import cloud_message, is_rate_limited, with_backoff
from worker.gcp.job_tokens import JobTokens, default_job_tokens
from worker.gcp.fleet_listing import Codec, FleetListing
from worker.gcp.machine_watch import Listing, MachineWatch, WatchConfig
from worker.gcp.token_delivery import DueChecks
from worker import prometheus
from worker.ports import RateLimited

log = logging.getLogger("trainjobs.worker")
Call = Callable[[str, Callable[[], Any]], Any]  # (what, the request) -> its answer
ListAll = Callable[[Call], dict[str, tuple[str, Any]]]


class ZonalProvisioner:
    """The base of TpuVmProvisioner and GceVmProvisioner."""

    kind: str

    def __init__(self, config: GcpConfig, *, backoff_s: float, tokens: JobTokens | None, listing: ListAll,
                 codec: Codec[Any], watch: WatchConfig | None = None, fleet: sessionmaker[Session] | None = None):
        """listing(call): every zone's machines of ours, name -> (zone, the product's record), each request
        made through `call` (retried, or once); watch: list them on this schedule for every job (None:
        each job reads its own machine); fleet: with a watch, share one listing with every worker on this
        database (fleet_listing.py; codec: a record to JSON and back), not one per worker."""
        self.config, self.backoff_s = config, backoff_s
        self.tokens = tokens if tokens is not None else default_job_tokens()
        self._zone_of: dict[str, str] = {}  # where each machine was last seen: its zone is asked first
        self._token_checks = DueChecks()  # when each VM's published key is read next
        self._listing = listing
        self._fresh_lock = threading.Lock()
        self.watch: MachineWatch[Any] | None = None
        self.fleet: FleetListing[Any] | None = None
        if watch is not None and fleet is not None:
            scope = f"{config.project}/{','.join(config.zones)}"
            self.fleet = FleetListing(fleet, self.kind, scope, lambda: listing(self._call_once), codec)
            self.watch = self.fleet.watch = MachineWatch(self.kind, self.fleet, watch)
        elif watch is not None:
            self.watch = MachineWatch(self.kind, lambda: listing(self._call_once), watch)

    def _fresh_listing(self) -> dict[str, tuple[str, Any]]:
        """A listing begun after this call, for list(): retried, and offered to the watch, so every job
        reads from it too. With a watch, one at a time: the callers who waited share one begun after they
        asked (a fleet's jobs cancelled at once tear down on a few listings, not one each)."""
        if self.watch is None:
            return self._listing(self._call)
        asked = time.monotonic()
        with self._fresh_lock:
            if (latest := self.watch.latest) is not None and latest.started >= asked:
                return latest.machines
            started = time.monotonic()
            machines = self._listing(self._call)
            self.watch.offer(Listing(started, machines))
            if self.fleet is not None:  # the reaper's and the teardowns' listings serve the fleet too
                self.fleet.store(started, machines)
            return machines

    def _touch(self, name: str, *, soon: bool = True) -> None:
        if self.watch is not None:
            self.watch.touched(name, soon=soon)

    def _zones_for(self, name: str) -> Iterator[str]:
        """The configured zones, the one the machine was last seen in first."""
        seen = self._zone_of.get(name)
        return iter(sorted(self.config.zones, key=lambda z: z != seen))

    def _seen(self, name: str, zone: str) -> None:
        self._zone_of[name] = zone

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        try:
            return with_backoff(lambda: self._noting(call), what=what, base_s=self.backoff_s)
        except Exception as exc:
            if is_rate_limited(exc):
                raise RateLimited(f"{what}: {cloud_message(exc)}") from exc
            raise

    def _call_once(self, what: str, call: Callable[[], Any]) -> Any:
        # The watch's scheduled listing: its schedule is the retry.
        return self._noting(call)

    def _noting(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as exc:
            if is_rate_limited(exc):
                prometheus.CLOUD_RATE_LIMITED.labels(self.kind).inc()
                log.debug("%s: rate-limited: %s", self.kind, cloud_message(exc))
                if self.watch is not None:
                    self.watch.rate_limited(exc)
            raise


def duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} minutes" if seconds >= 60 else f"{seconds:.0f} seconds"
