"""What follows from a spec is computed once (trainjobs/spec/derived.py), so submit, staging, the dry run,
the quota and the agent's plan cannot disagree about it: the default batch, its split over the replicas,
the batch against the data, `precision: auto`, the accelerators a job holds, its machines and their price."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from agent.plan import Hardware, PlanError, resolve_plan
from trainjobs.catalogue import GPU_TYPES, TPU_GENERATIONS
from trainjobs.machine_plan import plan_machines
from trainjobs.spec import CpuAccelerator, GpuAccelerator, JobSpec, describe_errors
from trainjobs.spec.derived import (
    batch_fits_problem, batch_split_problem, hourly_price_usd, job_accelerators, resolve_precision, vm_machine_type,
)
from worker.staging.preflight import plan_problems


def _spec(**overrides: Any) -> JobSpec:
    return JobSpec.model_validate({"dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp"}, **overrides})


def _manifest(train_examples: int) -> dict[str, Any]:
    return {"splits": {"train": {"examples": train_examples}}, "feature": {"shape": [64]}}


def _plan(spec: JobSpec, replicas: int, train_examples: int = 1437) -> Any:
    return resolve_plan(spec, Hardware("cpu", replicas, local_devices=replicas), "mirrored", replicas, train_examples)


def test_the_default_batch_is_32_a_replica_at_submit_in_staging_and_on_the_machine() -> None:
    spec = _spec(accelerator={"type": "cpu", "replicas": 2})
    assert spec.global_batch_size == _plan(spec, 2).global_batch_size == 64
    assert plan_problems(spec, _manifest(64)) == []


def test_a_batch_larger_than_the_data_is_refused_in_the_same_words_by_staging_and_the_agent() -> None:
    spec = _spec(accelerator={"type": "cpu", "replicas": 2})
    problem = batch_fits_problem(64, 63)
    assert problem is not None and "larger than the training split (63 examples)" in problem
    assert plan_problems(spec, _manifest(63)) == [problem]
    with pytest.raises(PlanError) as refused:
        _plan(spec, 2, train_examples=63)
    assert str(refused.value) == problem


def test_a_global_batch_that_does_not_split_evenly_is_refused_at_submit_and_on_a_machine_with_other_replicas() -> None:
    with pytest.raises(ValidationError) as refused:
        _spec(accelerator={"type": "cpu", "replicas": 2}, training={"global_batch_size": 33})
    assert describe_errors([dict(e) for e in refused.value.errors()]) == [
        {"field": "training.global_batch_size", "reason": batch_split_problem(33, 2)}]
    # Accepted for the 2 replicas asked for, but this machine's strategy reports 3.
    spec = _spec(accelerator={"type": "cpu", "replicas": 2}, training={"global_batch_size": 32})
    with pytest.raises(PlanError, match="global batch 32 does not divide evenly over 3 replicas"):
        _plan(spec, 3)


@pytest.mark.parametrize(("precision", "kind", "cc", "resolved"), [
    ("auto", "tpu", None, "mixed_bfloat16"),
    ("auto", "gpu", 7.0, "mixed_float16"),  # tensor cores from Volta on
    ("auto", "gpu", 6.1, "float32"),  # older cards are faster in float32
    ("auto", "gpu", None, "float32"),
    ("auto", "cpu", None, "float32"),
    ("mixed_float16", "gpu", 6.0, "mixed_float16"),  # asked for: kept
])
def test_precision_auto_follows_the_hardware(precision: str, kind: str, cc: float | None, resolved: str) -> None:
    assert resolve_precision(precision, kind, cc) == resolved


@pytest.mark.parametrize(("tpu_type", "replicas", "hosts", "chips"), [
    ("v2-8", 8, 1, 4),  # v2/v3 name TensorCores, one replica each, two a chip
    ("v4-8", 4, 1, 4),  # v4 names TensorCores, one replica a (megacore) chip
    ("v4-32", 16, 4, 16),
    ("v5litepod-16", 16, 2, 16),  # v5e names chips
    ("v6e-8", 8, 1, 8),
])
def test_a_tpu_slice_counts_its_replicas_hosts_and_chips_from_the_catalogue(
        tpu_type: str, replicas: int, hosts: int, chips: int) -> None:
    spec = _spec(accelerator={"type": "tpu", "tpu_type": tpu_type})
    plan = plan_machines(spec)
    assert (spec.num_replicas, plan.hosts, job_accelerators(spec)) == (replicas, hosts, chips)
    generation = TPU_GENERATIONS[tpu_type.rsplit("-", 1)[0]]
    assert hourly_price_usd(spec) == pytest.approx(generation.usd_per_chip_hour * chips)


def test_a_gpu_job_holds_and_pays_for_the_gpus_of_every_worker() -> None:
    spec = _spec(accelerator={"type": "gpu", "gpu_type": "nvidia-l4", "count": 2}, workers=2)
    assert job_accelerators(spec) == 4
    assert hourly_price_usd(spec) == pytest.approx(4 * GPU_TYPES["nvidia-l4"].usd_per_gpu_hour)
    assert plan_machines(spec).hosts == 2


def test_a_cpu_job_holds_no_accelerator_but_pays_for_its_vms() -> None:
    spec = _spec(accelerator={"type": "cpu", "replicas": 2}, workers=2)
    assert job_accelerators(spec) == 0
    assert hourly_price_usd(spec) > 0


@pytest.mark.parametrize(("accelerator", "machine_type"), [
    ({"type": "gpu", "gpu_type": "nvidia-l4", "count": 2}, "g2-standard-24"),  # comes with its GPUs
    ({"type": "gpu", "gpu_type": "nvidia-tesla-t4", "count": 2}, "n1-standard-8"),  # 4 vCPUs a guest GPU
    ({"type": "gpu", "gpu_type": "nvidia-tesla-t4", "count": 1, "machine_type": "n1-highmem-8"}, "n1-highmem-8"),
    ({"type": "cpu", "replicas": 2}, "n2-standard-4"),  # two vCPUs a replica
    ({"type": "cpu", "replicas": 64}, "n2-standard-128"),
])
def test_each_vm_gets_the_machine_type_the_dry_run_shows(accelerator: dict[str, Any], machine_type: str) -> None:
    spec = _spec(accelerator=accelerator)
    assert isinstance(spec.accelerator, GpuAccelerator | CpuAccelerator)
    assert vm_machine_type(spec.accelerator) == machine_type
    assert machine_type in plan_machines(spec).type
