"""What `trainjobs up` started, written down in its data dir, and how all of it ends when `up` ends,
however `up` ends (issue 37: an `up` killed during its stop left a job's storage guard running for good).

`up` writes stack.json (`StackRecord`) before it starts anything, and again as each part starts: its own
pid and start time, whether the embedded PostgreSQL is its own, the emulator's pid and start time, its
worker's name. Three things then end what it started:

- `up` itself, on Ctrl-C or SIGTERM, in order (stack/cli.py).
- Its lifeline (stack/lifeline.py), a small process in a session of its own that `up` starts first: it
  reads a pipe only `up` holds the other end of, so EOF there means `up` is gone (SIGKILL included), and
  it then ends what stack.json names. Not a parent-death signal: PR_SET_PDEATHSIG fires when the *thread*
  that forked a process dies (a job's driver thread starts its machine's guard), and it cannot reach the
  embedded PostgreSQL, which pg_ctl leaves with no parent but init.
- A later `up` or `trainjobs down` on the same data dir, for what a lifeline could not end (killed with
  `up`): `end_left`.

The agent zygote and the staging fork server need none of this: each reads a channel only `up` holds and
ends at its EOF (agent/zygote.py, multiprocessing's fork server), and a staging child dies with its fork
server (worker/staging_child.py). A pid is signalled only while it is still the process recorded (its
start time), never one the kernel has given the pid to since.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stack.embedded import EMULATOR_MODULE, embedded_postgres_pid
from worker.local.processes import pid_alive, start_time

STACK_FILE = "stack.json"  # in the data dir while `up` runs
LOCK_FILE = "stack.lock"  # held while a stack is being started or ended, so two never act on one data dir at once
log = logging.getLogger("trainjobs.stack")


@dataclass(frozen=True)
class Process:
    """One process for good: its pid and its start time (clock ticks since boot, /proc/<pid>/stat)."""

    pid: int
    started: int | None

    @classmethod
    def of(cls, pid: int) -> Process:
        return cls(pid, start_time(pid))

    def alive(self) -> bool:
        """Still running, and still the process recorded (a recycled pid is someone else's)."""
        return self.started is not None and pid_alive(self.pid) and start_time(self.pid) == self.started


@dataclass
class StackRecord:
    """stack.json: what one `up` started in its data dir."""

    up: Process
    api_url: str = ""
    postgres: str | None = None  # the embedded server's directory, when this `up` stops it at the end
    database_url: str | None = None  # the embedded database's URL (never an operator's, which may hold a password)
    emulator: Process | None = None
    worker: str | None = None  # its worker's name: the jobs it leased are handed back when it is found dead

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> StackRecord:
        data = json.loads(text)
        if "up" not in data:  # written by an `up` from before start times were recorded
            data = {"up": _legacy(data.get("pid"), b"stack.cli", b"trainjobs"),
                    "api_url": data.get("api_url", ""), "postgres": data.get("postgres"),
                    "emulator": _legacy(data["emulator_pid"], EMULATOR_MODULE.encode())
                    if data.get("emulator_pid") else None}
        emulator = data.get("emulator")
        return cls(up=Process(**data["up"]), api_url=data.get("api_url", ""), postgres=data.get("postgres"),
                   database_url=data.get("database_url"), emulator=Process(**emulator) if emulator else None,
                   worker=data.get("worker"))


def _legacy(pid: Any, *names: bytes) -> dict[str, Any]:
    """A pid of an older stack.json, without its start time: that process only while its command line
    still names one of `names`, as that `up` checked it (after a crash the pid may be anyone's by now)."""
    try:
        argv = Path(f"/proc/{int(pid)}/cmdline").read_bytes()
    except (OSError, TypeError, ValueError):
        return {"pid": 0, "started": None}
    return {"pid": int(pid), "started": start_time(int(pid)) if any(n in argv for n in names) else None}


def read_record(data_dir: Path) -> StackRecord | None:
    try:
        return StackRecord.from_json((data_dir / STACK_FILE).read_text())
    except FileNotFoundError:
        return None
    except (ValueError, TypeError, KeyError):
        log.warning("%s is unreadable; ignoring it", data_dir / STACK_FILE)
        return None


def write_record(data_dir: Path, record: StackRecord) -> None:
    """Whole or not at all, readable by its user only (it names the database)."""
    path = data_dir / STACK_FILE
    partial = path.with_suffix(".json.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(record.to_json())
    os.replace(partial, path)


@contextmanager
def stack_lock(data_dir: Path) -> Iterator[None]:
    """The data dir's lock, held while a stack starts or is ended: a lifeline ending a killed `up`'s stack
    and a new `up` starting on the same data dir take turns, and the one that comes second sees what the
    first did."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def end_left(data_dir: Path, record: StackRecord | None, stop_postgres: bool) -> list[str]:
    """End what a stack left in data_dir once its `up` is gone: its local machines (agents, guards, the
    processes their jobs started), anything else still writing into the machines' directory (the zygote
    of an `up` killed a moment ago), its GCS emulator; hand its worker's jobs back; with `stop_postgres`,
    stop its embedded PostgreSQL. Removes stack.json. Returns what it stopped, as the user would name it. Call under `stack_lock`."""
    stopped: list[str] = []
    machines = data_dir / "machines"
    if machines.is_dir():
        stopped += [f"local machine {name}" for name in delete_local_machines(data_dir)]
        from worker.local.processes import signal_group, writing_into

        for pid in writing_into(machines):
            signal_group(pid, signal.SIGKILL)
            stopped.append(f"process {pid} of {machines}")
    for emulator in _emulators(data_dir, record):
        _end_group(emulator)
        stopped.append(f"GCS emulator (pid {emulator.pid})")
    if record is not None and record.worker and (url := _database_of(data_dir, record)) is not None:
        if released := release_leases(url, record.worker):
            stopped.append(f"{released} job(s) handed back for the next worker to recover")
    if stop_postgres:
        stopped += end_postgres(data_dir)
    (data_dir / STACK_FILE).unlink(missing_ok=True)
    return stopped


def _database_of(data_dir: Path, record: StackRecord) -> str | None:
    """The dead `up`'s database, if it can be reached now: its embedded one while it runs, or the operator's
    (TRAINJOBS_DATABASE_URL, in this process's environment as it was in `up`'s)."""
    if record.database_url is not None:
        return record.database_url if embedded_postgres_pid(data_dir / "postgres") is not None else None
    from trainjobs.config import database_url_from_env

    return database_url_from_env()


def end_postgres(data_dir: Path) -> list[str]:
    """Stop data_dir's embedded PostgreSQL if it runs."""
    if embedded_postgres_pid(data_dir / "postgres") is None:
        return []
    from stack.embedded import stop_embedded_postgres

    stop_embedded_postgres(data_dir / "postgres")
    return [f"embedded PostgreSQL ({data_dir / 'postgres'})"]


def delete_local_machines(data_dir: Path) -> list[str]:
    """The local provisioner's machines in data_dir (agent process groups and their storage guards).
    A job they ran is RUNNING in the database and is recovered by the next worker as a lost machine."""
    from worker.local.provisioner import LocalProvisioner
    from worker.local.sandbox import LocalIsolation

    # Only deletes: how machines would be isolated does not matter, and needs no probe of the host.
    machines = LocalProvisioner(data_dir / "machines", isolation=LocalIsolation(sandbox=False, trusted=True))
    names = [m.name for m in machines.list({})]
    for name in names:
        machines.delete(name)
    return names


def _emulators(data_dir: Path, record: StackRecord | None) -> list[Process]:
    """The recorded emulator while it is still itself, and any emulator serving data_dir's objects (one
    started by an `up` killed before it could record it): its command line names the module and the folder."""
    found = {record.emulator} if record and record.emulator and record.emulator.alive() else set()
    folder = str(data_dir / "gcs").encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if EMULATOR_MODULE.encode() in argv and folder in argv:
            found.add(Process.of(int(entry)))
    return sorted((p for p in found if p.alive()), key=lambda p: p.pid)


def _end_group(process: Process, grace_s: float = 5.0) -> None:
    """SIGTERM to the process's group (it leads a session of its own), SIGKILL after grace_s."""
    from worker.local.processes import signal_group

    signal_group(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while process.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if process.alive():
        signal_group(process.pid, signal.SIGKILL)


def release_leases(database_url: str, worker: str) -> int:
    """Hand back the jobs a dead `up`'s worker held, so the next worker recovers them at once (their
    machines are gone: a new attempt within max_retries) instead of after the lease. Best effort: a
    database that does not answer leaves the leases to lapse on their own."""
    from service.db.queue import release_leases_of
    from service.db.session import get_engine, session_factory, transaction

    try:
        with transaction(session_factory(get_engine(database_url, pool_size=1))) as session:
            return release_leases_of(session, worker)
    except Exception:  # noqa: BLE001 - whatever the database says, the rest of the stack must still end
        log.warning("could not hand back the jobs of worker %s; their leases lapse on their own", worker, exc_info=True)
        return 0
