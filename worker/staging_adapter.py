"""Adapts dataset staging (worker/staging) to the worker's Stager port."""

from __future__ import annotations

import shutil
import tarfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainjobs import storage
from trainjobs.program_source import (
    ProgramSourceError, archive_names, entrypoint_in, is_archive, single_file_entrypoint,
)
from trainjobs.source_rules import DataAccessRules, SourceRefused, check_source, is_host_path
from trainjobs.spec import JobSpec, ProgramSpec
from trainjobs.uploads import MAX_MODULE_BYTES
from worker import prometheus
from worker.ports import DatasetError, ProgramError, StagingStopped
from worker.staging import stage_dataset
from worker.staging.budget import StagingLimits
from worker.staging.preflight import check_plan
from worker.staging_channels import stage_channels
from worker.staging_child import run_in_child, warm_up


class GcsStager:
    """Stages each job in a child process of its own (worker/staging_child.py): a dataset that costs
    more memory or time than one staging may have fails its own job, and the worker goes on."""

    def __init__(self, work_dir: Path, bucket: str | None = None):
        self.work_dir, self.bucket = work_dir, bucket
        warm_up()

    def __call__(self, spec: JobSpec, job_id: str, *, project_id: str,
                 should_stop: Callable[[], bool] = lambda: False) -> str:
        # The operator's rules as they are now, not as they were at submit: a queued job is held to them.
        rules, limits = DataAccessRules.from_env(), StagingLimits.from_env()
        started, outcome = time.monotonic(), "error"
        try:
            staged = run_in_child(stage_job, spec, job_id, project_id, rules, limits, self.work_dir, self.bucket,
                                  memory_mb=limits.memory_mb, timeout_s=limits.timeout_s, should_stop=should_stop)
            if staged is None:
                return ""  # a program that brings its own data (trainjobs/spec/job.py allows it only there)
            outcome = "staged" if staged.uploaded_objects else "reused"
            prometheus.STAGING_BYTES.inc(staged.uploaded_bytes)
            return staged.uri
        except DatasetError:
            outcome = "rejected"
            raise
        except StagingStopped:
            outcome = "stopped"
            raise
        finally:
            if spec.dataset is not None:
                prometheus.STAGING_SECONDS.labels(outcome).observe(time.monotonic() - started)
            # What a killed child left: downloads, shards, a program archive (GCS has what it needs).
            shutil.rmtree(self.work_dir / job_id, ignore_errors=True)
            shutil.rmtree(self.work_dir / f"{job_id}-program", ignore_errors=True)
            shutil.rmtree(self.work_dir / f"{job_id}-channels", ignore_errors=True)


@dataclass(frozen=True)
class Staged:
    """What the staging child sends the worker: never the manifest, whose vocabularies are the dataset's
    own cells (up to the child's memory) and which GCS holds anyway."""
    uri: str
    uploaded_objects: int  # 0 when the dataset was already staged
    uploaded_bytes: int


def stage_job(spec: JobSpec, job_id: str, project_id: str, rules: DataAccessRules, limits: StagingLimits,
              work_dir: Path, bucket: str | None) -> Staged | None:
    """Everything staging checks and does for one job, in the staging child: the model module and the
    program may be named, the program's channels copied, the dataset staged and the plan fits it. None:
    the job names no dataset."""
    data_bucket = bucket or storage.bucket_name()
    if spec.model is not None and spec.model.module is not None:
        _check_module(spec.model.module, rules, data_bucket, project_id)
    if spec.program is not None:
        check_program(spec.program, rules, data_bucket, project_id, work_dir / f"{job_id}-program")
        if spec.program.channels:  # the program's own files, as they are, in the job's directory
            stage_channels(spec.program.channels, job_id=job_id, project_id=project_id, rules=rules, limits=limits,
                           bucket=data_bucket, work=work_dir / f"{job_id}-channels")
    if spec.dataset is None:
        return None
    work = work_dir / job_id
    work.mkdir(parents=True, exist_ok=True)
    try:
        staged = stage_dataset(spec.dataset, project_id=project_id, bucket=bucket, work_dir=work,
                               task=spec.task, rules=rules, limits=limits)
        # Staging first knows the data's size and shape: a plan it cannot carry fails now, not on a paid
        # machine. A program's batches are its own to make.
        if spec.model is not None:
            check_plan(spec, staged.manifest)
        return Staged(staged.uri, staged.uploaded_objects, staged.uploaded_bytes)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # downloads and shards; GCS has them now


def _check_module(module: str, rules: DataAccessRules, bucket: str, project_id: str) -> None:
    """The model code is the agent's to fetch, but whether the job may name it is decided before any
    machine starts, by the same rules as its data."""
    try:
        check_source(module, rules=rules, bucket=bucket, project_id=project_id, own_job=None)
    except SourceRefused as exc:
        raise DatasetError(f"model.module: {exc}") from None


def check_program(program: ProgramSpec, rules: DataAccessRules, bucket: str, project_id: str, work: Path) -> None:
    """The program may be named by this job, and its entrypoint is in it: else ProgramError, before any
    machine is paid for. An archive is downloaded (code: at most MAX_MODULE_BYTES) to read its list."""
    source = program.source
    try:
        check_source(source, rules=rules, bucket=bucket, project_id=project_id, own_job=None)
    except SourceRefused as exc:
        raise ProgramError(f"program.source: {exc}") from None
    for i, line in enumerate(program.requirements):  # the hosts of today too; the agent checks only the rest
        try:
            rules.check_requirement(line)
        except SourceRefused as exc:
            raise ProgramError(f"program.requirements.{i}: {exc}") from None
    name = source.rstrip("/").rsplit("/", 1)[-1]
    try:
        if source.startswith("gs://"):
            if name.endswith(".py"):
                if not storage.blob(source).exists():
                    raise ProgramError(f"program.source: {source} does not exist")
                single_file_entrypoint(name, program.entrypoint)
            elif is_archive(name):
                blob = storage.blob(source)
                if not blob.exists():
                    raise ProgramError(f"program.source: {source} does not exist")
                blob.reload()
                if (blob.size or 0) > MAX_MODULE_BYTES:
                    raise ProgramError(f"program.source: {source} is {blob.size} bytes, over the "
                                       f"{MAX_MODULE_BYTES >> 20} MiB code limit")
                work.mkdir(parents=True, exist_ok=True)
                try:
                    # raw_download: the stored bytes that blob.size measured. A job can store an object of
                    # its jobs/<id>/ gzip-encoded, and the client would inflate it onto this disk unbounded.
                    blob.download_to_filename(str(work / name), raw_download=True)
                    entrypoint_in(archive_names(work / name), program.entrypoint)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
            else:  # a folder of objects
                prefix = source.rstrip("/") + "/"
                names = [u.removeprefix(prefix) for u in storage.list_uris(prefix)]
                if not names:
                    raise ProgramError(f"program.source: {source} holds no files")
                entrypoint_in(names, program.entrypoint, root="")
        elif is_host_path(source):
            path = rules.host_path(source)
            if path.is_dir():
                entrypoint_in([p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()],
                              program.entrypoint, root="")
            elif path.name.endswith(".py") and path.is_file():
                single_file_entrypoint(path.name, program.entrypoint)
            elif is_archive(path.name) and path.is_file():
                entrypoint_in(archive_names(path), program.entrypoint)
            else:
                raise ProgramError(f"program.source: {source} is not a .py file, a folder or an archive on this host")
        else:
            raise ProgramError(f"program.source: {source}: give an upload (trainjobs submit uploads a local "
                               "path), a gs:// URI or an allowed host path")
    except ProgramSourceError as exc:
        raise ProgramError(str(exc)) from None
    except (OSError, zipfile.BadZipFile, tarfile.TarError) as exc:  # a corrupt archive, an unreadable host path
        raise ProgramError(f"program.source: {source} cannot be read as a program: {exc}") from None
