"""A cloud VM's first storage token, delivered sealed to a key the VM made (README, "Security").

Node and instance metadata is no place for a token: every identity that may get the node reads it,
other tenants' VMs included. So at create the metadata holds no token, only the machine's name (the seal
is bound to it) and guest attributes turned on. Each host's startup script makes a key pair and
publishes the public key as a guest attribute, which only code on that host can write
(agent/first_token.py). Each time the provisioner sees the machine up it reads those keys through
the cloud API and, when a host has no envelope yet, writes the job's current token sealed to every
host's key into the metadata (trainjobs/sealed_token.py). Later tokens go through the job's own
directory as before (worker/gcp/job_tokens.py).

The cloud calls are the provisioners' (gcp_tpu.py, gcp_gpu.py); what to write is decided here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from trainjobs.sealed_token import SealError, canonical, recipients
from trainjobs.vm_metadata import GUEST_ATTRIBUTES_KEY, MACHINE_KEY, PUBLIC_KEY_ATTRIBUTE, PUBLIC_KEY_NAMESPACE
from trainjobs.sealed_token import seal_all

log = logging.getLogger("trainjobs.worker")

RECHECK_S = 30.0  # how often a machine whose every host has its envelope is asked again (a host restarted)


def create_metadata(machine: str) -> dict[str, str]:
    """What a machine that gets sealed tokens carries in its metadata from create: no token."""
    return {MACHINE_KEY: machine, GUEST_ATTRIBUTES_KEY: "TRUE"}


def published_keys(machine: str, entries: Iterable[tuple[str, str, str]]) -> list[str]:
    """The hosts' public keys among guest attribute entries (namespace, key, value); a value that is no
    key (code on the VM may write anything there) is skipped with a warning."""
    keys = []
    for namespace, key, value in entries:
        if (namespace, key) != (PUBLIC_KEY_NAMESPACE, PUBLIC_KEY_ATTRIBUTE):
            continue
        try:
            keys.append(canonical(value))
        except SealError as exc:
            log.warning("%s: a host published %r as its key, which is none: %s", machine, value[:80], exc)
    return sorted(set(keys))


def sealed_value(machine: str, keys: list[str], current: str | None, token: str) -> str | None:
    """The new sealed-token metadata value, or None when there is nothing to write (no host has published
    a key yet, or every published key already has its envelope)."""
    if not keys or set(keys) <= recipients(current):
        return None
    return seal_all(token, keys, machine)


class DueChecks:
    """When a provisioner reads a machine's published keys: at every look while a host has no envelope
    yet (it is waiting at boot), then every `recheck_s` (a host Google restarted makes a new key and
    waits again). So a running machine costs a guest-attribute read per half minute, not per poll."""

    def __init__(self, recheck_s: float = RECHECK_S, clock: Callable[[], float] = time.monotonic):
        self.recheck_s, self.clock = recheck_s, clock
        self._checked: dict[str, float] = {}  # machine -> when every host last had its envelope

    def due(self, machine: str, hosts: int, current: str | None) -> bool:
        if len(recipients(current)) < hosts:
            return True
        last = self._checked.setdefault(machine, self.clock())
        return self.clock() - last >= self.recheck_s

    def checked(self, machine: str) -> None:
        self._checked[machine] = self.clock()

    def forget(self, machine: str) -> None:
        self._checked.pop(machine, None)
