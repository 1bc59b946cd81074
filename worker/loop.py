"""The worker: claims jobs, drives several at once, heartbeats their leases, stops cleanly.

LISTEN/NOTIFY is a hint that wakes the claim loop at once; a poll timer still runs, because
notifications are lost while the listening connection is down.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import psycopg
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from service.db import queue
from service.db.jobstate import NOTIFY_CHANGED, NOTIFY_QUEUED, JobStatus
from service.db.session import session_factory, transaction
from trainjobs.storage_limits import WORKER_LIMITS, limited_calls
from worker.driver import DriverConfig, JobDriver
from worker.provisioner import JobChannel, Provisioner, Stager

log = logging.getLogger("trainjobs.worker")


@dataclass
class WorkerConfig:
    concurrency: int = 4  # jobs driven at once
    lease_s: float = 30.0  # a job whose worker has not heartbeated this long is taken over
    heartbeat_s: float = 5.0
    poll_s: float = 2.0  # claim poll when no notification arrives
    driver: DriverConfig = field(default_factory=DriverConfig)
    name: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}")


class Worker:
    def __init__(self, engine: Engine, provisioner: Provisioner, channel: JobChannel, stager: Stager,
                 config: WorkerConfig | None = None):
        self.engine, self.provisioner, self.channel, self.stager = engine, provisioner, channel, stager
        self.config = config or WorkerConfig()
        self.factory: sessionmaker[Session] = session_factory(engine)
        self.stopping = threading.Event()
        self._wake = threading.Event()  # new work may be queued
        self._active: dict[uuid.UUID, tuple[Future[None], threading.Event]] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(self.config.concurrency, thread_name_prefix="job")
        self._threads: list[threading.Thread] = []
        self._claim_conn: Connection | None = None

    @property
    def name(self) -> str:
        return self.config.name

    # --- lifecycle ---

    def start(self) -> None:
        for target in (self._claim_loop, self._heartbeat_loop, self._listen_loop):
            t = threading.Thread(target=target, name=f"worker-{target.__name__}", daemon=True)
            t.start()
            self._threads.append(t)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop claiming, let each driver finish its current step, and give every job back with an
        expired lease so another worker takes it over at once (machines keep running; the next
        owner adopts them)."""
        self.stopping.set()
        self._wake.set()
        with self._lock:
            active = dict(self._active)
        for _, wake in active.values():
            wake.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        with transaction(self.factory) as session:
            for job_id in active:
                queue.release_lease(session, job_id, self.name)
        for t in self._threads:
            t.join(timeout)
        if self._claim_conn is not None:
            self._claim_conn.close()
        log.info("worker %s stopped; released %d job(s)", self.name, len(active))

    # --- loops ---

    def _claim_loop(self) -> None:
        while not self.stopping.is_set():
            claimed = False
            if self._free_slots() > 0:
                try:
                    claimed = self.claim_one()
                except Exception:
                    log.exception("claim failed")
            if not claimed:
                self._wake.wait(self.config.poll_s)
                self._wake.clear()

    def claim_one(self) -> bool:
        claim = self._claim()
        if claim is None:
            return False
        log.info("claimed job %s (%s -> %s)", claim.job_id, claim.from_status.value, claim.to_status.value)
        wake = threading.Event()
        driver = JobDriver(claim.job_id, self.name, self.factory, self.provisioner, self.channel, self.stager,
                           self.config.driver, self.stopping, wake)
        with self._lock:
            future = self._pool.submit(self._drive, driver)
            self._active[claim.job_id] = (future, wake)
        return True

    def _claim(self) -> queue.Claim | None:
        # The claim loop is one thread; it keeps one autocommit connection, so a claim costs one
        # round trip (no pool checkout ping, no BEGIN/COMMIT around a single atomic statement).
        if self._claim_conn is None:
            self._claim_conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            return queue.claim_next_job(self._claim_conn, self.name, self.config.lease_s)
        except DBAPIError:
            self._claim_conn.invalidate()
            self._claim_conn.close()
            self._claim_conn = None
            raise

    def _drive(self, driver: JobDriver) -> None:
        try:
            # Storage that does not answer fails a step in seconds (retried by the driver) instead of
            # holding it for the client's 120 s, deaf to a cancel or a shutdown.
            with limited_calls(WORKER_LIMITS):
                driver.run()
        except Exception:
            # Leave the job leased: when the lease lapses another worker takes it over and recovers it.
            log.exception("driving job %s crashed", driver.job_id)
        finally:
            with self._lock:
                self._active.pop(driver.job_id, None)
            self._wake.set()  # a slot is free

    def _free_slots(self) -> int:
        with self._lock:
            return self.config.concurrency - len(self._active)

    def _heartbeat_loop(self) -> None:
        while not self.stopping.wait(self.config.heartbeat_s):
            try:
                with transaction(self.factory) as session:
                    statuses = queue.renew_leases(session, self.name, self.config.lease_s)
            except Exception:
                log.exception("heartbeat failed")
                continue
            with self._lock:
                for job_id, (_, wake) in self._active.items():
                    if job_id not in statuses or statuses[job_id] == JobStatus.CANCELLING:
                        wake.set()

    def _listen_loop(self) -> None:
        dsn = self.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        while not self.stopping.is_set():
            try:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(f"LISTEN {NOTIFY_QUEUED}")
                    conn.execute(f"LISTEN {NOTIFY_CHANGED}")
                    self._wake.set()  # anything queued while we were not listening
                    while not self.stopping.is_set():
                        for note in conn.notifies(timeout=0.5):
                            self._on_notify(note.channel, note.payload)
            except psycopg.Error:
                log.warning("LISTEN connection lost; polling until it is back", exc_info=True)
                self.stopping.wait(1.0)

    def _on_notify(self, channel: str, payload: str) -> None:
        if channel == NOTIFY_QUEUED:
            self._wake.set()
            return
        try:
            job_id = uuid.UUID(payload)
        except ValueError:
            return
        with self._lock:
            entry = self._active.get(job_id)
        if entry:
            entry[1].set()
