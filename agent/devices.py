"""Find the accelerators and build the tf.distribute strategy over them.

TRAINJOBS_LOCAL_DEVICES=N marks a local stand-in: N logical CPU devices stand in for the requested
hardware. A TPU job or an N-GPU job then trains under MirroredStrategy over those CPUs (there is no
TPU runtime to emulate), with the precision and steps_per_execution the real hardware would get.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from trainjobs.spec import GpuAccelerator, JobSpec
from agent.plan import Hardware, PlanError, requested_kind

log = logging.getLogger("trainjobs.agent")

LOCAL_DEVICES_ENV = "TRAINJOBS_LOCAL_DEVICES"


def local_device_count() -> int | None:
    raw = os.environ.get(LOCAL_DEVICES_ENV)
    if not raw:
        return None
    n = int(raw)
    if n < 1:
        raise PlanError(f"{LOCAL_DEVICES_ENV} must be >= 1, got {raw!r}")
    return n


def configure_local_devices(n: int) -> None:
    """Split the CPU into n logical devices. Must run before TensorFlow initialises its runtime."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)])


def detect_hardware(spec: JobSpec) -> Hardware:
    import tensorflow as tf

    kind = requested_kind(spec)
    local = local_device_count()
    if local is not None:
        cc = spec.accelerator.compute_capability if isinstance(spec.accelerator, GpuAccelerator) else None
        return Hardware(kind, local, cc, local_devices=local, cpu_bfloat16=cpu_bfloat16() if kind == "cpu" else None)
    if kind == "tpu":
        return Hardware("tpu", spec.accelerator.replicas)  # the TPU resolver reports the truth later
    if kind == "gpu":
        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            raise PlanError(f"the spec asks for {spec.accelerator.replicas} GPU(s) but TensorFlow sees none on this machine")
        details = tf.config.experimental.get_device_details(gpus[0])
        major, minor = details.get("compute_capability", (0, 0))
        return Hardware("gpu", len(gpus), float(f"{major}.{minor}"))
    return Hardware("cpu", 1, cpu_bfloat16=cpu_bfloat16())


# /proc/cpuinfo's flags for the instructions oneDNN runs bfloat16 matmuls and convolutions on, best first.
BFLOAT16_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_bfloat16(cpuinfo: str | None = None) -> str | None:
    """The first of BFLOAT16_FLAGS this CPU has (None: none, or no /proc/cpuinfo to read)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            flags.update(value.split())
    return next((f for f in BFLOAT16_FLAGS if f in flags), None)


def build_strategy(name: str, hardware: Hardware) -> Any:
    import tensorflow as tf

    if hardware.local_devices is not None:
        # Listing logical devices starts TensorFlow's runtime, after which collectives can no
        # longer be configured: MultiWorkerMirroredStrategy must come before it.
        match name:
            case "multi_worker_mirrored":
                return tf.distribute.MultiWorkerMirroredStrategy()
            case "mirrored":
                return tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])
            case "one_device":
                return tf.distribute.OneDeviceStrategy("/cpu:0")
            case "default":
                return tf.distribute.get_strategy()
    match name:
        case "tpu":
            # On a TPU VM the chips are local; a pod names itself in TPU_NAME.
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=os.environ.get("TPU_NAME", "local"))
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
            return tf.distribute.TPUStrategy(resolver)
        case "mirrored":
            return tf.distribute.MirroredStrategy()
        case "multi_worker_mirrored":
            options = None
            if hardware.kind == "gpu":
                options = tf.distribute.experimental.CommunicationOptions(
                    implementation=tf.distribute.experimental.CommunicationImplementation.NCCL)
            return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        case "one_device":
            return tf.distribute.OneDeviceStrategy("/gpu:0" if hardware.kind == "gpu" else "/cpu:0")
        case "default":
            return tf.distribute.get_strategy()
    raise PlanError(f"unknown strategy {name!r}")
