"""Where a Google Cloud worker creates machines, read once from the environment (README, "Running on
Google Cloud"). Credentials are not here: the clients find Application Default Credentials themselves."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


class ConfigError(ValueError):
    """A TRAINJOBS_GCP_* variable is missing or malformed; the message names it."""


@dataclass(frozen=True)
class GcpConfig:
    project: str
    zone: str
    fallback_zones: tuple[str, ...] = ()  # tried in order when `zone` has no capacity
    service_account: str | None = None  # the VM's identity; it needs the bucket (README)
    network: str | None = None
    subnetwork: str | None = None
    tags: tuple[str, ...] = ()  # network tags, for firewall rules
    capacity_wait_s: float = 1800.0  # how long a job waits for a stocked-out type before it fails
    tpu_api_endpoint: str | None = None  # http://host:port: a fake TPU API (anonymous, REST)
    compute_api_endpoint: str | None = None  # http://host:port: a fake Compute Engine API (anonymous, REST)
    # Compute Engine VMs boot from the newest image of this family (resolved at each create). The defaults'
    # TensorFlow (2.17) is one `make test-images` runs the agent under (tests/unit/test_default_images.py).
    image_project: str = "deeplearning-platform-release"
    gpu_image_family: str = "tf-2-17-cu121-ubuntu-2204-py310"
    cpu_image_family: str = "tf-2-17-cpu-ubuntu-2204-py310"
    boot_disk_gb: int = 200
    tf_port: int = 2222  # multi-worker jobs: host i of a job listens on tf_port + i (TF_CONFIG)
    # How often a worker lists its machines in each zone for all its jobs (worker/gcp/machine_watch.py):
    # a preemption shows within it; the project's read quota pays 60/watch_every_s listings a minute.
    watch_every_s: float = 20.0

    @property
    def zones(self) -> tuple[str, ...]:
        return (self.zone, *self.fallback_zones)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> GcpConfig:
        def get(name: str) -> str | None:
            return env.get(f"TRAINJOBS_{name}", "").strip() or None

        def required(name: str) -> str:
            if (value := get(name)) is None:
                raise ConfigError(f"TRAINJOBS_{name} is not set: the Google Cloud provisioner needs it")
            return value

        def words(name: str) -> tuple[str, ...]:
            return tuple(w.strip() for w in (get(name) or "").split(",") if w.strip())

        wait = get("GCP_CAPACITY_WAIT_MINUTES") or "30"
        try:
            capacity_wait_s = float(wait) * 60
        except ValueError:
            raise ConfigError(f"TRAINJOBS_GCP_CAPACITY_WAIT_MINUTES must be a number of minutes, got {wait!r}") from None

        def number(name: str, default: int) -> int:
            raw = get(name) or str(default)
            if not raw.isdigit() or int(raw) < 1:
                raise ConfigError(f"TRAINJOBS_{name} must be a positive whole number, got {raw!r}")
            return int(raw)

        defaults = cls("", "")
        return cls(
            image_project=get("GCP_IMAGE_PROJECT") or defaults.image_project,
            gpu_image_family=get("GCP_GPU_IMAGE_FAMILY") or defaults.gpu_image_family,
            cpu_image_family=get("GCP_CPU_IMAGE_FAMILY") or defaults.cpu_image_family,
            boot_disk_gb=number("GCP_BOOT_DISK_GB", defaults.boot_disk_gb), tf_port=number("GCP_TF_PORT", defaults.tf_port),
            watch_every_s=float(number("GCP_WATCH_SECONDS", int(defaults.watch_every_s))),
            project=required("GCP_PROJECT"), zone=required("GCP_ZONE"), fallback_zones=words("GCP_FALLBACK_ZONES"),
            service_account=get("GCP_SERVICE_ACCOUNT"), network=get("GCP_NETWORK"), subnetwork=get("GCP_SUBNETWORK"),
            tags=words("GCP_TAGS"), capacity_wait_s=capacity_wait_s, tpu_api_endpoint=get("TPU_API_ENDPOINT"),
            compute_api_endpoint=get("COMPUTE_API_ENDPOINT"),
        )
