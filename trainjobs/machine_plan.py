"""What a job would create and what it costs per hour, from the spec and the one accelerator catalogue:
`trainjobs submit --dry-run` prints it without calling the API."""

from __future__ import annotations

from dataclasses import dataclass

from trainjobs.catalogue import (
    GPU_TYPES, TPU_GENERATIONS, cpu_machine_type, cpu_usd_per_hour, default_gpu_machine_type, tpu_chips,
)
from trainjobs.spec import CpuAccelerator, GpuAccelerator, JobSpec, TpuAccelerator


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


def hourly_price_usd(spec: JobSpec) -> float:
    """On-demand list price of all the job's machines per hour, from the one catalogue: the dry run prints
    it and the worker enforces limits.max_cost_usd with it.

    The price of the machines the spec asks for on Google Cloud, whichever provisioner runs the job. The
    dry run cannot know the deployment (it calls no API), and the local stack stands in for the cloud: a
    local job costs nothing, but its max_cost_usd stops it when the same job on a gcp worker would be
    stopped, as it already did for GPU and TPU specs run locally."""
    acc = spec.accelerator
    match acc:
        case TpuAccelerator():
            generation = acc.tpu_type.rsplit("-", 1)[0]
            return TPU_GENERATIONS[generation].usd_per_chip_hour * tpu_chips(acc.tpu_type)
        case GpuAccelerator():
            return GPU_TYPES[acc.gpu_type].usd_per_gpu_hour * acc.count * spec.workers
        case CpuAccelerator():
            return cpu_usd_per_hour(acc.replicas) * spec.workers


def plan_machines(spec: JobSpec) -> MachinePlan:
    acc, price = spec.accelerator, hourly_price_usd(spec)
    match acc:
        case TpuAccelerator():
            chips = tpu_chips(acc.tpu_type)
            return MachinePlan("Cloud TPU", f"{acc.tpu_type} ({chips} chips)", acc.hosts, acc.runtime_version, acc.spot,
                               price)
        case GpuAccelerator():
            machine = acc.machine_type or default_gpu_machine_type(acc.gpu_type, acc.count)
            per_vm = " each" if spec.workers > 1 else ""
            return MachinePlan("Compute Engine GPU VM", f"{acc.count} x {acc.gpu_type}, {machine}{per_vm}", spec.workers,
                               None, acc.spot, price)
        case CpuAccelerator():
            per_vm = " each" if spec.workers > 1 else ""
            return MachinePlan("CPU", f"{acc.replicas} replica(s), {cpu_machine_type(acc.replicas)} on GCP{per_vm}",
                               spec.workers, None, False, price)
