"""The GCS emulator the local stack and the tests start (stack/embedded.py) queues a burst of
connections instead of dropping them.

It serves one connection at a time. With http.server's listen backlog of 5, the kernel dropped every
connection past the fifth waiting one, and each such client sent again only 1, 3, 7... s later: on a
loaded machine, an agent's status writes landed seconds late (issue 19)."""

from __future__ import annotations

import os
import select
import signal
import socket
import time

from stack.embedded import start_gcs_emulator
from tests.support import scaled

BURST = 64  # more connections at once than local agents, guards and a worker open


def test_a_burst_of_connections_waits_for_a_busy_emulator_instead_of_being_dropped() -> None:
    emu = start_gcs_emulator(None, bucket="backlog-test")
    host, port = emu.url.removeprefix("http://").rsplit(":", 1)
    sockets = []
    os.kill(emu.process.pid, signal.SIGSTOP)  # busy: it accepts nothing while the burst arrives
    try:
        for _ in range(BURST):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex((host, int(port)))
            sockets.append(s)
        # A queued connection is established at once (the kernel answers for the listener); a
        # dropped one only after its SYN is resent, at the earliest a second later, and while the
        # emulator is stopped it is dropped again.
        pending = set(sockets)
        deadline = time.monotonic() + scaled(0.8)
        while pending and time.monotonic() < deadline:
            _, writable, _ = select.select([], list(pending), [], 0.05)
            pending -= {s for s in writable if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0}
        dropped = len(pending)
        assert dropped == 0, f"{dropped} of {BURST} connections were not queued"
    finally:
        os.kill(emu.process.pid, signal.SIGCONT)
        for s in sockets:
            s.close()
        emu.stop()
