"""The worker: claims jobs, drives several at once, heartbeats their leases, stops cleanly.

LISTEN/NOTIFY is a hint that wakes the claim loop at once; a poll timer still runs, because
notifications are lost while the listening connection is down.

Every loop survives losing the database: it logs, waits and tries again, and a job's lease is
renewed only while its driver runs, so a job nobody drives is taken over when its lease lapses.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import psycopg
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from service.db import queue
from service.db.jobstate import NOTIFY_CHANGED, NOTIFY_QUEUED, JobStatus
from service.db.sweeps import NOTIFY_SWEEP
from service.db.session import session_factory, transaction
from trainjobs.storage_limits import WORKER_LIMITS, limited_calls
from trainjobs.uploads import sweep_incoming
from worker import prometheus
from worker.driver import DriverConfig, JobDriver
from worker.ports import JobChannel, Provisioner, Stager
from worker.sweeps import SweepConfig, SweepEngine

log = logging.getLogger("trainjobs.worker")


@dataclass
class WorkerConfig:
    concurrency: int = 4  # jobs driven at once
    lease_s: float = 30.0  # a job whose worker has not heartbeated this long is taken over
    heartbeat_s: float = 5.0
    poll_s: float = 2.0  # claim poll when no notification arrives
    # Slots beyond `concurrency` that only jobs taken over from a dead worker may fill, so an orphaned
    # machine is watched again at once instead of after a queued job frees a slot. None: `concurrency`.
    takeover_slots: int | None = None
    # Clouds bill for what nobody watches: every this many seconds, delete machines labelled as ours
    # whose job has ended or is unknown (worker/reaper.py). None: no reaper (local machines die
    # with their processes).
    reap_every_s: float | None = None
    # Every this many seconds, delete upload temporaries an API left when it was killed mid-upload
    # (trainjobs.uploads.sweep_incoming; their age, not this, decides). None: no sweep.
    sweep_uploads_every_s: float | None = 600.0
    # Serve only jobs of these accelerator types ("tpu", "gpu", "cpu"), so one fleet can split TPU and
    # GPU work between workers. None: every type.
    accelerator_types: tuple[str, ...] | None = None
    driver: DriverConfig = field(default_factory=DriverConfig)
    # Drive sweeps (worker/sweeps.py); None: this worker leaves them to others.
    sweeps: SweepConfig | None = field(default_factory=SweepConfig)
    name: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}")


class Worker:
    def __init__(self, engine: Engine, provisioner: Provisioner, channel: JobChannel, stager: Stager,
                 config: WorkerConfig | None = None):
        self.engine, self.provisioner, self.channel, self.stager = engine, provisioner, channel, stager
        self.config = config or WorkerConfig()
        self.factory: sessionmaker[Session] = session_factory(engine)
        self.stopping = threading.Event()
        self._wake = threading.Event()  # new work may be queued
        self._active: dict[uuid.UUID, JobDriver] = {}  # jobs with a live driver: the only leases renewed
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(self.config.concurrency + self._takeover_slots, thread_name_prefix="job")
        self._threads: list[threading.Thread] = []
        self._claim_conn: Connection | None = None
        self.sweeps = (SweepEngine(engine, self.factory, self.config.name, self.stopping, self.config.sweeps)
                       if self.config.sweeps is not None else None)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def _takeover_slots(self) -> int:
        slots = self.config.takeover_slots
        return self.config.concurrency if slots is None else slots

    # --- lifecycle ---

    def start(self) -> None:
        for target in (self._claim_loop, self._heartbeat_loop, self._listen_loop):
            t = threading.Thread(target=target, name=f"worker-{target.__name__}", daemon=True)
            t.start()
            self._threads.append(t)
        if self.config.reap_every_s is not None:
            from worker.reaper import run_reaper

            t = threading.Thread(target=run_reaper, name="worker-reaper", daemon=True,
                                 args=(self.provisioner, self.factory, self.stopping, self.config.reap_every_s))
            t.start()
            self._threads.append(t)
        if self.config.sweep_uploads_every_s is not None:
            t = threading.Thread(target=self._sweep_loop, name="worker-sweep-uploads", daemon=True)
            t.start()
            self._threads.append(t)
        if self.sweeps is not None:
            t = threading.Thread(target=self.sweeps.run, name="worker-sweeps", daemon=True)
            t.start()
            self._threads.append(t)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop claiming, let each driver finish its current step, and give every job back with an
        expired lease so another worker takes it over at once (machines keep running; the next
        owner adopts them)."""
        self.stopping.set()
        self._wake.set()
        if self.sweeps is not None:
            self.sweeps.wake.set()
        with self._lock:
            active = dict(self._active)
        for driver in active.values():
            driver.wake.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        try:
            with transaction(self.factory) as session:
                for job_id in active:
                    queue.release_lease(session, job_id, self.name)
        except Exception:  # the database is down: the leases lapse on their own instead
            log.warning("could not release leases on shutdown; they expire in %.0fs", self.config.lease_s, exc_info=True)
        for t in self._threads:
            t.join(timeout)
        if self.sweeps is not None:
            self.sweeps.release_all()
        if self._claim_conn is not None:
            self._claim_conn.close()
        log.info("worker %s stopped; released %d job(s)", self.name, len(active))

    # --- loops ---

    def _claim_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                claimed = self.claim_one()
            except Exception as exc:
                claimed = False
                log.warning("claim failed; retrying in %.1fs: %s", self.config.poll_s, exc)
            if not claimed:
                self._wake.wait(self.config.poll_s)
                self._wake.clear()

    def claim_one(self) -> bool:
        """Claim a job if a slot is free: any job while fewer than `concurrency` are driven, only a
        taken-over one in the takeover slots beyond."""
        with self._lock:
            busy = len(self._active)
        if busy < self.config.concurrency:
            claim = self._claim(queue.claim_next_job)
        elif busy < self.config.concurrency + self._takeover_slots:
            claim = self._claim(queue.take_over_expired_job)
        else:
            return False
        if claim is None:
            return False
        log.info("claimed job %s (%s -> %s)", claim.job_id, claim.from_status.value, claim.to_status.value)
        prometheus.claimed(claim.takeover)
        with self._lock:
            if (running := self._active.get(claim.job_id)) is not None:
                # Our own lease lapsed (a long database outage) and we took the job over from ourselves:
                # its driver still runs and re-reads the job; a second one would drive it twice.
                running.wake.set()
                return True
            driver = JobDriver(claim.job_id, self.name, self.factory, self.provisioner, self.channel, self.stager,
                               self.config.driver, self.stopping)
            self._active[claim.job_id] = driver
            self._pool.submit(self._drive, driver)
        return True

    def _claim(self, statement: Callable[[Connection, str, float, tuple[str, ...] | None], queue.Claim | None]
               ) -> queue.Claim | None:
        # The claim loop is one thread; it keeps one autocommit connection, so a claim costs one
        # round trip (no pool checkout ping, no BEGIN/COMMIT around a single atomic statement).
        if self._claim_conn is None:
            self._claim_conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        started = time.perf_counter()
        try:
            return statement(self._claim_conn, self.name, self.config.lease_s, self.config.accelerator_types)
        except DBAPIError:
            self._claim_conn.invalidate()
            self._claim_conn.close()
            self._claim_conn = None
            raise
        finally:
            prometheus.CLAIM_SECONDS.observe(time.perf_counter() - started)

    def _drive(self, driver: JobDriver) -> None:
        try:
            # Storage that does not answer fails a step in seconds (retried by the driver) instead of
            # holding it for the client's 120 s, deaf to a cancel or a shutdown.
            with limited_calls(WORKER_LIMITS):
                driver.run()
        except Exception:
            # The driver retries its own failures; this is a bug in it. The job's lease is no longer
            # renewed once it leaves _active, so another worker (or this one) takes it over.
            log.exception("driving job %s crashed", driver.job_id)
        finally:
            with self._lock:
                if self._active.get(driver.job_id) is driver:
                    del self._active[driver.job_id]
            self._wake.set()  # a slot is free

    def _heartbeat_loop(self) -> None:
        while not self.stopping.wait(self.config.heartbeat_s):
            with self._lock:
                job_ids = list(self._active)
            try:
                with transaction(self.factory) as session:
                    statuses = queue.renew_leases(session, self.name, job_ids, self.config.lease_s)
            except Exception as exc:
                log.warning("heartbeat failed; retrying in %.1fs: %s", self.config.heartbeat_s, exc)
                continue
            with self._lock:
                for job_id in job_ids:
                    if (driver := self._active.get(job_id)) is not None:
                        self._tell(driver, statuses.get(job_id))

    @staticmethod
    def _tell(driver: JobDriver, status: JobStatus | None) -> None:
        """Pass what the database says about a driven job to its driver. None: no longer ours."""
        if status == JobStatus.CANCELLING:
            driver.cancel_requested.set()
        if status is None or status == JobStatus.CANCELLING or status.terminal:
            driver.wake.set()

    def _sweep_loop(self) -> None:
        every = self.config.sweep_uploads_every_s
        assert every is not None
        while not self.stopping.wait(every):
            try:
                with limited_calls(WORKER_LIMITS):  # storage that does not answer must not hold a shutdown
                    if swept := sweep_incoming():
                        log.info("removed %d upload temporar%s left by a stopped API", swept, "y" if swept == 1 else "ies")
            except Exception as exc:
                log.warning("sweeping upload temporaries failed; retrying in %.0fs: %s", every, exc)

    def _listen_loop(self) -> None:
        dsn = self.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        while not self.stopping.is_set():
            try:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(f"LISTEN {NOTIFY_QUEUED}")
                    conn.execute(f"LISTEN {NOTIFY_CHANGED}")
                    conn.execute(f"LISTEN {NOTIFY_SWEEP}")
                    self._wake.set()  # anything queued while we were not listening
                    while not self.stopping.is_set():
                        for note in conn.notifies(timeout=0.5):
                            self._on_notify(note.channel, note.payload)
            except Exception as exc:
                log.warning("LISTEN connection lost; polling until it is back: %s", exc)
                self.stopping.wait(1.0)

    def _on_notify(self, channel: str, payload: str) -> None:
        if channel == NOTIFY_QUEUED:
            self._wake.set()
            return
        if self.sweeps is not None and channel in (NOTIFY_SWEEP, NOTIFY_CHANGED):
            self.sweeps.wake.set()  # a sweep changed, or a job ended or is being cancelled: maybe a trial
        if channel == NOTIFY_SWEEP:
            return
        try:
            job_id = uuid.UUID(payload)
        except ValueError:
            return
        with self._lock:
            driver = self._active.get(job_id)
        if driver is None:
            return
        driver.wake.set()
        # The payload names the job, not its status: read it, because a driver blocked in staging
        # learns of a cancel only through cancel_requested.
        try:
            with transaction(self.factory) as session:
                status = queue.renew_leases(session, self.name, [job_id], self.config.lease_s).get(job_id)
        except Exception as exc:
            log.warning("could not read job %s after a notification: %s", job_id, exc)
            return
        self._tell(driver, status)
