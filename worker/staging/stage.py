"""stage_dataset: any supported source -> sharded TFRecords and a manifest at gs://BUCKET/datasets/<sha256>/."""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainjobs import storage
from trainjobs.job_paths import dataset_manifest, dataset_uri
from trainjobs.source_rules import DataAccessRules
from trainjobs.spec import DatasetSpec
from worker.staging.budget import StagingBudget, StagingLimits
from worker.staging.content_hash import dataset_sha256
from worker.staging.gcs_source import GcsSource
from worker.staging.in_place import scan_in_place
from worker.staging.example_proto import NotOurSchema
from worker.staging.examples import labelled, with_vocabularies
from worker.staging.manifest import Provenance, build_manifest
from worker.staging.options import ConversionOptions
from worker.staging.shards import examples_split, train_target_stats, write_splits
from worker.staging.sources import SourceAccess, open_source

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StagedDataset:
    uri: str  # gs://BUCKET/datasets/<sha256>
    sha256: str
    manifest: dict[str, Any]
    uploaded_objects: int  # 0 when the dataset was already staged
    uploaded_bytes: int = 0

    @property
    def manifest_uri(self) -> str:
        return dataset_manifest(self.uri)


def stage_dataset(ds: DatasetSpec, *, project_id: str, work_dir: Path, task: str = "classification",
                  bucket: str | None = None,
                  rules: DataAccessRules | None = None, limits: StagingLimits | None = None,
                  should_stop: Callable[[], bool] = lambda: False) -> StagedDataset:
    """Stage ds, a dataset of a job of `project_id`, once: a dataset whose content hash already has a
    manifest is reused, uploading nothing. `rules` and `limits` default to the operator's (from the
    environment).

    Raises DatasetError for data we cannot use (its message is meant for the user), and
    StagingStopped once should_stop() turns true.
    """
    started = time.monotonic()
    bucket = bucket or storage.bucket_name()
    budget = StagingBudget(limits or StagingLimits.from_env(), should_stop)
    access = SourceAccess(project_id, rules or DataAccessRules.from_env(), budget)
    options = ConversionOptions.from_spec(ds.options, task)
    work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work_dir, prefix="staging-") as tmp:
        scratch = Path(tmp)
        source = open_source(ds.source, bucket=bucket, scratch=scratch, access=access)
        budget.check_stop()
        sha = dataset_sha256(ds.format, options, source.files())
        uri = dataset_uri(sha, bucket)
        existing = storage.read_json(dataset_manifest(uri))
        if existing is not None:
            log.info("dataset %s is already staged at %s", ds.source, uri)
            return StagedDataset(uri, sha, existing, 0)

        # Used in place only when they are in our schema, uncompressed and named by no option, and read as
        # classes (another task re-encodes the labels).
        in_place = (source.in_place_shards(ds.format) if isinstance(source, GcsSource) and options.tfrecord.is_default
                    and task == "classification" else [])
        scanned = None
        if in_place:
            try:
                scanned = scan_in_place(in_place, options.validation_split, budget)
            except NotOurSchema as exc:  # another layout, or compressed: convert it like any other source
                log.info("TFRecords at %s are converted, not used in place: %s", ds.source, exc)
        provenance = Provenance()
        if scanned is not None:
            class_names, shape, splits = scanned
            source_format, uploaded, uploaded_bytes = "tfrecord", 0, 0
        else:
            source_format, examples = source.read(ds.format, options, scratch)
            examples = labelled(examples, task, options.positive_label)
            examples = with_vocabularies(examples, examples_split(examples, options)["train"])
            class_names, shape = examples.class_names or [], examples.feature_shape
            provenance = Provenance(examples.dropped, tuple(examples.notes))
            budget.check_stop()
            splits = write_splits(examples, options, scratch / "out")
            budget.check_stop()
            uploaded_bytes = sum(p.stat().st_size for p in (scratch / "out").rglob("*") if p.is_file())
            uploaded = len(storage.upload_dir(scratch / "out", uri))
        manifest = build_manifest(
            sha256=sha, source=ds.source, source_format=source_format, class_names=class_names,
            feature_shape=shape, splits=splits, options=options, in_place=scanned is not None,
            provenance=provenance, task=task,
            targets=train_target_stats(examples, options) if task == "regression" else None,
            columns=[c.as_dict() for c in examples.columns] if scanned is None and examples.columns else None,
        )
        # Last, and only after every shard: a manifest is the promise that the dataset is complete.
        # Two workers staging the same content write identical bytes, so the race is harmless.
        storage.write_json(dataset_manifest(uri), manifest)
    log.info("staged %s as %s: %s in %.1f s", ds.source, uri,
             {k: v.examples for k, v in splits.items()}, time.monotonic() - started)
    return StagedDataset(uri, sha, manifest, uploaded + 1, uploaded_bytes)
