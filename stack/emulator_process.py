"""The GCS emulator's process, as stack/embedded.py starts it: gcp-storage-emulator's own main, with
two changes to how it runs, and what stack/emulator_requests.py adds (GCS's read preconditions, where
the emulator ignored them, and a count of the requests served).

- A listen backlog of 128, not http.server's 5: the emulator serves one connection at a time, and once
  5 wait the kernel drops new ones, whose clients resend after 1, 3, 7... s. Every local agent, guard
  and worker talks to it, so a loaded machine saw status writes seconds late (issue 19; 40 requests at
  once: half over 1 s before, none after).
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
import sys


def main() -> None:
    http.server.HTTPServer.request_queue_size = 128
    from stack import emulator_requests

    emulator_requests.install()
    if "--in-memory" in sys.argv:
        from gcp_storage_emulator.storage import Storage

        Storage._write_config_to_file = lambda self: None
    runpy.run_module("gcp_storage_emulator", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
