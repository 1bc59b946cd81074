"""The accelerators we can provision, and what each costs: one table, read by the spec validator
(which types and counts exist), the agent (compute capability decides `precision: auto`) and the
worker (limits.max_cost_usd).

Prices are rough on-demand list prices in USD per hour for us-central1, deliberately conservative
(on-demand even for spot); a local CPU run costs nothing.
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


def tpu_chips(tpu_type: str) -> int:
    gen, n = tpu_type.rsplit("-", 1)
    return int(n) // TPU_GENERATIONS[gen].units_per_chip
