"""`trainjobs worker --provisioner gcp`: each job to the Google Cloud product that runs its accelerator.
TPU jobs go to Cloud TPU (tpu.py); GPU jobs, and CPU jobs, to Compute Engine VMs (compute.py: a CPU
job gets an n2-standard VM with two vCPUs per replica, rather than being refused, so one gcp worker fleet
runs every spec the API accepts).

create() and get() see the request, so they ask only the product of its accelerator: a project that
runs only TPU jobs needs no Compute Engine API, and the reverse. delete() and list() see names and
labels: a name is routed to the product it was last seen in by this process, else (a machine made by
another worker, being reaped) asked of both; there a product whose API is off, forbidden to us or not
served at all has no machines of ours, and is skipped with a warning instead of failing the other's jobs.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Callable
from typing import TypeVar

from trainjobs.spec import TpuAccelerator
from worker.ports import MachineInfo, MachineRequest, Provisioner

log = logging.getLogger("trainjobs.worker")
T = TypeVar("T")


class GcpProvisioner:
    kind = "gcp"

    def __init__(self, tpu: Provisioner, vm: Provisioner):
        self.tpu, self.vm = tpu, vm
        self._owner: dict[str, Provisioner] = {}  # machine name -> the product it was last seen in
        self._unavailable: set[str] = set()  # products already warned about

    def _for(self, request: MachineRequest) -> Provisioner:
        return self.tpu if isinstance(request.spec.accelerator, TpuAccelerator) else self.vm

    def create(self, request: MachineRequest) -> MachineInfo:
        provisioner = self._for(request)
        self._owner[request.name] = provisioner
        return provisioner.create(request)

    def get(self, request: MachineRequest) -> MachineInfo | None:
        provisioner = self._for(request)
        if (found := provisioner.get(request)) is not None:
            self._owner[request.name] = provisioner
        return found

    def delete(self, name: str) -> None:
        if (owner := self._owner.pop(name, None)) is not None:
            owner.delete(name)
            return
        for provisioner in (self.tpu, self.vm):
            self._ask(provisioner, lambda p: p.delete(name), None)

    def list(self, labels: dict[str, str]) -> builtins.list[MachineInfo]:
        found: builtins.list[MachineInfo] = []
        for provisioner in (self.tpu, self.vm):
            none: builtins.list[MachineInfo] = []
            machines = self._ask(provisioner, lambda p: p.list(labels), none)
            self._owner.update((m.name, provisioner) for m in machines)
            found += machines
        return found

    def _ask(self, provisioner: Provisioner, call: Callable[[Provisioner], T], instead: T) -> T:
        """call(provisioner), or `instead` when that product's API is disabled in the project (403
        SERVICE_DISABLED), forbidden to the worker (403) or not served at this endpoint (404): none of
        our machines can be there, and the other product's jobs must not fail for it."""
        from google.api_core import exceptions as gexc

        try:
            return call(provisioner)
        except (gexc.Forbidden, gexc.NotFound) as exc:
            if provisioner.kind not in self._unavailable:
                self._unavailable.add(provisioner.kind)
                log.warning("%s is unavailable to this worker, skipped when looking for machines: %s",
                            provisioner.kind, exc)
            return instead
