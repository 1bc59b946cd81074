"""Staging runs in a child process with a memory limit (issue 36, finding 3).

Staging reads whatever a tenant hands it, in memory: a file that costs far more memory than its size
(a 1.4 KB .csv.gz cost 3.7 GB once) must fail its own job, not take down the worker that drives
every tenant's jobs. So each staging runs in a process of its own:

- Its memory is capped with RLIMIT_DATA (TRAINJOBS_STAGING_MEMORY_MB, default 2048): an allocation
  past it fails inside the child (numpy and Python raise MemoryError), and the job fails at STAGING
  with "staging ran out of its N MiB memory limit". RLIMIT_DATA, not RLIMIT_AS: since Linux 4.7 it
  counts every private writable mapping (heap and mmap alike) and not the address space allocators
  reserve without using, so the cap is close to the memory staging takes; a thread's stack counts
  whole (8 MiB: staging's pool of 8 download threads takes 64 MiB of it).
- Its time is capped (TRAINJOBS_STAGING_TIMEOUT_S, default 3600 s): a child that hangs is killed and
  the job fails at STAGING with the reason. A cancel or a stopping worker kills it at once.
- It answers with the staging's result or its exception, pickled as they are: DatasetError,
  ProgramError and StagingStopped reach the driver as they did in-process, and so do the storage
  errors the driver retries as outages. Its log lines are replayed into the worker's log.

Children are forked from a fork server (multiprocessing's "forkserver"): a small process started
once, with numpy, staging and the storage client imported, that forks a fresh child per staging. A
fork of the worker itself would copy a process with threads mid-flight (drivers, database pools,
HTTP clients) and the locks they hold; a fresh interpreter per staging ("spawn") pays the imports
every time (bench/staging_memory.py measures both). A fresh child per staging, rather than one
long-lived child, also gives each staging its own limit and hands its memory back when it ends.
The child ignores SIGINT and SIGTERM, its worker's to send it, and dies with the fork server, which
dies with the worker.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import pickle
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from functools import cache
from multiprocessing import forkserver
from multiprocessing.connection import Connection, wait
from multiprocessing.context import ForkServerContext
from typing import Any, TypeVar

from trainjobs.storage_limits import CallLimits, in_force, limited_calls
from worker.ports import DatasetError, StagingStopped
from worker.staging.budget import MEMORY_ENV, TIMEOUT_ENV

T = TypeVar("T")
_POLL_S = 0.2  # how often a waiting worker looks at its stop flag
_MAX_LOG_RECORDS = 1000  # a child's log lines replayed, at most
# Imported once in the fork server, so a child starts with them (an import costs every child otherwise).
_PRELOAD = ("worker.staging_adapter", "google.cloud.storage", "google.cloud.storage.transfer_manager",
            "sklearn.datasets", "PIL.Image")


class StagingCrashed(RuntimeError):
    """The child raised an error that cannot be sent back as it is; its type and text, and the child's
    traceback in a note. The driver retries it like any failed step."""


def run_in_child(fn: Callable[..., T], *args: Any, memory_mb: int, timeout_s: float,
                 should_stop: Callable[[], bool] = lambda: False) -> T:
    """fn(*args) in a fresh child with `memory_mb` of memory and `timeout_s` of time; its result, or
    the exception it raised. DatasetError when it runs out of either or dies; StagingStopped once
    should_stop() turns true (the child is killed)."""
    if should_stop():
        raise StagingStopped("staging stopped: the job was cancelled or the worker is stopping")
    ctx = _context()
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child_main, name="trainjobs-staging", daemon=True,
                        args=(send, fn, args, dict(os.environ), memory_mb << 20, in_force(),
                              logging.getLogger().getEffectiveLevel()))
    child.start()
    send.close()  # the child holds the only writer: its death is an EOF here
    try:
        answer = _wait_for_answer(child, receive, time.monotonic() + timeout_s, timeout_s, should_stop)
    finally:
        if child.exitcode is None:
            child.kill()
        child.join()
        receive.close()
    if answer is None:
        if should_stop():
            raise StagingStopped("staging stopped: the job was cancelled or the worker is stopping")
        code = child.exitcode or 0
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        raise DatasetError(f"staging's process ended without an answer ({how}): a dataset that needs more than "
                           f"its {memory_mb} MiB memory limit ({MEMORY_ENV}) can end it so, as can a reader "
                           "that crashes on the data")
    (kind, value), records = answer
    _replay(records)
    if kind == "out_of_memory":
        raise DatasetError(f"staging ran out of its {memory_mb} MiB memory limit ({MEMORY_ENV}): the dataset needs "
                           "more memory to convert than one staging may use")
    if kind == "raised":
        raise value
    return value  # type: ignore[no-any-return]


def _wait_for_answer(child: Any, receive: Connection, deadline: float, timeout_s: float,
                     should_stop: Callable[[], bool]) -> Any:
    """The child's answer, or None if it ended without one."""
    while True:
        ready = wait([receive, child.sentinel], timeout=_POLL_S)
        if receive in ready or (ready and receive.poll()):
            try:
                return receive.recv()
            except (EOFError, OSError):
                return None
        if ready:  # the child ended and said nothing
            return None
        if should_stop():
            raise StagingStopped("staging stopped: the job was cancelled or the worker is stopping")
        if time.monotonic() > deadline:
            raise DatasetError(f"staging took longer than {timeout_s:g} s, the most one staging may take "
                               f"({TIMEOUT_ENV}); it was stopped")


def warm_up() -> None:
    """Start the fork server now, in the background: its imports (seconds) then delay no job's staging."""
    threading.Thread(target=_start_fork_server, name="staging-fork-server", daemon=True).start()


def _start_fork_server() -> None:
    _context()  # its preload list first
    forkserver.ensure_running()


@cache
def _context() -> ForkServerContext:
    ctx = multiprocessing.get_context("forkserver")
    # The worker's own main module too: each child imports it again otherwise (multiprocessing's
    # children re-run __main__); preloaded, it costs the fork server that once.
    # A package's __main__ is never re-run there (and often runs its program when imported).
    main = sys.modules.get("__main__")
    main_name = getattr(getattr(main, "__spec__", None), "name", None)
    by_name = [main_name] if main_name and not main_name.endswith("__main__") else []
    ctx.set_forkserver_preload(["__main__", *by_name, *_PRELOAD])
    assert isinstance(ctx, ForkServerContext)
    return ctx


# --- in the child ------------------------------------------------------------------------------------


def _child_main(send: Connection, fn: Callable[..., Any], args: tuple[Any, ...], env: dict[str, str],
                memory_bytes: int, call_limits: CallLimits | None, log_level: int) -> None:
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides when its staging stops
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes, memory_bytes))
    os.environ.clear()  # the worker's environment now, not the fork server's at its start
    os.environ.update(env)
    records = _capture_logs(log_level)
    answer: tuple[str, Any]
    try:
        with limited_calls(call_limits) if call_limits is not None else nullcontext():
            answer = ("returned", fn(*args))
    except MemoryError:
        answer = ("out_of_memory", None)
    except BaseException as exc:  # noqa: BLE001 - every error goes back to the worker
        answer = ("raised", _portable(exc))
    try:
        send.send((answer, records))
    except MemoryError:
        send.send((("out_of_memory", None), []))


def _die_with_parent() -> None:
    """SIGKILL this child when the fork server ends (it ends with the worker): no staging outlives it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the worker's kill on stop still applies


def _portable(exc: BaseException) -> BaseException:
    """exc if it survives pickling, else a StagingCrashed that says what it was."""
    if not isinstance(exc, DatasetError | StagingStopped):
        exc.add_note("in the staging child:\n" + "".join(traceback.format_exception(exc)))
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - whatever the class does on pickling
        crashed = StagingCrashed(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")
        crashed.add_note("".join(traceback.format_exception(exc)))
        return crashed


class _Collected(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]):
        super().__init__()
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.records) >= _MAX_LOG_RECORDS:
            return
        # Sent as text: the arguments and the exception need not pickle.
        record.msg, record.args = record.getMessage(), None
        if record.exc_info:
            record.exc_text = "".join(traceback.format_exception(*record.exc_info))
            record.exc_info = None
        self.records.append(record)


def _capture_logs(level: int) -> list[logging.LogRecord]:
    records: list[logging.LogRecord] = []
    root = logging.getLogger()
    root.handlers[:] = [_Collected(records)]
    root.setLevel(level)
    return records


def _replay(records: list[logging.LogRecord]) -> None:
    for record in records:
        logger = logging.getLogger(record.name)
        if logger.isEnabledFor(record.levelno):
            logger.handle(record)
