"""What follows from a spec: each fact computed here once, from the spec and the catalogue.

Read by the spec's cross-section rules (trainjobs/spec/distribution.py), the API (what a job counts
against its project's accelerator quota), the dry run (trainjobs/machine_plan.py: machines and price),
the worker (the price limits.max_cost_usd is charged at, the replicas a local machine gives each host),
staging's preflight (the batch against the data) and the agent (agent/plan.py: the batch and learning
rate over the replicas it really got, the precision `auto` picks on the GPU it found). Before, the
default batch, divisibility, the batch against the data and the accelerators counted were each written
in two or three of those places (issue 19).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainjobs.catalogue import (
    FLOAT16_FAST_CC, SPOT_PRICE_FRACTION_MAX, GPU_TYPES, cpu_machine_type, cpu_usd_per_hour, default_gpu_machine_type, tpu_chips, tpu_generation,
)
from trainjobs.spec.accelerator import CpuAccelerator, GpuAccelerator, TpuAccelerator

if TYPE_CHECKING:
    from trainjobs.spec.job import JobSpec
    from trainjobs.spec.training import TrainingSpec

# --- the strategy, replicas and precision -------------------------------------------------------------


def resolve_strategy(spec: JobSpec) -> str:
    """`auto` as the issue defines it: TPU -> tpu, several workers -> multi-worker, several devices -> mirrored,
    one GPU -> one_device, else the default strategy."""
    if spec.strategy != "auto":
        return spec.strategy
    acc = spec.accelerator
    if isinstance(acc, TpuAccelerator):
        return "tpu"
    if spec.workers > 1:
        return "multi_worker_mirrored"
    if acc.replicas > 1:
        return "mirrored"
    if isinstance(acc, GpuAccelerator):
        return "one_device"
    return "default"


def replicas_per_worker(spec: JobSpec) -> int:
    """The replicas each worker host trains with: one under a one-device strategy, else its accelerator's."""
    if resolve_strategy(spec) in ("one_device", "default"):
        return 1
    return spec.accelerator.replicas


def num_replicas(spec: JobSpec) -> int:
    return replicas_per_worker(spec) * spec.workers


# Steps run inside one tf.function call when steps_per_execution is "auto" (agent/plan.py caps it at an
# epoch's steps). A TPU pays a host round-trip per call, so it gains most; a GPU some; a CPU little but
# still the Python overhead. Here, not in the agent, because the advisor reads it too (trainjobs/advice.py).
AUTO_STEPS_PER_EXECUTION: dict[str, int] = {"tpu": 32, "gpu": 8, "cpu": 4}


def resolve_precision(precision: str, kind: str, gpu_compute_capability: float | None) -> str:
    """The precision a job trains in on hardware of `kind` ("tpu", "gpu", "cpu"): `auto` is bfloat16 on a
    TPU, float16 on a GPU with tensor cores (older cards are faster in float32), float32 on a CPU."""
    if precision != "auto":
        return precision
    if kind == "tpu":
        return "mixed_bfloat16"
    if kind == "gpu":
        cc = gpu_compute_capability
        return "mixed_float16" if cc is not None and cc >= FLOAT16_FAST_CC else "float32"
    return "float32"


# --- the batch and the learning rate ---------------------------------------------------------------------

DEFAULT_PER_REPLICA_BATCH = 32


def global_batch_size(training: TrainingSpec, replicas: int) -> int:
    """The batch one step trains on over `replicas` replicas: training.global_batch_size as given, else
    per_replica_batch_size (default 32) on each replica."""
    if training.global_batch_size is not None:
        return training.global_batch_size
    return (training.per_replica_batch_size or DEFAULT_PER_REPLICA_BATCH) * replicas


def batch_split_problem(global_batch: int, replicas: int) -> str | None:
    """Why `global_batch` cannot be split evenly over the replicas (every replica gets the same share), else None."""
    if global_batch % replicas:
        return f"global batch {global_batch} does not divide evenly over {replicas} replicas"
    return None


def batch_fits_problem(global_batch: int, train_examples: int) -> str | None:
    """Why an epoch of the training split has no full step at this batch, else None."""
    if global_batch > train_examples:
        return (f"the global batch of {global_batch} is larger than the training split ({train_examples} examples); "
                "lower training.per_replica_batch_size or global_batch_size")
    return None


DEFAULT_LEARNING_RATE = 1e-3  # training.learning_rate `auto` but on a small table (agent/small_tables.py)


def scaled_learning_rate(training: TrainingSpec, global_batch: int, auto_rate: float = DEFAULT_LEARNING_RATE) -> float:
    """training.learning_rate scaled (lr_scaling) from lr_base_batch_size to `global_batch`; `auto` is `auto_rate`."""
    ratio = global_batch / training.lr_base_batch_size
    factor: float = {"none": 1.0, "linear": ratio, "sqrt": ratio**0.5}[training.lr_scaling]
    rate = auto_rate if training.learning_rate == "auto" else training.learning_rate
    return rate * factor


# --- the machines and their price -----------------------------------------------------------------------


def job_accelerators(spec: JobSpec) -> int:
    """What a job counts against its project's max_accelerators: TPU chips, or GPUs on every worker. CPU
    replicas count 0: they are bounded per job by TRAINJOBS_MAX_CPU_REPLICAS and per project by the job quota."""
    acc = spec.accelerator
    if isinstance(acc, TpuAccelerator):
        return tpu_chips(acc.tpu_type)
    if isinstance(acc, GpuAccelerator):
        return acc.count * spec.workers
    return 0


def hosts(spec: JobSpec) -> int:
    """The machines a job runs on: a TPU slice's hosts, else one VM per worker."""
    acc = spec.accelerator
    return acc.hosts if isinstance(acc, TpuAccelerator) else spec.workers


def vm_machine_type(acc: GpuAccelerator | CpuAccelerator) -> str:
    """The Compute Engine machine type of each of a GPU or CPU job's VMs: the one the spec names, else the
    smallest Compute Engine pairs with its GPUs; a CPU job gets an n2-standard VM, two vCPUs a replica."""
    if isinstance(acc, GpuAccelerator):
        return acc.machine_type or default_gpu_machine_type(acc.gpu_type, acc.count)
    return cpu_machine_type(acc.replicas)


def hourly_price_usd(spec: JobSpec) -> float:
    """On-demand list price of all the job's machines per hour, from the one catalogue: the dry run prints
    it and the worker enforces limits.max_cost_usd with it.

    The price of the machines the spec asks for on Google Cloud, whichever provisioner runs the job. The
    dry run cannot know the deployment (it calls no API), and the local stack stands in for the cloud: a
    local job costs nothing, but its max_cost_usd stops it when the same job on a gcp worker would be
    stopped, as it already did for GPU and TPU specs run locally."""
    acc = spec.accelerator
    if isinstance(acc, TpuAccelerator):
        return tpu_generation(acc.tpu_type).usd_per_chip_hour * job_accelerators(spec)
    if isinstance(acc, GpuAccelerator):
        return GPU_TYPES[acc.gpu_type].usd_per_gpu_hour * job_accelerators(spec)
    return cpu_usd_per_hour(acc.replicas) * spec.workers


def spot_hourly_price_usd(spec: JobSpec) -> float:
    """The most the job's machines cost per hour as spot machines (catalogue.SPOT_PRICE_FRACTION_MAX)."""
    return hourly_price_usd(spec) * SPOT_PRICE_FRACTION_MAX
