"""`trainjobs worker --provisioner gcp`: each job to the Google Cloud product that runs its accelerator.
TPU jobs go to Cloud TPU (gcp_tpu.py); GPU jobs, and CPU jobs, to Compute Engine VMs (gcp_gpu.py: a CPU
job gets an n2-standard VM with two vCPUs per replica, rather than being refused, so one gcp worker fleet
runs every spec the API accepts).

Only create() sees the spec; get() and delete() see a name. The name is routed to whichever provisioner
created it in this process, else (a machine made by another worker, being adopted or reaped) asked of
both: a machine lives in exactly one of them.
"""

from __future__ import annotations

import builtins

from trainjobs.spec import TpuAccelerator
from worker.provisioner import MachineInfo, MachineRequest, Provisioner


class GcpProvisioner:
    kind = "gcp"

    def __init__(self, tpu: Provisioner, vm: Provisioner):
        self.tpu, self.vm = tpu, vm
        self._owner: dict[str, Provisioner] = {}  # machine name -> the provisioner that has it

    def _for(self, request: MachineRequest) -> Provisioner:
        return self.tpu if isinstance(request.spec.accelerator, TpuAccelerator) else self.vm

    def create(self, request: MachineRequest) -> MachineInfo:
        provisioner = self._for(request)
        self._owner[request.name] = provisioner
        return provisioner.create(request)

    def get(self, name: str) -> MachineInfo | None:
        if (owner := self._owner.get(name)) is not None:
            return owner.get(name)
        for provisioner in (self.vm, self.tpu):
            if (found := provisioner.get(name)) is not None:
                self._owner[name] = provisioner
                return found
        return None

    def delete(self, name: str) -> None:
        owner = self._owner.pop(name, None)
        for provisioner in (owner,) if owner is not None else (self.vm, self.tpu):
            provisioner.delete(name)

    def list(self, labels: dict[str, str]) -> builtins.list[MachineInfo]:
        return self.vm.list(labels) + self.tpu.list(labels)
