"""Where a dataset comes from. Each kind of `DatasetSpec.source` knows which bytes identify it
(`files`, what the content hash covers) and how to read it into Examples (`read`).

    /path or file:///path      a file or folder on the worker host
    https://... http://...     streamed to the work dir with httpx
    dataset:<sha256>           a file stored by trainjobs.uploads.store_upload
    gs://bucket/key-or-prefix  see gcs_source.py
    sklearn:<name>             scikit-learn's bundled data, loaded locally
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

from worker.staging.content_hash import SourceFile, local_files
from worker.staging.errors import DatasetError
from worker.staging.examples import Examples
from worker.staging.formats import read_local
from worker.staging.options import ConversionOptions
from worker.staging.read_tabular import read_sklearn
from trainjobs.uploads import find_upload

_DOWNLOAD_CHUNK = 1 << 20


class Source(Protocol):
    def files(self) -> list[SourceFile]: ...

    def read(self, requested: str, options: ConversionOptions, scratch: Path) -> tuple[str, Examples]: ...


@dataclass
class LocalSource:
    path: Path

    def files(self) -> list[SourceFile]:
        return local_files(self.path)

    def read(self, requested: str, options: ConversionOptions, scratch: Path) -> tuple[str, Examples]:
        return read_local(self.path, requested, options, scratch)


@dataclass
class HttpSource:
    url: str
    scratch: Path
    _path: Path | None = field(default=None, init=False)

    def files(self) -> list[SourceFile]:
        return local_files(self._download())

    def read(self, requested: str, options: ConversionOptions, scratch: Path) -> tuple[str, Examples]:
        return read_local(self._download(), requested, options, scratch)

    def _download(self) -> Path:
        if self._path is not None:
            return self._path
        import httpx  # lazy: only URL sources need it

        name = Path(unquote(urlparse(self.url).path)).name or "download"
        target = self.scratch / "http" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with httpx.stream("GET", self.url, follow_redirects=True, timeout=httpx.Timeout(30.0)) as response:
                if response.status_code >= 400:
                    raise DatasetError(f"downloading {self.url} failed: HTTP {response.status_code} {response.reason_phrase}")
                with target.open("wb") as out:
                    for chunk in response.iter_bytes(_DOWNLOAD_CHUNK):
                        out.write(chunk)
        except httpx.HTTPError as exc:
            raise DatasetError(f"downloading {self.url} failed: {exc or type(exc).__name__}") from None
        self._path = target
        return target


@dataclass
class StoredUploadSource:
    """dataset:<sha256>. Its sha256 is already known, so hashing needs no download."""

    sha256: str
    blob: Any
    scratch: Path

    def files(self) -> list[SourceFile]:
        return [SourceFile("", int(self.blob.size), self.sha256)]

    def read(self, requested: str, options: ConversionOptions, scratch: Path) -> tuple[str, Examples]:
        target = scratch / "upload" / Path(self.blob.name).name
        target.parent.mkdir(parents=True, exist_ok=True)
        self.blob.download_to_filename(str(target))
        return read_local(target, requested, options, scratch)


@dataclass
class SklearnSource:
    name: str
    examples: Examples

    def files(self) -> list[SourceFile]:
        x, y = self.examples.x, self.examples.y
        digest = hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest()
        return [SourceFile(f"sklearn:{self.name}", x.nbytes + y.nbytes, digest)]

    def read(self, requested: str, options: ConversionOptions, scratch: Path) -> tuple[str, Examples]:
        if requested != "auto":
            raise DatasetError(f"sklearn:{self.name} is bundled data; leave dataset.format as auto, not {requested}")
        return "sklearn", self.examples


def open_source(source: str, *, bucket: str, scratch: Path) -> Source:
    if source.startswith("sklearn:"):
        name = source.removeprefix("sklearn:")
        return SklearnSource(name, read_sklearn(name))
    if source.startswith(("https://", "http://")):
        return HttpSource(source, scratch)
    if source.startswith("dataset:"):
        sha = source.removeprefix("dataset:")
        blob = find_upload(sha, bucket=bucket)
        if blob is None:
            raise DatasetError(f"no uploaded dataset {sha} in gs://{bucket}/uploads/; upload it first (POST /v1/datasets)")
        return StoredUploadSource(sha, blob, scratch)
    if source.startswith("gs://"):
        from worker.staging.gcs_source import GcsSource

        return GcsSource.open(source, scratch)
    path = Path(unquote(source.removeprefix("file://")) if source.startswith("file://") else source).expanduser()
    if not path.exists():
        raise DatasetError(f"no file or folder at {source}")
    return LocalSource(path)
