"""How a job spreads over its devices: spec.strategy, spec.precision and spec.workers against the
accelerator, and the batch over the replicas they make. These rules read several sections at once, so
JobSpec runs them once the sections are valid; the facts they read (replicas, the global batch) are
derived in trainjobs/spec/derived.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from trainjobs.catalogue import BFLOAT16_MIN_CC, FLOAT16_MIN_CC
from trainjobs.spec.accelerator import GpuAccelerator, TpuAccelerator
from trainjobs.spec.derived import batch_split_problem, global_batch_size, num_replicas
from trainjobs.spec.strict import fail
from trainjobs.spec.training import MAX_GLOBAL_BATCH

if TYPE_CHECKING:
    from trainjobs.spec.job import JobSpec

Strategy = Literal["auto", "default", "one_device", "mirrored", "multi_worker_mirrored", "tpu"]
Precision = Literal["auto", "float32", "mixed_float16", "mixed_bfloat16"]


def check_consistency(spec: JobSpec) -> None:
    """Refuse a strategy, precision or worker count the accelerator cannot train under, and a batch its
    replicas cannot share: the first contradiction, with the field to change."""
    acc, strategy = spec.accelerator, spec.strategy
    is_tpu = isinstance(acc, TpuAccelerator)
    if strategy == "tpu" and not is_tpu:
        raise fail("strategy", f"strategy 'tpu' needs a TPU accelerator, got {acc.type}")
    if is_tpu and strategy not in ("auto", "tpu"):
        raise fail("strategy", f"a TPU trains under strategy 'tpu' (or 'auto'), not {strategy!r}")
    if is_tpu and spec.precision == "mixed_float16":
        raise fail("precision", "TPUs compute in bfloat16: use mixed_bfloat16 (or auto), not mixed_float16")
    if is_tpu and spec.jit_compile is False:
        raise fail("jit_compile", "a TPU runs every step compiled by XLA: jit_compile false cannot hold there")
    if is_tpu and spec.workers != 1:
        raise fail("workers", "a TPU slice brings its own hosts: choose a bigger tpu_type instead of workers > 1")
    if strategy == "multi_worker_mirrored" and spec.workers < 2:
        raise fail("workers", "multi_worker_mirrored needs workers >= 2; use mirrored for one machine")
    if spec.workers > 1 and strategy not in ("auto", "multi_worker_mirrored"):
        raise fail("strategy", f"{spec.workers} workers train together only under multi_worker_mirrored, not {strategy!r}")
    if strategy in ("one_device", "default") and acc.replicas > 1:
        raise fail("strategy", f"{strategy!r} uses one device but the accelerator has {acc.replicas}; use mirrored or fewer devices")
    if isinstance(acc, GpuAccelerator) and spec.precision == "mixed_float16" and acc.compute_capability < FLOAT16_MIN_CC:
        raise fail("precision", f"{acc.gpu_type} has no fast float16")
    if spec.precision == "mixed_bfloat16" and isinstance(acc, GpuAccelerator) and acc.compute_capability < BFLOAT16_MIN_CC:
        raise fail("precision", f"{acc.gpu_type} (compute capability {acc.compute_capability}) has no bfloat16 support; use mixed_float16")
    replicas = num_replicas(spec)
    batch = global_batch_size(spec.training, replicas)
    if problem := batch_split_problem(batch, replicas):
        raise fail("training.global_batch_size", problem)
    if batch > MAX_GLOBAL_BATCH:
        raise fail("training.per_replica_batch_size", f"global batch {batch} is absurd (max {MAX_GLOBAL_BATCH})")
