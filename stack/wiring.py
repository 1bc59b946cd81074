"""Which database, which storage, which provisioner: the one place adapters meet."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trainjobs.config import database_url_from_env, home

if TYPE_CHECKING:
    from stack.embedded import GcsEmulator
    from worker.ports import JobChannel, Provisioner, Stager

log = logging.getLogger("trainjobs")


def default_data_dir() -> Path:
    return Path(os.environ.get("TRAINJOBS_DATA_DIR") or home() / "data")


def resolve_database_url(data_dir: Path) -> str:
    """TRAINJOBS_DATABASE_URL, else an embedded PostgreSQL kept in data_dir/postgres."""
    url = database_url_from_env()
    if url:
        return url
    from stack.embedded import start_embedded_postgres

    url = start_embedded_postgres(data_dir / "postgres")
    log.info("embedded PostgreSQL at %s", data_dir / "postgres")
    return url


@dataclass
class StorageHandle:
    emulator: GcsEmulator | None = None  # the emulator we started, to stop on exit

    def stop(self) -> None:
        if self.emulator is not None:
            self.emulator.stop()


def resolve_storage(data_dir: Path) -> StorageHandle:
    """A real bucket when TRAINJOBS_BUCKET is set without an emulator; an emulator the user runs when
    STORAGE_EMULATOR_HOST is set; otherwise start our own emulator with its data in data_dir/gcs."""
    from trainjobs import storage

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        storage.ensure_bucket()
        return StorageHandle()
    if os.environ.get("TRAINJOBS_BUCKET"):
        return StorageHandle()
    from stack.embedded import start_gcs_emulator, use_emulator

    emu = start_gcs_emulator(data_dir / "gcs", bucket=storage.DEFAULT_BUCKET)
    use_emulator(emu, storage.DEFAULT_BUCKET)
    log.info("GCS emulator at %s (bucket %s)", emu.url, storage.DEFAULT_BUCKET)
    return StorageHandle(emu)


@dataclass
class WorkerRuntime:
    provisioner: Provisioner
    channel: JobChannel
    stager: Stager


def build_runtime(kind: str, data_dir: Path, *, local_devices: int = 2, local_slots: int = 2,
                  database_url: str | None = None) -> WorkerRuntime:
    """The provisioner, job channel and stager for a worker of this kind. database_url (gcp): the fleet's
    database, through which its workers share one listing of their machines."""
    if kind == "memory":
        from worker.memory_cloud import MemoryCloud, memory_stager

        cloud = MemoryCloud(boot_s=0.5, train_s=3.0)
        return WorkerRuntime(cloud, cloud, memory_stager)
    from worker.gcs_channel import GcsJobChannel
    from worker.staging_adapter import GcsStager

    stager = GcsStager(work_dir=data_dir / "staging")
    channel = GcsJobChannel()
    if kind == "local":
        from worker.local.provisioner import LocalProvisioner

        return WorkerRuntime(LocalProvisioner(data_dir / "machines", devices=local_devices, slots=local_slots),
                             channel, stager)
    if kind == "gcp":
        from worker.gcp.config import GcpConfig
        from worker.gcp.router import GcpProvisioner
        from worker.gcp.compute import GceVmProvisioner
        from worker.gcp.machine_watch import WatchConfig
        from worker.gcp.tpu import TpuVmProvisioner

        config = GcpConfig.from_env()
        # One listing per zone and product on a schedule shared by the worker's jobs, not a read per job
        # per step: within Google's default read quotas at hundreds of jobs (issue 25, bench/README.md).
        watch = WatchConfig(every_s=config.watch_every_s, max_every_s=max(60.0, 3 * config.watch_every_s))
        # And one listing per fleet, not per worker: the workers on one database take turns (fleet_listing.py).
        fleet = None
        if database_url is not None:
            from service.db.session import get_engine, session_factory

            fleet = session_factory(get_engine(database_url, pool_size=2))  # a statement per interval
        return WorkerRuntime(GcpProvisioner(TpuVmProvisioner(config, watch=watch, fleet=fleet),
                                            GceVmProvisioner(config, watch=watch, fleet=fleet)), channel, stager)
    raise ValueError(f"unknown provisioner {kind!r}: memory, local or gcp")
