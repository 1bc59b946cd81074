"""What a local storage guard refused, carried into the worker's log with the job it refused.

A guard is a process of its own (`worker/boundary/storage_guard.py`) that outlives the worker which started
it, and its own log lies in the machine's directory, deleted with the machine: a job's attempts on
other tenants' storage would go with it. So the guard also appends each refusal, one JSON line, to a
file beside its log, and the worker holding the machine forwards new lines to "trainjobs.worker"
every second and once more when it deletes the machine. How far it got is kept beside the file, so a
worker that adopts the machine after a restart forwards only what nobody has.

The job runs as the worker's OS user and can write that file too: the worker names the job it
knows the machine by, never one read from the file, and bounds what it reads and logs per pass.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REFUSALS = "storage-guard.refusals"  # written by the guard, in its machine's directory
FORWARDED = "storage-guard.refusals.forwarded"  # bytes of REFUSALS already in the worker's log
MAX_READ = 64 << 10  # bytes of one machine's refusals read per pass
MAX_LOGGED = 20  # refusals of one machine logged per pass; the rest are counted in one line
MAX_FINAL_PASSES = 16  # at delete: a job that filled the file itself does not flood the worker's log

worker_log = logging.getLogger("trainjobs.worker")


class RefusalLog:
    """The guard's side: one line per refusal, appended whole."""

    def __init__(self, path: Path | None):
        self._path = path
        self._lock = threading.Lock()

    def record(self, method: str, target: str, reason: str, *, routine: bool = False) -> None:
        """`routine`: a request every job's storage client makes by itself; forwarded at DEBUG."""
        if self._path is None:
            return
        line = json.dumps({"time": time.time(), "method": method[:16], "target": target[:512],
                           "reason": reason[:512], "routine": routine}) + "\n"
        with self._lock, self._path.open("a") as f:
            f.write(line)


@dataclass
class _Watched:
    directory: Path
    job_id: str


class RefusalForwarder:
    """The worker's side: forwards the refusals of each machine it watches."""

    def __init__(self, every_s: float = 1.0):
        self._every_s = every_s
        self._watched: dict[str, _Watched] = {}
        self._lock = threading.Lock()  # one pass at a time: two would log the same lines twice
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, name: str, directory: Path, job_id: str) -> None:
        with self._lock:
            self._watched[name] = _Watched(directory, job_id)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="guard-refusals", daemon=True)
                self._thread.start()

    def watching(self, name: str) -> bool:
        with self._lock:
            return name in self._watched

    def finish(self, name: str, directory: Path, job_id: str) -> None:
        """Forward what the machine's guard (stopped by now) left, and forget the machine: called
        whether or not this worker watched it (one that restarted may delete without adopting)."""
        with self._lock:
            self._watched.pop(name, None)
            for _ in range(MAX_FINAL_PASSES):
                if not _forward_logged(directory, job_id):
                    break

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            with self._lock:
                for watched in list(self._watched.values()):
                    _forward_logged(watched.directory, watched.job_id)


def _forward_logged(directory: Path, job_id: str) -> bool:
    """forward(), whatever the machine's directory holds: the job's code can write there (a directory
    where a file should be, say), and neither the forwarding thread nor the machine's delete may fail
    for it."""
    try:
        return forward(directory, job_id)
    except Exception as exc:  # noqa: BLE001 - the job's own files: logged, never raised
        worker_log.warning("job %s: could not forward its storage guard's refusals: %s", job_id, exc)
        return False


def forward(directory: Path, job_id: str) -> bool:
    """Log the refusals recorded in `directory` since the last forward; True if more are waiting."""
    try:
        offset = max(0, int((directory / FORWARDED).read_text() or 0))
    except (OSError, ValueError):
        offset = 0
    try:
        with (directory / REFUSALS).open("rb") as f:
            f.seek(offset)
            chunk = f.read(MAX_READ)
    except OSError:
        return False
    complete = chunk[: chunk.rfind(b"\n") + 1] if len(chunk) < MAX_READ or b"\n" in chunk else chunk
    lines = complete.splitlines()
    for raw in lines[:MAX_LOGGED]:
        _log_one(job_id, raw)
    if len(lines) > MAX_LOGGED:
        worker_log.warning("job %s: its storage guard refused %d more requests", job_id, len(lines) - MAX_LOGGED)
    if complete:
        tmp = directory / (FORWARDED + ".tmp")
        tmp.write_text(str(offset + len(complete)))
        tmp.replace(directory / FORWARDED)
    return len(chunk) == MAX_READ


def _log_one(job_id: str, raw: bytes) -> None:
    try:
        entry = json.loads(raw)
        method, target, reason = (str(entry[k])[:512] for k in ("method", "target", "reason"))
        level = logging.DEBUG if entry.get("routine") is True else logging.WARNING
    except (ValueError, KeyError, TypeError, AttributeError):
        worker_log.warning("job %s: its storage guard's refusal log holds a line that is not one: %r", job_id, raw[:200])
        return
    worker_log.log(level, "job %s: storage guard refused %s %r: %s", job_id, method[:16], target, reason)
