"""A local machine's processes as the provisioner knows them: by pid and start time (a pid alone may be
another process's by now), by the files they write into (an agent or guard started by a worker killed
before it could record the pid), and signalled by process group."""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def start_time(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (/proc/<pid>/stat, field 22): with the pid,
    it names one process for good. None once it has gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def same_process(record: dict, pid: int) -> bool:
    """pid is still the process the record noted (a record written before start times were kept
    trusts the pid, as before)."""
    started = record.get("started", {})
    if str(pid) not in started:
        return True
    return started[str(pid)] is not None and start_time(pid) == started[str(pid)]


def writing_into(directory: Path) -> list[int]:
    """The processes whose stdout or stderr is a file in `directory`: every agent and guard of a
    local machine writes its log there from its first instruction."""
    inside = f"{directory.resolve()}{os.sep}"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        for fd in (1, 2):
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}").startswith(inside):
                    found.append(int(entry))
                    break
            except OSError:
                continue  # gone, or not ours to look at
    return found


def signal_group(pid: int, sig: int) -> None:
    """Signal the process group pid leads (agents and guards start sessions of their own), or the
    process alone when it leads none (something a job's code started, found writing into the machine's
    directory). Callers pass only pids they know to be the machine's."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    except PermissionError:
        pass
