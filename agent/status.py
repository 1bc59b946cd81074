"""status.json, the heartbeat, and the agent's log: how the worker hears from this machine.

The worker reads only GCS, never a process handle, so everything it needs to judge the agent lives
in status.json: the state, a heartbeat it checks for staleness, progress, the runtime plan, the
latest epoch's metrics, and on failure the error with the last log lines.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trainjobs import storage
from trainjobs.messages import AgentError, AgentReport, AgentState
from agent.job import AgentJob

UTC = timezone.utc  # datetime.UTC is 3.11+; the agent's wheel runs on the VM images' Python 3.10

log = logging.getLogger("trainjobs.agent")

ERROR_LOG_LINES = 30
FINAL_WRITE_ATTEMPTS = 4
# The log is uploaded this often when it grew, so `logs --follow` and the dashboard see a line within
# about a second (issue 13), not at the next 10-second heartbeat. Each upload is the whole file (an
# object cannot be appended to), so past QUICK_LOG_MAX_BYTES the log waits for the heartbeat instead.
LOG_FLUSH_S = 1.0
QUICK_LOG_MAX_BYTES = 4 << 20
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _TailHandler(logging.Handler):
    """Keeps the last lines in memory, for the error report."""

    def __init__(self, size: int):
        super().__init__()
        self.lines: collections.deque[str] = collections.deque(maxlen=size)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


class RetryableFailure(Exception):
    """An attempt that failed for the machine's reason, not the job's: reported FAILED with `retry`, and
    the worker starts another attempt within limits.max_retries (worker/driver.py)."""


def setup_logging(log_file: Path) -> _TailHandler:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter(LOG_FORMAT)
    tail = _TailHandler(ERROR_LOG_LINES)
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in (logging.StreamHandler(sys.stdout), logging.FileHandler(log_file), tail):
        handler.setFormatter(fmt)
        root.addHandler(handler)
    logging.captureWarnings(True)
    return tail


def utc_now() -> datetime:
    return datetime.now(UTC)


class StatusReporter:
    """Owns status.json for this task. Every write goes through one lock, so a heartbeat carrying an
    older snapshot can never land after a newer epoch report."""

    def __init__(self, job: AgentJob, log_file: Path, tail: _TailHandler, heartbeat_s: float = 10.0):
        self.job, self.log_file, self.tail, self.heartbeat_s = job, log_file, tail, heartbeat_s
        self.state = AgentState.STARTING
        self.phase = "starting"
        self.epoch = 0
        self.progress = 0.0
        self.runtime: dict[str, Any] | None = None
        self.metrics: dict[str, Any] | None = None
        self.error: AgentError | None = None
        self.started_at = utc_now()
        self.first_step_at: datetime | None = None  # when training's first step ended (issue 10 §4)
        self._lock = threading.Lock()
        self._final = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._log_size_uploaded = -1

    # --- what the rest of the agent calls ---

    def start(self) -> None:
        self.write()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self._thread.start()

    def set_phase(self, phase: str, state: AgentState = AgentState.RUNNING) -> None:
        self.phase, self.state = phase, state
        self.write()

    def step_progress(self, epochs_done: float) -> None:
        """Cheap, called from a training callback; the next heartbeat carries it."""
        if self.first_step_at is None:
            self.first_step_at = utc_now()
        self.progress = min(1.0, epochs_done / self.job.spec.training.epochs)

    def step_progress_fraction(self, done: float) -> None:
        """A program's own count of how far it is (agent/program.py), 0..1."""
        if self.first_step_at is None:
            self.first_step_at = utc_now()
        self.progress = min(1.0, max(0.0, done))

    def epoch_done(self, epoch: int, metrics: dict[str, Any], *, write: bool = True, progress: bool = True) -> None:
        """write=False: the caller uploads status.json itself (off the training thread, run.py).
        progress=False: the epoch says nothing of how far the job is (a program's own epochs)."""
        self.epoch, self.metrics = epoch, metrics
        if progress:
            self.progress = epoch / self.job.spec.training.epochs
        if write:
            self.write()

    def finish(self, state: AgentState, error: BaseException | None = None) -> None:
        """The last word: stop the heartbeat, upload the log, write the terminal state. A terminated
        agent (SIGTERM: its machine is being deleted, within a grace) writes the state first and the
        log after: the state is what must not be lost, and neither the heartbeat's upload in flight
        nor the log's may use up the grace before it (issue 19). Otherwise the log goes first, since
        the worker deletes the machine as soon as it reads a terminal state."""
        self._stop.set()
        if state == AgentState.TERMINATED:
            self.state = state
            self.write(final=True)
        if self._thread is not None:
            self._thread.join(timeout=30)  # else a beat could carry a terminal state before the log is up
        if error is not None:
            self.error = AgentError(type=type(error).__name__, message=_message(error), logs=list(self.tail.lines),
                                    retry=isinstance(error, RetryableFailure))
        self.state = state
        if state == AgentState.SUCCEEDED:
            self.progress = 1.0
        try:
            self.upload_log()
        except Exception as exc:  # the status matters more than the log
            log.warning("could not upload the log: %s", exc)
        self.write(final=True)

    # --- GCS ---

    def snapshot(self) -> AgentReport:
        return AgentReport(
            state=self.state, phase=self.phase, job_id=self.job.job_id, attempt=self.job.attempt,
            task_index=self.job.task_index, started_at=self.started_at, heartbeat_at=utc_now(), epoch=self.epoch,
            epochs=self.job.spec.training.epochs, progress=round(self.progress, 4), runtime=self.runtime,
            metrics=self.metrics, error=self.error, first_step_at=self.first_step_at,
        )

    def write(self, final: bool = False) -> None:
        """A failed routine write is only logged: the next heartbeat carries the same news. The final
        one is retried, since nothing comes after it."""
        with self._lock:
            if self._final:
                return
            for attempt in range(FINAL_WRITE_ATTEMPTS if final else 1):
                try:
                    storage.write_json(self.job.status_uri, self.snapshot().model_dump(mode="json"))
                    break
                except Exception as exc:
                    if not final:
                        log.warning("could not write %s: %s", self.job.status_uri, exc)
                        return
                    if attempt == FINAL_WRITE_ATTEMPTS - 1:
                        raise
                    time.sleep(2**attempt)
            self._final = final

    def write_last_resort(self, state: AgentState, reason: str, lock_timeout_s: float = 5.0) -> None:
        """A terminal status from another thread than the one running the job (agent/__main__.py's
        grace timer), when that one is stuck: the heartbeat stops, one write goes out unless a final
        one already has. Waits at most `lock_timeout_s` for a write in flight."""
        self._stop.set()
        if not self._lock.acquire(timeout=lock_timeout_s):
            raise TimeoutError(f"another status write held the lock for over {lock_timeout_s:.0f}s")
        try:
            if self._final:
                return
            self.state = state
            self.error = AgentError(type="Stopped", message=reason, logs=list(self.tail.lines))
            storage.write_json(self.job.status_uri, self.snapshot().model_dump(mode="json"))
            self._final = True
        finally:
            self._lock.release()

    def upload_log(self) -> None:
        for handler in logging.getLogger().handlers:
            handler.flush()
        size = self._log_bytes()
        if size != self._log_size_uploaded:
            storage.blob(self.job.log_uri).upload_from_filename(str(self.log_file), content_type="text/plain")
            self._log_size_uploaded = size

    def _beat(self) -> None:
        next_beat = time.monotonic() + self.heartbeat_s
        while not self._stop.wait(min(LOG_FLUSH_S, self.heartbeat_s)):
            try:
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self.heartbeat_s
                    self.write()
                    self.upload_log()
                elif self._log_bytes() <= QUICK_LOG_MAX_BYTES:
                    self.upload_log()
            except Exception as exc:  # a missed beat is survivable; a dead heartbeat thread is not
                log.warning("heartbeat failed: %s", exc)

    def _log_bytes(self) -> int:
        return self.log_file.stat().st_size if self.log_file.exists() else 0


def _message(error: BaseException) -> str:
    text = str(error) or repr(error)
    # TensorFlow errors can carry whole graph traces; the report keeps the head, the log has all.
    return text if len(text) <= 4000 else text[:4000] + " ..."
