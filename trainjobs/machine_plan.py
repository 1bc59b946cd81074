"""What a job would create and what it costs per hour, as `trainjobs submit --dry-run` prints it without
calling the API. The facts (hosts, machine types, the price) are the ones the worker and the provisioners
use: trainjobs/spec/derived.py."""

from __future__ import annotations

from dataclasses import dataclass

from trainjobs.spec import CpuAccelerator, GpuAccelerator, JobSpec, TpuAccelerator
from trainjobs.spec.derived import hosts, hourly_price_usd, job_accelerators, vm_machine_type


@dataclass(frozen=True)
class MachinePlan:
    kind: str  # "Cloud TPU", "Compute Engine GPU VM", "CPU"
    type: str  # v5litepod-8, 2 x nvidia-l4, 4 CPU replicas
    hosts: int
    runtime: str | None
    spot: bool
    usd_per_hour: float

    def lines(self, zone: str | None) -> list[str]:
        return [
            f"machine:   {self.kind} {self.type}",
            f"zone:      {zone or 'the worker’s TRAINJOBS_GCP_ZONE (not set here)'}",
            f"runtime:   {self.runtime or '-'}",
            f"spot:      {'yes' if self.spot else 'no'}",
            f"hosts:     {self.hosts}",
            f"estimated: {self.usd_per_hour:.2f} USD/hour (on-demand list price{'; spot usually costs less' if self.spot else ''})",
        ]


def plan_machines(spec: JobSpec) -> MachinePlan:
    acc, price = spec.accelerator, hourly_price_usd(spec)
    per_vm = " each" if spec.workers > 1 else ""
    match acc:
        case TpuAccelerator():
            return MachinePlan("Cloud TPU", f"{acc.tpu_type} ({job_accelerators(spec)} chips)", hosts(spec),
                               acc.runtime_version, acc.spot, price)
        case GpuAccelerator():
            return MachinePlan("Compute Engine GPU VM", f"{acc.count} x {acc.gpu_type}, {vm_machine_type(acc)}{per_vm}",
                               hosts(spec), None, acc.spot, price)
        case CpuAccelerator():
            return MachinePlan("CPU", f"{acc.replicas} replica(s), {vm_machine_type(acc)} on GCP{per_vm}",
                               hosts(spec), None, False, price)
