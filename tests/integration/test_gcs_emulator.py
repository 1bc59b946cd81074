"""The GCS emulator the local stack and the tests start (stack/embedded.py) queues a burst of
connections instead of dropping them, and a connection that sends nothing holds no one else off.

With http.server's listen backlog of 5, the kernel dropped every connection past the fifth waiting
one, and each such client sent again only 1, 3, 7... s later: on a loaded machine, an agent's status
writes landed seconds late (issue 19). And it served one connection at a time: a two-worker agent
whose storage client had connected but not sent (TensorFlow's cluster set-up held the GIL) kept its
peer from reading its spec, and both waited for each other (stack/emulator_process.py)."""

from __future__ import annotations

import os
import select
import signal
import socket
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

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


def test_a_connection_that_sends_nothing_does_not_hold_off_other_clients() -> None:
    emu = start_gcs_emulator(None, bucket="idle-test")
    host, port = emu.url.removeprefix("http://").rsplit(":", 1)
    idle = socket.create_connection((host, int(port)))
    try:
        time.sleep(scaled(0.2))  # accepted: an emulator serving one connection at a time now reads only it
        # Writes and reads from many clients at once still come out whole: the emulator's storage
        # serves them one at a time.
        def put_and_get(i: int) -> bytes:
            body = f"object {i}".encode() * 1000
            put = urllib.request.Request(
                f"{emu.url}/upload/storage/v1/b/idle-test/o?uploadType=media&name=o{i}", data=body, method="POST",
                headers={"Content-Type": "application/octet-stream"})
            urllib.request.urlopen(put, timeout=scaled(10)).read()
            got = urllib.request.urlopen(f"{emu.url}/download/storage/v1/b/idle-test/o/o{i}?alt=media",
                                         timeout=scaled(10)).read()
            return got if got == body else b"mismatch"
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(put_and_get, range(16)))
        assert results == [f"object {i}".encode() * 1000 for i in range(16)]
    finally:
        idle.close()
        emu.stop()
