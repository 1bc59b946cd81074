"""A machine must not outlive its job: the agent's watchdog, and what it does on a cloud VM.

The stop request it reads is the core's (trainjobs/stop_request.py); the metadata keys it reads, the
provisioners' (trainjobs/vm_metadata.py).

The worker deletes machines; the watchdog covers the cases where it cannot. The agent stops when the
control plane has written a stop request into the job directory (the job ended or was cancelled), or
when the job directory has been unreachable for `unreachable_s` (the control plane, its storage or the
network is gone). On a Cloud TPU VM it then deletes its own node through the TPU API, on a Compute
Engine VM its own instance through the Compute API, with the VM's own credentials from the metadata
server, so a dead control plane never leaves a machine billing. That needs a delete permission on the
VM's identity, which every tenant's code on every VM then shares: the README's minimal roles leave it
out, and then the agent only stops, and the worker's reaper deletes the machine.

Reads run on their own thread and the verdict on another: a read that hangs (a storage client retrying
a dead endpoint for minutes) counts as unreachable rather than stalling the watchdog with it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from trainjobs import storage
from trainjobs.job_paths import JobPaths
from trainjobs.vm_metadata import COMPUTE_API_KEY, INSTANCE_KEY, METADATA_URL, NODE_NAME_KEY, TPU_API_KEY

log = logging.getLogger("trainjobs.agent")


class Watchdog:
    def __init__(self, job_dir: str, on_stop: Callable[[str], None], *, every_s: float = 30.0,
                 unreachable_s: float = 300.0, read: Callable[[str], Any] = storage.read_json,
                 clock: Callable[[], float] = time.monotonic, attempt: int = 1):
        self.attempt = attempt
        self.control_uri = JobPaths.of(job_dir).control
        self.on_stop, self.every_s, self.unreachable_s, self.read, self.clock = on_stop, every_s, unreachable_s, read, clock
        self.last_reached = clock()
        self.stop_requested: str | None = None
        self.done = threading.Event()

    def poll(self) -> None:
        """One read of the job directory."""
        try:
            control = self.read(self.control_uri)
        except Exception as exc:
            log.warning("watchdog: cannot read %s: %s", self.control_uri, exc)
            return
        self.last_reached = self.clock()
        if not (isinstance(control, dict) and control.get("stop")):
            return
        upto = control.get("attempt")
        if upto is None or (isinstance(upto, int) and self.attempt <= upto):
            self.stop_requested = str(control.get("reason") or "the control plane stopped the job")

    def verdict(self) -> str | None:
        """Why the agent must stop now, or None."""
        if self.stop_requested is not None:
            return f"stop requested: {self.stop_requested}"
        silent = self.clock() - self.last_reached
        if silent > self.unreachable_s:
            return f"job directory {self.control_uri.rsplit('/', 1)[0]} unreachable for {silent:.0f}s"
        return None

    def start(self) -> None:
        threading.Thread(target=self._read_loop, name="watchdog-read", daemon=True).start()
        threading.Thread(target=self._judge_loop, name="watchdog", daemon=True).start()

    def _read_loop(self) -> None:
        while not self.done.is_set():
            self.poll()
            self.done.wait(self.every_s)

    def _judge_loop(self) -> None:
        while not self.done.wait(min(self.every_s, 5.0)):
            if (reason := self.verdict()) is not None:
                self.done.set()
                log.error("watchdog: %s; stopping this machine", reason)
                self.on_stop(reason)


def delete_own_tpu_node(metadata_url: str | None = None, timeout_s: float = 30.0) -> str | None:
    """On a Cloud TPU VM made by trainjobs: ask the TPU API to delete this node; return its name. None
    where there is no such node (a local machine, a VM without our metadata)."""
    return _delete_own(metadata_url, timeout_s, NODE_NAME_KEY, TPU_API_KEY, "https://tpu.googleapis.com", "v2")


def delete_own_instance(metadata_url: str | None = None, timeout_s: float = 30.0) -> str | None:
    """On a Compute Engine VM made by trainjobs: ask the Compute API to delete this instance; return its
    name. None where there is no such instance."""
    return _delete_own(metadata_url, timeout_s, INSTANCE_KEY, COMPUTE_API_KEY, "https://compute.googleapis.com",
                       "compute/v1")


def _delete_own(metadata_url: str | None, timeout_s: float, name_key: str, api_key: str, default_api: str,
                version: str) -> str | None:
    """DELETE {api}/{version}/{name}, with the name, the API and a token from this VM's metadata server."""
    import httpx

    base = metadata_url or os.environ.get("TRAINJOBS_METADATA_URL") or METADATA_URL
    if base == "off":  # a machine that is no cloud VM (the local provisioner's): nothing to ask
        return None
    headers = {"Metadata-Flavor": "Google"}
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=5.0) as meta:
            node = meta.get(f"/instance/attributes/{name_key}")
            if node.status_code != 200:
                return None
            api = meta.get(f"/instance/attributes/{api_key}")
            token = meta.get("/instance/service-accounts/default/token").json()["access_token"]
    except httpx.HTTPError:
        return None  # no metadata server: not a cloud VM
    endpoint = api.text if api.status_code == 200 else default_api
    response = httpx.delete(f"{endpoint.rstrip('/')}/{version}/{node.text}", headers={"Authorization": f"Bearer {token}"},
                            timeout=timeout_s)
    if response.status_code == 403:
        # The VM's identity may not delete machines: the README's minimal roles give it none, since a
        # shared identity that may delete its own node may delete every other tenant's too.
        raise PermissionError(f"this VM's identity may not delete {node.text}; the worker's reaper deletes it")
    if response.status_code not in (200, 404):
        raise RuntimeError(f"deleting {node.text} failed: {response.status_code} {response.text[:500]}")
    return node.text


def stop_this_machine(reason: str, exit_code: int = 143) -> None:
    """How the watchdog stops an agent that is not already writing its last status: delete our own node
    if we are on one, then exit at once, even while the main thread is stuck in storage retries (which
    is why this does not raise or wait for it)."""
    for delete_own in (delete_own_tpu_node, delete_own_instance):
        try:
            if (machine := delete_own()) is not None:
                log.error("watchdog: deleting %s (%s)", machine, reason)
                break
        except PermissionError as exc:
            log.warning("watchdog: %s (%s)", exc, reason)
            break
        except Exception:
            log.exception("watchdog: could not delete this machine")
    logging.shutdown()
    os._exit(exit_code)
