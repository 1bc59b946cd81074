"""Per-job storage credentials on Google Cloud: a token limited by the job's access boundary.

The worker mints it from its own credentials with a Credential Access Boundary
(`google.auth.downscoped`; rules from `worker/boundary/access.py`) and keeps it in a file the agent
reads (`trainjobs/storage.py`, TRAINJOBS_STORAGE_TOKEN_FILE), rewriting it well before it expires
for as long as the machine lives. The agent never holds the worker's credentials, so its code can
reach nothing the boundary leaves out, whatever it does with the token.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from worker.boundary.access import JobBoundary, access_boundary_rules

log = logging.getLogger("trainjobs.worker")

Minter = Callable[[], tuple[str, datetime]]  # -> (access token, when it expires, UTC)
RETRY_S = 30.0


def downscoped_minter(boundary: JobBoundary, source: Any = None) -> Minter:
    """Mints tokens for this boundary from `source` (default: the worker's Application Default
    Credentials). A downscoped token lives as long as the source token it came from, so a source
    token near its end is refreshed first."""
    import google.auth
    from google.auth import downscoped
    from google.auth.transport.requests import Request

    if source is None:
        source, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    rules = [downscoped.AccessBoundaryRule(
        available_resource=r["availableResource"], available_permissions=r["availablePermissions"],
        availability_condition=downscoped.AvailabilityCondition(
            r["availabilityCondition"]["expression"], title=r["availabilityCondition"]["title"]))
        for r in access_boundary_rules(boundary)]
    cab = downscoped.CredentialAccessBoundary(rules=rules)

    def mint() -> tuple[str, datetime]:
        if source.expiry is None or source.expiry - datetime.now(UTC).replace(tzinfo=None) < timedelta(minutes=20):
            source.refresh(Request())
        creds = downscoped.Credentials(source_credentials=source, credential_access_boundary=cab)
        creds.refresh(Request())
        token, expiry = creds.token, creds.expiry
        assert isinstance(token, str) and expiry is not None, "the token exchange answered without a token"
        return token, expiry.replace(tzinfo=UTC)

    return mint


def write_token_file(path: Path, token: str, expiry: datetime) -> None:
    """Whole or not at all (the agent may read it at any moment), readable by its owner only."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"access_token": token, "expiry": expiry.astimezone(UTC).isoformat()}, f)
    os.replace(tmp, path)


Sink = Callable[[str, datetime], None]  # (token, expiry) -> where the machine reads it


class TokenFileRefresher:
    """Keeps one job's token fresh: mints at start, then again when half the token's life is gone,
    and hands each token to `sink` (default: write the token file at `path`; a cloud VM's tokens go to
    an object in the job directory instead, worker/gcp/job_tokens.py). A failed mint or write is
    logged and retried; the agent keeps the old token until it expires."""

    def __init__(self, path: Path | None, mint: Minter, sink: Sink | None = None, *, label: str | None = None,
                 min_wait_s: float = RETRY_S):
        self.path, self.mint, self.min_wait_s = path, mint, min_wait_s
        self.label = label or (path.parent.name if path is not None else "token")
        if sink is None:
            assert path is not None, "a refresher needs a token file or a sink"
            sink = lambda token, expiry: write_token_file(path, token, expiry)  # noqa: E731
        self.sink = sink
        self.token: str | None = None  # the latest token handed over
        self.expiry: datetime | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Hand over the first token before returning: the agent starts right after."""
        expiry = self._refresh_once()
        if expiry is None:
            raise RuntimeError(f"could not mint a storage token for {self.label}")
        self._thread = threading.Thread(target=self._loop, args=(expiry,), name=f"token {self.label}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _refresh_once(self) -> datetime | None:
        try:
            token, expiry = self.mint()
            self.sink(token, expiry)
        except Exception as exc:
            log.warning("refreshing the storage token for %s failed: %s", self.label, exc)
            return None
        self.token, self.expiry = token, expiry
        return expiry

    def _loop(self, expiry: datetime) -> None:
        while True:
            left = (expiry - datetime.now(UTC)).total_seconds()
            if self._stop.wait(max(self.min_wait_s, left / 2)):
                return
            expiry = self._refresh_once() or expiry
