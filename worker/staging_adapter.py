"""Adapts dataset staging (worker/staging) to the worker's Stager port."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from trainjobs import storage
from trainjobs.source_rules import DataAccessRules, SourceRefused, check_source
from trainjobs.spec import JobSpec
from worker import prometheus
from worker.ports import DatasetError, StagingStopped
from worker.staging import stage_dataset
from worker.staging.preflight import check_plan


class GcsStager:
    def __init__(self, work_dir: Path, bucket: str | None = None):
        self.work_dir, self.bucket = work_dir, bucket

    def __call__(self, spec: JobSpec, job_id: str, *, project_id: str,
                 should_stop: Callable[[], bool] = lambda: False) -> str:
        # The operator's rules as they are now, not as they were at submit: a queued job is held to them.
        rules = DataAccessRules.from_env()
        if spec.model.module is not None:
            _check_module(spec.model.module, rules, self.bucket or storage.bucket_name(), project_id)
        work = self.work_dir / job_id
        work.mkdir(parents=True, exist_ok=True)
        started, outcome = time.monotonic(), "error"
        try:
            staged = stage_dataset(spec.dataset, project_id=project_id, bucket=self.bucket, work_dir=work,
                                   rules=rules, should_stop=should_stop)
            outcome = "staged" if staged.uploaded_objects else "reused"
            prometheus.STAGING_BYTES.inc(staged.uploaded_bytes)
            # Staging first knows the data's size and shape: a plan it cannot carry fails now, not on a paid machine.
            check_plan(spec, staged.manifest)
            return staged.uri
        except DatasetError:
            outcome = "rejected"
            raise
        except StagingStopped:
            outcome = "stopped"
            raise
        finally:
            prometheus.STAGING_SECONDS.labels(outcome).observe(time.monotonic() - started)
            shutil.rmtree(work, ignore_errors=True)  # downloads and shards; GCS has them now


def _check_module(module: str, rules: DataAccessRules, bucket: str, project_id: str) -> None:
    """The model code is the agent's to fetch, but whether the job may name it is decided before any
    machine starts, by the same rules as its data."""
    try:
        check_source(module, rules=rules, bucket=bucket, project_id=project_id, own_job=None)
    except SourceRefused as exc:
        raise DatasetError(f"model.module: {exc}") from None
