"""Adapts dataset staging (worker/staging) to the worker's Stager port."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from trainjobs.spec import JobSpec
from worker.staging import stage_dataset


class GcsStager:
    def __init__(self, work_dir: Path, bucket: str | None = None):
        self.work_dir, self.bucket = work_dir, bucket

    def __call__(self, spec: JobSpec, job_id: str, *, project_id: str,
                 should_stop: Callable[[], bool] = lambda: False) -> str:
        work = self.work_dir / job_id
        work.mkdir(parents=True, exist_ok=True)
        try:
            return stage_dataset(spec.dataset, bucket=self.bucket, work_dir=work).uri
        finally:
            shutil.rmtree(work, ignore_errors=True)  # downloads and shards; GCS has them now
