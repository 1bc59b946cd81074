"""gs:// sources: one object, or every object under a prefix.

TFRecords in our schema are used in place (in_place.py): nothing is copied, and the manifest names
the objects by absolute gs:// URI. Anything else is downloaded to the work dir and converted like a
local file or folder. Sidecar objects (*.json, *.txt, *.md, _SUCCESS, hidden files) never count as
data, so the folder of a dataset staged by us, manifest.json included, is itself a valid source.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from trainjobs import storage
from worker.staging.content_hash import SourceFile
from worker.staging.errors import DatasetError
from worker.staging.examples import Examples
from worker.staging.formats import is_tfrecord_name, read_local
from worker.staging.options import ConversionOptions

_SIDECAR_SUFFIXES = (".json", ".txt", ".md")


def _is_sidecar(key: str) -> bool:
    name = PurePosixPath(key).name
    return name.startswith(("_", ".")) or name.lower().endswith(_SIDECAR_SUFFIXES)


@dataclass
class GcsSource:
    bucket_name: str
    prefix: str  # the object's own key for a single object, else a prefix ending in "/"
    blobs: list[Any]
    single: bool

    @classmethod
    def open(cls, uri: str, scratch: Path) -> GcsSource:
        from google.api_core.exceptions import Forbidden, NotFound

        name, key = storage.split_uri(uri)
        try:
            if key and not key.endswith("/"):
                one = storage.bucket(name).get_blob(key)
                if one is not None:
                    return cls(name, key, [one], single=True)
                key += "/"
            blobs = [b for b in storage.client().list_blobs(name, prefix=key) if not b.name.endswith("/")]
        except NotFound:
            raise DatasetError(f"bucket gs://{name} does not exist") from None
        except Forbidden:
            raise DatasetError(f"the worker may not read {uri}; grant its service account storage.objects.get and .list") from None
        if not blobs:
            raise DatasetError(f"no objects at {uri}")
        return cls(name, key, sorted(blobs, key=lambda b: b.name), single=False)

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
            target.parent.mkdir(parents=True, exist_ok=True)
            self.blobs[0].download_to_filename(str(target))
            return read_local(target, requested, options, scratch)
        storage.download_prefix(f"gs://{self.bucket_name}/{self.prefix}", root)
        return read_local(root, requested, options, scratch)
