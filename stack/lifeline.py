"""`trainjobs up`'s lifeline: a process that ends what `up` started once `up` is gone, however it went
(stack/lifetime.py says why this and not a parent-death signal).

`up` starts it before anything else, in a session of its own (a signal to `up`'s process group, a
terminal's Ctrl-C or hang-up, does not reach it), with its stdin the read end of a pipe whose write end
only `up` holds (non-inheritable: no process `up` starts has it). It reads that pipe and, every second,
looks at `up`'s pid and start time: EOF, or `up` gone, and it takes the data dir's lock and ends what
stack.json names, unless stack.json no longer names its `up` (that `up` ended in order and removed it, or
a later `up` has taken the data dir over). It then exits; its log is lifeline.log in the data dir.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

from stack.lifetime import Process, end_left, read_record, stack_lock
from trainjobs.module_command import module_command

MODULE = "stack.lifeline"
LOG_FILE = "lifeline.log"
_POLL_S = 1.0
log = logging.getLogger("trainjobs.stack")


def start_lifeline(data_dir: Path) -> int:
    """Start the lifeline of this process's stack in data_dir; return its pid. The pipe's write end stays
    open in this process until it exits: its EOF is the lifeline's signal."""
    up = Process.of(os.getpid())
    theirs, ours = os.pipe()  # both non-inheritable (PEP 446): only the lifeline gets `theirs`, as its stdin
    with (data_dir / LOG_FILE).open("ab") as out:
        proc = subprocess.Popen(module_command(MODULE, "--data-dir", str(data_dir), "--up",
                                                f"{up.pid}:{up.started}"), stdin=theirs, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    os.close(theirs)
    _held.append(ours)  # never closed here: it closes when this process ends
    return proc.pid


_held: list[int] = []


def wait_for_end(up: Process, channel: int) -> None:
    """Return once `up` has gone: EOF on `channel`, or its pid no longer the recorded process."""
    while True:
        readable, _, _ = select.select([channel], [], [], _POLL_S)
        if readable and not os.read(channel, 4096):
            return
        if not up.alive():
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    parser.add_argument("--data-dir", required=True, type=Path)
    parser.add_argument("--up", required=True, help="PID:START_TIME of the `trainjobs up` to outlive")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # `up` decides how it stops; this only follows
    pid, started = args.up.split(":")
    up = Process(int(pid), None if started == "None" else int(started))
    wait_for_end(up, sys.stdin.fileno())
    with stack_lock(args.data_dir):
        record = read_record(args.data_dir)
        if record is None or record.up != up:
            return 0  # it ended in order, or a later `up` owns the data dir now
        log.warning("trainjobs up (pid %d) is gone without stopping its stack; ending what it started", up.pid)
        stopped = end_left(args.data_dir, record, stop_postgres=record.postgres is not None)
    log.warning("stopped %s", ", ".join(stopped) or "nothing (all of it had ended)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
