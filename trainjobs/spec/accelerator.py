"""spec.accelerator: the machine a job trains on, a Cloud TPU slice, GPUs or CPUs. Which types, sizes and
counts exist comes from the catalogue (trainjobs/catalogue.py), as does the slice arithmetic."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from trainjobs.catalogue import GPU_TYPES, TPU_GENERATIONS, tpu_hosts, tpu_replicas
from trainjobs.spec.strict import Int, StrictModel, fail
from trainjobs.tpu_runtimes import default_tpu_runtime, tpu_runtime_problem

# Matched with fullmatch: `$` also matches before a trailing newline.
_TPU_TYPE = re.compile(rf"({'|'.join(TPU_GENERATIONS)})-(\d{{1,4}})")


class TpuAccelerator(StrictModel):
    type: Literal["tpu"]
    tpu_type: str = Field(description="Cloud TPU accelerator type, e.g. v4-8, v5litepod-8, v6e-16.")
    runtime_version: str = Field(
        default="tpu-vm-tf-2.18.0-pjrt", min_length=1, max_length=100,
        description="TPU VM software version (image): a TensorFlow PJRT image, tpu-vm-tf-X.Y.Z-pjrt for one "
                    "host or tpu-vm-tf-X.Y.Z-pod-pjrt for a slice of several (TensorFlow 2.16 or newer). "
                    "Default: the tested 2.18.0 image of the slice's kind.",
    )
    topology: str | None = Field(default=None, pattern=r"^\d{1,3}x\d{1,3}(x\d{1,3})?$")
    spot: bool = False

    @model_validator(mode="before")
    @classmethod
    def _default_runtime(cls, data: Any) -> Any:
        """No runtime_version: the default image of the slice's kind (a multi-host slice needs a pod image)."""
        if isinstance(data, dict) and data.get("runtime_version") is None and isinstance(data.get("tpu_type"), str):
            if _TPU_TYPE.fullmatch(data["tpu_type"]) is not None:
                data = {**data, "runtime_version": default_tpu_runtime(tpu_hosts(data["tpu_type"]))}
        return data

    @model_validator(mode="after")
    def _usable_runtime(self) -> TpuAccelerator:
        # The agent trains with the image's own TensorFlow: refuse at submit what it cannot run on.
        if (problem := tpu_runtime_problem(self.runtime_version, self.hosts)) is not None:
            raise fail("runtime_version", problem)
        return self

    @field_validator("tpu_type")
    @classmethod
    def _known_type(cls, v: str) -> str:
        m = _TPU_TYPE.fullmatch(v)
        if not m:
            raise fail("tpu_type", f"unknown TPU type {v!r}: expected e.g. v4-8, v5litepod-8, v6e-8")
        gen, n = m.group(1), int(m.group(2))
        units = TPU_GENERATIONS[gen].units_per_replica
        if n < units or n % units or n & (n - 1):
            raise fail("tpu_type", f"{v!r} is not a TPU size Google sells (sizes are powers of two)")
        return v

    @property
    def replicas(self) -> int:
        return tpu_replicas(self.tpu_type)

    @property
    def hosts(self) -> int:
        return tpu_hosts(self.tpu_type)


class GpuAccelerator(StrictModel):
    type: Literal["gpu"]
    gpu_type: str
    count: Int = Field(default=1, ge=1, le=16)
    machine_type: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9]*(-[a-z0-9]+)+$")
    spot: bool = False

    @field_validator("gpu_type")
    @classmethod
    def _known_gpu(cls, v: str) -> str:
        if v not in GPU_TYPES:
            raise fail("gpu_type", f"unknown GPU type {v!r}; known: {', '.join(sorted(GPU_TYPES))}")
        return v

    @model_validator(mode="after")
    def _count_allowed(self) -> GpuAccelerator:
        allowed = GPU_TYPES[self.gpu_type].counts
        if self.count not in allowed:
            raise fail("count", f"{self.gpu_type} attaches in counts of {list(allowed)}, not {self.count}")
        return self

    @property
    def compute_capability(self) -> float:
        return GPU_TYPES[self.gpu_type].compute_capability

    @property
    def replicas(self) -> int:
        return self.count


class CpuAccelerator(StrictModel):
    type: Literal["cpu"]
    replicas: Int = Field(default=1, ge=1, le=64, description="CPU devices to train over (logical devices locally).")


Accelerator = Annotated[TpuAccelerator | GpuAccelerator | CpuAccelerator, Field(discriminator="type")]
