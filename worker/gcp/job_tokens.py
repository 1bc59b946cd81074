"""Per-job storage credentials on cloud VMs: the machine holds a token for its own job, nothing more.

The worker mints the job's downscoped token (worker/boundary/tokens.py, rules from worker/boundary/access.py)
and hands the first one to the VM sealed to a key the VM made at boot (worker/gcp/token_delivery.py: no
token in metadata, which other tenants' VMs may read); the startup script puts it in a file the agent's
storage client reads (TRAINJOBS_STORAGE_TOKEN_FILE). Later tokens go to an object in
the job's own directory (`_credentials/storage-token.json`), which the current token may read: the agent
copies each into its file before the old one expires (agent/token_refresh.py). So the VM's own
service account needs no access to job data at all, and the job's code, which can read everything its
machine can, reaches its dataset, its module and its own directory, and no other project's or job's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from trainjobs import storage
from trainjobs.job_paths import JobPaths
from worker.boundary.access import JobBoundary
from worker.boundary.tokens import Minter, TokenFileRefresher, downscoped_minter
from worker.ports import MachineRequest

log = logging.getLogger("trainjobs.worker")


def token_json(token: str, expiry: datetime) -> dict[str, str]:
    return {"access_token": token, "expiry": expiry.astimezone(UTC).isoformat()}


class JobTokens:
    """One refresher per machine, started at create (or when a new worker adopts the machine) and stopped
    at delete. `minter_for` turns a job's boundary into a token minter (default: downscoped from the
    worker's Application Default Credentials)."""

    def __init__(self, minter_for: Callable[[JobBoundary], Minter] = downscoped_minter, *, min_wait_s: float = 30.0):
        self.minter_for, self.min_wait_s = minter_for, min_wait_s
        self._refreshers: dict[str, TokenFileRefresher] = {}
        self._lock = threading.Lock()

    def start(self, request: MachineRequest) -> str:
        """Start keeping the request's machine's token fresh (if not yet); return its current token (JSON
        text), which the provisioner seals to the VM's key. The token's boundary is the request's, which the
        driver computed from the job's row."""
        import json

        name, boundary = request.name, request.storage_boundary()
        with self._lock:
            if (running := self._refreshers.get(name)) is not None and running.token and running.expiry:
                return json.dumps(token_json(running.token, running.expiry))
            uri = JobPaths.of(request.job_dir).storage_token
            refresher = TokenFileRefresher(
                None, self.minter_for(boundary), label=name, min_wait_s=self.min_wait_s,
                sink=lambda token, expiry: storage.write_json(uri, token_json(token, expiry)))
            refresher.start()
            self._refreshers[name] = refresher
            assert refresher.token is not None and refresher.expiry is not None
            return json.dumps(token_json(refresher.token, refresher.expiry))

    def keep(self, request: MachineRequest) -> None:
        """A machine this worker did not create (a dead worker's, adopted): keep its tokens coming, for
        the boundary the request carries (nothing the machine holds or its job wrote widens it)."""
        if request.name in self._refreshers:
            return
        try:
            self.start(request)
        except Exception as exc:  # the next look tries again; the VM's token lasts up to an hour
            log.warning("could not resume storage tokens for %s: %s", request.name, exc)

    def stop(self, name: str) -> None:
        with self._lock:
            if (refresher := self._refreshers.pop(name, None)) is not None:
                refresher.stop()

    def running(self) -> list[str]:
        with self._lock:
            return sorted(self._refreshers)


def default_job_tokens() -> JobTokens | None:
    """A cloud worker's: per-job tokens, unless its storage is the emulator, which checks no token (there
    the fake cloud's VMs use the emulator as the worker does; README, "Security")."""
    import os

    return None if os.environ.get("STORAGE_EMULATOR_HOST") else JobTokens()
