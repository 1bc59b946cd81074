"""On a cloud VM: keep the agent's storage token file current from the object the worker refreshes.

The startup script wrote the first token (from the VM's metadata) to TRAINJOBS_STORAGE_TOKEN_FILE; the
worker writes each new one to TRAINJOBS_STORAGE_TOKEN_URI in the job's directory, which the current token
can read (worker/gcp/job_tokens.py). The agent's storage client re-reads the file whenever its token
needs refreshing (trainjobs/storage.py), so copying the newer token in is all there is to do.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from datetime import datetime
from pathlib import Path

from trainjobs import storage

log = logging.getLogger("trainjobs.agent")

URI_ENV = "TRAINJOBS_STORAGE_TOKEN_URI"


def _expiry(data: object) -> datetime | None:
    try:
        assert isinstance(data, dict)
        return datetime.fromisoformat(str(data["expiry"]))
    except Exception:
        return None


def refresh_once(token_file: Path, uri: str) -> bool:
    """Copy the published token into the file if it outlives the one there; True when it did."""
    published = storage.read_json(uri)
    new = _expiry(published)
    if new is None or not isinstance(published, dict) or not isinstance(published.get("access_token"), str):
        return False
    try:
        current = _expiry(json.loads(token_file.read_text()))
    except (OSError, ValueError):
        current = None
    if current is not None and new <= current:
        return False
    tmp = token_file.with_name(token_file.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"access_token": published["access_token"], "expiry": published["expiry"]}, f)
    os.replace(tmp, token_file)
    return True


def start_token_refresh(every_s: float = 120.0) -> threading.Thread | None:
    """When this machine runs on published tokens: a thread that copies each new one in. Else None."""
    token_file, uri = os.environ.get(storage.TOKEN_FILE_ENV), os.environ.get(URI_ENV)
    if not token_file or not uri:
        return None
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            try:
                if refresh_once(Path(token_file), uri):
                    log.info("storage token renewed")
            except Exception as exc:  # the old token still works for a while; the watchdog judges outages
                log.warning("could not renew the storage token: %s", exc)

    thread = threading.Thread(target=loop, name="token-refresh", daemon=True)
    thread.start()
    return thread
