"""Staging as the staging tests call it: a dataset source staged for a project of the tests' own, under
the rules of an operator who allows host files, a local HTTP server and a bucket of the operator's;
and staged shards read back with staging's own reader."""

from __future__ import annotations

import io
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainjobs import storage
from trainjobs.job_paths import dataset_file
from trainjobs.source_rules import FETCH_ALLOW_HOSTS_ENV, HOST_DATA_DIRS_ENV, SOURCE_BUCKETS_ENV, DataAccessRules
from trainjobs.spec import DatasetSpec
from worker.staging import StagedDataset, stage_dataset
from worker.staging.budget import StagingLimits
from worker.staging.tfrecord import iter_examples

PROJECT = "6d1f4a52-5d0e-4c3a-9a53-2a4f4f0f1b11"
OPERATORS_BUCKET = "operators-raw-data"  # a bucket of the operator's, not trainjobs' own


@pytest.fixture(autouse=True)
def operator_allows_test_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests stage host files, a local HTTP server and a bucket of the operator's, as an
    operator who allows all three would."""
    monkeypatch.setenv(HOST_DATA_DIRS_ENV, str(tmp_path))
    monkeypatch.setenv(FETCH_ALLOW_HOSTS_ENV, "127.0.0.1")
    monkeypatch.setenv(SOURCE_BUCKETS_ENV, OPERATORS_BUCKET)


def operators_folder() -> str:
    """A fresh folder in the operator's bucket: gs://operators-raw-data/<random>."""
    storage.ensure_bucket(OPERATORS_BUCKET)
    return f"gs://{OPERATORS_BUCKET}/{uuid.uuid4().hex[:12]}"


def stage(source: str | Path, bucket: str | None = None, work_dir: Path | None = None, *, project: str = PROJECT,
          rules: DataAccessRules | None = None, limits: StagingLimits | None = None,
          should_stop: Callable[[], bool] = lambda: False, task: str = "classification", **dataset: Any) -> StagedDataset:
    """Stage `source` (a dataset spec's source; a local path as it is) with the dataset spec's other
    fields `dataset`, as the worker would for a job of `project`: into `bucket` (default: the test's,
    TRAINJOBS_BUCKET), working in `work_dir` (default: a fresh folder beside a local source, else a
    temporary one), under `rules` and `limits` (default: the operator's, from the environment)."""
    if work_dir is None:
        work_dir = (Path(source).parent if isinstance(source, Path) else Path(tempfile.mkdtemp())) / \
            f"work-{uuid.uuid4().hex[:6]}"
    return stage_dataset(DatasetSpec(source=str(source), **dataset), project_id=project, bucket=bucket,
                         work_dir=work_dir, task=task, rules=rules, limits=limits, should_stop=should_stop)


def shard_uri(staged: StagedDataset, shard: str) -> str:
    return shard if shard.startswith("gs://") else dataset_file(staged.uri, shard)


def read_split(staged: StagedDataset, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Every example of one split, read back from GCS with staging's own TFRecord reader."""
    xs, ys = [], []
    for shard in staged.manifest["splits"][split]["shards"]:
        data = storage.blob(shard_uri(staged, shard)).download_as_bytes()
        for x, y in iter_examples(io.BytesIO(data), shard):
            xs.append(x)
            ys.append(y)
    return np.array(xs), np.array(ys)


def save_png(path: Path, color: tuple[int, int, int], size: tuple[int, int] = (12, 10)) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)


def close_staging_fork_server() -> None:
    """Ends the fork server that staging children come from (worker/staging_child.py) and the temp dir
    multiprocessing made for its socket, before this run's TMPDIR is removed (at exit, multiprocessing
    would remove the dir again and print the error). Private parts of multiprocessing: tests only."""
    from multiprocessing import forkserver, util

    forkserver._forkserver._stop()  # type: ignore[attr-defined]
    for finalizer in list(util._finalizer_registry.values()):  # type: ignore[attr-defined]
        if getattr(finalizer, "_callback", None) is util._remove_temp_dir:  # type: ignore[attr-defined]
            finalizer()
