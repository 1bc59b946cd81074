"""The GCS emulator's process, as stack/embedded.py starts it: gcp-storage-emulator's own main, with
three changes to how it runs, and what stack/emulator_requests.py adds (GCS's read preconditions, where
the emulator ignored them, and a count of the requests served).

- Each connection has a thread, and the requests are served one at a time (a lock around the
  emulator's router). It used to serve one connection at a time: a client that opened a connection
  and did not send its request held every other client off. A two-worker agent did just that (a
  storage client's background thread had connected when TensorFlow's cluster set-up took the GIL),
  so its peer could not read its spec and both waited for each other until the test's timeout (seen
  once, in an image run of stop 33). GCS serves connections in parallel; the lock keeps the
  emulator's own storage, which is not thread-safe, serving one request at a time, as before.

- A listen backlog of 128, not http.server's 5: once 5 connections wait to be accepted the kernel
  drops new ones, whose clients resend after 1, 3, 7... s. Every local agent, guard and worker talks
  to it, and on a loaded machine its accepting thread falls behind a burst: status writes landed
  seconds late (issue 19, when it served one connection at a time; 40 requests at once: half over 1 s
  before, none after).
- In memory (`--in-memory`), no metadata file. The emulator rewrites one JSON document of every
  object's metadata after each write or delete, so a write costs time in proportion to what the
  emulator holds (8 ms with an empty store, 53 ms with 3,000 objects, measured on this 2-core machine),
  and an in-memory store only ever reads that document when it starts, empty. The test suite's
  emulators hold thousands of objects by the end of a run. With a data directory the document is how
  objects survive a restart, so it is kept.
"""

from __future__ import annotations

import http.server
import runpy
import socketserver
import sys
import threading
from typing import Any


class _ConnectionThreads(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True  # a connection left open does not keep the process from stopping


def main() -> None:
    http.server.HTTPServer.request_queue_size = 128
    from gcp_storage_emulator import server

    server.server.HTTPServer = _ConnectionThreads  # what APIThread.run builds (the module's `from http import server`)
    handle, one_at_a_time = server.Router.handle, threading.Lock()

    def serialized(router: Any, method: str) -> None:
        with one_at_a_time:
            handle(router, method)

    server.Router.handle = serialized
    from stack import emulator_requests

    emulator_requests.install()
    if "--in-memory" in sys.argv:
        from gcp_storage_emulator.storage import Storage

        Storage._write_config_to_file = lambda self: None
    runpy.run_module("gcp_storage_emulator", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
