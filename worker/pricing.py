"""Rough on-demand list prices (USD per hour) used to enforce limits.max_cost_usd.

An estimate, deliberately conservative (on-demand prices even for spot), from public Cloud TPU and
Compute Engine GPU price lists for us-central1; a local CPU run costs nothing.
"""

from __future__ import annotations

from trainjobs.spec import CpuAccelerator, GpuAccelerator, JobSpec, TpuAccelerator

# per chip-hour (TPU) or per GPU-hour, GPU prices include a share of the host VM.
_TPU_CHIP_HOUR = {"v2": 1.125, "v3": 2.0, "v4": 3.22, "v5p": 4.2, "v5litepod": 1.2, "v6e": 2.7}
_GPU_HOUR = {
    "nvidia-tesla-t4": 0.55, "nvidia-tesla-v100": 2.9, "nvidia-tesla-p100": 1.9, "nvidia-tesla-p4": 0.9,
    "nvidia-l4": 0.85, "nvidia-tesla-a100": 3.7, "nvidia-a100-80gb": 5.1, "nvidia-h100-80gb": 11.1,
    "nvidia-h100-mega-80gb": 11.6, "nvidia-h200-141gb": 13.0,
}


def hourly_price_usd(spec: JobSpec) -> float:
    acc = spec.accelerator
    match acc:
        case TpuAccelerator():
            gen, n = acc.tpu_type.rsplit("-", 1)
            chips = int(n) // (2 if gen in ("v2", "v3", "v4", "v5p") else 1)
            return _TPU_CHIP_HOUR[gen] * chips
        case GpuAccelerator():
            return _GPU_HOUR[acc.gpu_type] * acc.count * spec.workers
        case CpuAccelerator():
            return 0.0
