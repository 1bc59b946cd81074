"""The machines we can provision, and what each costs: one table, read by the spec validator
(which types and counts exist, which precisions a GPU computes in), the facts derived from a spec
(trainjobs/spec/derived.py: replicas, hosts, machine types, price, `precision: auto`) and the GCP
provisioner (the VM shape of a job).

Prices are rough on-demand list prices in USD per hour for us-central1, deliberately conservative
(on-demand even for spot). Every machine a job can get has one, CPU VMs included: a $0 CPU price once
made max_cost_usd never fire on the n2 VMs a gcp worker bills (issue 19).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TpuGeneration:
    # How the number in `v4-8` counts: v2/v3/v4/v5p name TensorCores, v5e (v5litepod) and v6e name
    # chips. TPUStrategy gets one replica per TensorCore on v2/v3 and one per chip on megacore (v4,
    # v5p) and single-core chips.
    units_per_replica: int
    replicas_per_host: int
    units_per_chip: int
    usd_per_chip_hour: float


TPU_GENERATIONS: dict[str, TpuGeneration] = {
    "v2": TpuGeneration(1, 8, 2, 1.125),
    "v3": TpuGeneration(1, 8, 2, 2.0),
    "v4": TpuGeneration(2, 4, 2, 3.22),
    "v5p": TpuGeneration(2, 4, 2, 4.2),
    "v5litepod": TpuGeneration(1, 8, 1, 1.2),
    "v6e": TpuGeneration(1, 8, 1, 2.7),
}


def tpu_generation(tpu_type: str) -> TpuGeneration:
    """The generation of an accelerator type the spec accepted (v4-8 -> v4)."""
    return TPU_GENERATIONS[tpu_type.rsplit("-", 1)[0]]


def _tpu_units(tpu_type: str) -> int:
    return int(tpu_type.rsplit("-", 1)[1])


def tpu_replicas(tpu_type: str) -> int:
    """TPUStrategy's replicas over the whole slice."""
    return _tpu_units(tpu_type) // tpu_generation(tpu_type).units_per_replica


def tpu_hosts(tpu_type: str) -> int:
    """The TPU VMs of the slice: a host drives replicas_per_host replicas."""
    return max(1, tpu_replicas(tpu_type) // tpu_generation(tpu_type).replicas_per_host)


def tpu_chips(tpu_type: str) -> int:
    return _tpu_units(tpu_type) // tpu_generation(tpu_type).units_per_chip


@dataclass(frozen=True)
class GpuType:
    compute_capability: float  # CUDA's; decides `precision: auto`
    counts: tuple[int, ...]  # attachment counts Compute Engine allows per VM
    usd_per_gpu_hour: float  # includes a share of the host VM


GPU_TYPES: dict[str, GpuType] = {
    "nvidia-tesla-t4": GpuType(7.5, (1, 2, 4), 0.55),
    "nvidia-tesla-v100": GpuType(7.0, (1, 2, 4, 8), 2.9),
    "nvidia-tesla-p100": GpuType(6.0, (1, 2, 4), 1.9),
    "nvidia-tesla-p4": GpuType(6.1, (1, 2, 4), 0.9),
    "nvidia-l4": GpuType(8.9, (1, 2, 4, 8), 0.85),
    "nvidia-tesla-a100": GpuType(8.0, (1, 2, 4, 8, 16), 3.7),
    "nvidia-a100-80gb": GpuType(8.0, (1, 2, 4, 8), 5.1),
    "nvidia-h100-80gb": GpuType(9.0, (1, 2, 4, 8), 11.1),
    "nvidia-h100-mega-80gb": GpuType(9.0, (8,), 11.6),
    "nvidia-h200-141gb": GpuType(9.0, (8,), 13.0),
}

# The compute capabilities that decide a GPU's precision (CUDA's numbering).
FLOAT16_MIN_CC = 6.0  # float16 arithmetic at all (Pascal): mixed_float16 is refused below it
FLOAT16_FAST_CC = 7.0  # tensor cores (Volta): from here mixed_float16 beats float32, so `precision: auto` picks it
BFLOAT16_MIN_CC = 8.0  # bfloat16 (Ampere): mixed_bfloat16 is refused below it


# The machine type Compute Engine pairs with each GPU type and count when the spec names none: the
# smallest of its family. A2, A3 and G2 machine types come with their GPUs attached (the count is in the
# name); N1 takes GPUs as guest accelerators, and we give each GPU 4 vCPUs (n1-standard-1 with a GPU is
# allowed but starves the input pipeline).
BUNDLED_GPU_MACHINES: dict[str, dict[int, str]] = {
    "nvidia-tesla-a100": {1: "a2-highgpu-1g", 2: "a2-highgpu-2g", 4: "a2-highgpu-4g", 8: "a2-highgpu-8g",
                          16: "a2-megagpu-16g"},
    "nvidia-a100-80gb": {1: "a2-ultragpu-1g", 2: "a2-ultragpu-2g", 4: "a2-ultragpu-4g", 8: "a2-ultragpu-8g"},
    "nvidia-h100-80gb": {1: "a3-highgpu-1g", 2: "a3-highgpu-2g", 4: "a3-highgpu-4g", 8: "a3-highgpu-8g"},
    "nvidia-h100-mega-80gb": {8: "a3-megagpu-8g"},
    "nvidia-h200-141gb": {8: "a3-ultragpu-8g"},
    "nvidia-l4": {1: "g2-standard-4", 2: "g2-standard-24", 4: "g2-standard-48", 8: "g2-standard-96"},
}


def default_gpu_machine_type(gpu_type: str, count: int) -> str:
    """The smallest machine type Compute Engine pairs with `count` GPUs of this type."""
    if (bundled := BUNDLED_GPU_MACHINES.get(gpu_type)) is not None:
        return bundled[count]
    return f"n1-standard-{4 * count}"


# G2 types with more vCPUs or memory per L4 than the defaults above.
_MORE_G2 = {"g2-standard-8": 1, "g2-standard-12": 1, "g2-standard-16": 1, "g2-standard-32": 1}


def bundled_gpus(machine_type: str) -> tuple[str, int] | None:
    """(GPU type, count) a machine type comes with, or None for a type that takes guest accelerators."""
    if machine_type in _MORE_G2:
        return "nvidia-l4", _MORE_G2[machine_type]
    for gpu_type, machines in BUNDLED_GPU_MACHINES.items():
        for count, name in machines.items():
            if name == machine_type:
                return gpu_type, count
    return None


# A CPU job on a gcp worker gets an n2-standard VM with two vCPUs per replica, the smallest size that
# has them (the largest for more): n2-standard-N exists for these N.
CPU_MACHINE_SIZES = (2, 4, 8, 16, 32, 48, 64, 80, 96, 128)
# N2 on-demand list prices in us-central1, from Compute Engine's "VM instance pricing" page (general-
# purpose N2: $0.031611 per vCPU-hour and $0.004237 per GB-hour), as read in 2024; n2-standard has 4 GB
# per vCPU. Spot VMs cost 60-91% less and their price moves; like the GPU and TPU rows we charge on-demand.
N2_USD_PER_VCPU_HOUR = 0.031611 + 4 * 0.004237


def cpu_machine_vcpus(replicas: int) -> int:
    return next((n for n in CPU_MACHINE_SIZES if n >= 2 * replicas), CPU_MACHINE_SIZES[-1])


def cpu_machine_type(replicas: int) -> str:
    """The n2-standard machine type a CPU job with this many replicas gets, per worker host."""
    return f"n2-standard-{cpu_machine_vcpus(replicas)}"


def cpu_usd_per_hour(replicas: int) -> float:
    return cpu_machine_vcpus(replicas) * N2_USD_PER_VCPU_HOUR


# What a spot machine costs as a share of the on-demand rows above, for the advisor's comparison of a
# preempted spot job with on-demand (trainjobs/advice.py), never for max_cost_usd, which charges on-demand.
# Google's pages for spot VMs, spot GPUs and spot TPUs give discounts of 60-91% that move with demand; the
# smallest discount makes this the dearest spot can be, so a spot job found dearer than on-demand
# is dearer at any price within that range.
SPOT_PRICE_FRACTION_MAX = 0.4
