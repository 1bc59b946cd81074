"""gs:// sources: one object, or every object under a prefix.

TFRecords in our schema are used in place (in_place.py): nothing is copied, and the manifest names
the objects by absolute gs:// URI. Anything else is downloaded to the work dir and converted like a
local file or folder. Sidecar objects (*.json, *.txt, *.md, _SUCCESS, hidden files) never count as
data, so the folder of a dataset staged by us, manifest.json included, is itself a valid source.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from trainjobs import storage
from worker.staging.budget import StagingBudget
from worker.staging.content_hash import SourceFile
from worker.staging.errors import DatasetError
from worker.staging.examples import Examples
from worker.staging.formats import is_tfrecord_name, read_local
from worker.staging.options import ConversionOptions

_SIDECAR_SUFFIXES = (".json", ".txt", ".md")


def _is_sidecar(key: str) -> bool:
    name = PurePosixPath(key).name
    return name.startswith(("_", ".")) or name.lower().endswith(_SIDECAR_SUFFIXES)


def listed_objects(uri: str) -> Iterator[tuple[str, Any]]:
    """(prefix, blob): the one object `uri` names (its prefix is its own name), else the objects under it as
    a folder (prefix ending in "/"), as GCS lists them, page by page; a console's folder placeholders are left
    out. A dataset's source and a program's channel are read through it. DatasetError for a bucket that does
    not exist or that the worker may not read."""
    from google.api_core.exceptions import Forbidden, NotFound

    name, key = storage.split_uri(uri)
    try:
        if key and not key.endswith("/"):
            one = storage.bucket(name).get_blob(key)
            if one is not None:
                yield key, one
                return
            key += "/"
        for blob in storage.client().list_blobs(name, prefix=key):
            if not blob.name.endswith("/"):
                yield key, blob
    except NotFound:
        raise DatasetError(f"bucket gs://{name} does not exist") from None
    except Forbidden:
        raise DatasetError(f"the worker may not read {uri}; grant its service account storage.objects.get and .list") from None


@dataclass
class GcsSource:
    bucket_name: str
    prefix: str  # the object's own key for a single object, else a prefix ending in "/"
    blobs: list[Any]
    single: bool
    budget: StagingBudget

    @classmethod
    def open(cls, uri: str, budget: StagingBudget) -> GcsSource:
        name, key = storage.split_uri(uri)
        blobs = []
        # Counted as GCS lists them: a prefix of millions of objects fails at the limit.
        for prefix, blob in listed_objects(uri):
            budget.count(int(blob.size or 0), uri)
            if prefix == blob.name:  # the one object the URI names
                return cls(name, prefix, [blob], single=True, budget=budget)
            key = prefix
            blobs.append(blob)
        if not blobs:
            raise DatasetError(f"no objects at {uri}")
        return cls(name, key, sorted(blobs, key=lambda b: b.name), single=False, budget=budget)

    def uri(self, blob: Any) -> str:
        return f"gs://{self.bucket_name}/{blob.name}"

    def files(self) -> list[SourceFile]:
        return [SourceFile(self.uri(b), int(b.size), f"crc32c:{b.crc32c}") for b in self.blobs]

    def in_place_shards(self, requested: str) -> list[tuple[Any, str]]:
        """(blob, gs:// URI) of the objects to use in place, or [] when this source must be converted."""
        if requested not in ("auto", "tfrecord"):
            return []
        data = [b for b in self.blobs if self.single or not _is_sidecar(b.name)]
        if data and (requested == "tfrecord" or all(is_tfrecord_name(b.name) for b in data)):
            return [(b, self.uri(b)) for b in data]
        return []

    def read(self, requested: str, options: ConversionOptions, scratch: Path) -> tuple[str, Examples]:
        root = scratch / "gcs"
        if self.single:
            target = root / PurePosixPath(self.prefix).name
            self._download([(self.blobs[0], target)], root)
            return read_local(target, requested, options, scratch, self.budget)
        self._download([(b, root / b.name[len(self.prefix):]) for b in self.blobs], root)
        return read_local(root, requested, options, scratch, self.budget)

    def _download(self, pairs: list[tuple[Any, Path]], root: Path) -> None:
        """Object by object, in parallel; each checks for a stop before it starts."""
        root.mkdir(parents=True, exist_ok=True)
        inside = root.resolve()

        def one(pair: tuple[Any, Path]) -> None:
            blob, target = pair
            self.budget.check_stop()
            if not target.resolve().is_relative_to(inside):  # object names are not paths: '..' must stay out
                raise DatasetError(f"object {blob.name} has a name that cannot be a file name")
            target.parent.mkdir(parents=True, exist_ok=True)
            # As stored: an object a job wrote with Content-Encoding: gzip would otherwise be inflated here,
            # past the byte budget, which counts stored sizes (issue 36: job-written objects are read raw).
            blob.download_to_filename(str(target), raw_download=True)

        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(one, pairs))
