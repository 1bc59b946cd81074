"""What a job's machines cost per hour, from the one accelerator catalogue (trainjobs/catalogue.py);
used to enforce limits.max_cost_usd."""

from __future__ import annotations

from trainjobs.catalogue import GPU_TYPES, TPU_GENERATIONS, tpu_chips
from trainjobs.spec import CpuAccelerator, GpuAccelerator, JobSpec, TpuAccelerator


def hourly_price_usd(spec: JobSpec) -> float:
    acc = spec.accelerator
    match acc:
        case TpuAccelerator():
            generation = acc.tpu_type.rsplit("-", 1)[0]
            return TPU_GENERATIONS[generation].usd_per_chip_hour * tpu_chips(acc.tpu_type)
        case GpuAccelerator():
            return GPU_TYPES[acc.gpu_type].usd_per_gpu_hour * acc.count * spec.workers
        case CpuAccelerator():
            return 0.0
