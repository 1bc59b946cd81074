"""Where a dataset comes from. Each kind of `DatasetSpec.source` knows which bytes identify it
(`files`, what the content hash covers) and how to read it into Examples (`read`).

    /path or file:///path      a file or folder on the worker host, inside a directory the operator
                               allows (TRAINJOBS_HOST_DATA_DIRS); refused otherwise
    https://...                streamed to the work dir by fetch.py (public hosts only); http:// and
                               private hosts only when the operator allow-lists them
    dataset:<sha256>           a file the job's own project stored with trainjobs.uploads.store_upload
    gs://bucket/key-or-prefix  see gcs_source.py; in our own bucket only the project's uploads and jobs
                               (and a staged dataset by its sha256), other buckets only when the
                               operator lists them (TRAINJOBS_SOURCE_BUCKETS)
    sklearn:<name>             scikit-learn's bundled data, loaded locally

The rules are trainjobs/source_rules.py, the same the API applied at submit.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

from trainjobs.source_rules import DataAccessRules, SourceRefused, check_source
from trainjobs.uploads import find_upload
from worker.staging.budget import StagingBudget
from worker.staging.content_hash import SourceFile, local_files
from worker.staging.errors import DatasetError
from worker.staging.examples import Examples
from worker.staging.fetch import fetch
from worker.staging.formats import read_local
from worker.staging.options import ConversionOptions
from worker.staging.read_tabular import read_sklearn

_DOWNLOAD_CHUNK = 1 << 20


class Source(Protocol):
    def files(self) -> list[SourceFile]: ...

    def read(self, requested: str, options: ConversionOptions, scratch: Path) -> tuple[str, Examples]: ...


@dataclass
class LocalSource:
    path: Path  # resolved, inside an allowed directory
    rules: DataAccessRules
    budget: StagingBudget

    def files(self) -> list[SourceFile]:
        return local_files(self.path, self.budget, within=self._allowed)

    def _allowed(self, path: Path) -> bool:
        return any(path.is_relative_to(d) for d in self.rules.host_dirs)

    def read(self, requested: str, options: ConversionOptions, scratch: Path) -> tuple[str, Examples]:
        return read_local(self.path, requested, options, scratch, self.budget)


@dataclass
class HttpSource:
    url: str
    scratch: Path
    rules: DataAccessRules
    budget: StagingBudget
    _path: Path | None = field(default=None, init=False)

    def files(self) -> list[SourceFile]:
        return local_files(self._download(), self.budget)

    def read(self, requested: str, options: ConversionOptions, scratch: Path) -> tuple[str, Examples]:
        return read_local(self._download(), requested, options, scratch, self.budget)

    def _download(self) -> Path:
        if self._path is None:
            name = Path(unquote(urlparse(self.url).path)).name or "download"
            self._path = fetch(self.url, self.scratch / "http" / name, rules=self.rules, budget=self.budget)
        return self._path


@dataclass
class StoredUploadSource:
    """dataset:<sha256>. Its sha256 is already known, so hashing needs no download."""

    sha256: str
    blob: Any
    budget: StagingBudget

    def files(self) -> list[SourceFile]:
        self.budget.count(int(self.blob.size), f"dataset:{self.sha256}")
        return [SourceFile("", int(self.blob.size), self.sha256)]

    def read(self, requested: str, options: ConversionOptions, scratch: Path) -> tuple[str, Examples]:
        target = scratch / "upload" / Path(self.blob.name).name
        target.parent.mkdir(parents=True, exist_ok=True)
        with self.blob.open("rb") as stream, target.open("wb") as out:
            while chunk := stream.read(_DOWNLOAD_CHUNK):
                self.budget.check_stop()
                out.write(chunk)
        return read_local(target, requested, options, scratch, self.budget)


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


@dataclass(frozen=True)
class SourceAccess:
    """Whose job is staging, and what it may reach."""

    project_id: str
    rules: DataAccessRules
    budget: StagingBudget


def open_source(source: str, *, bucket: str, scratch: Path, access: SourceAccess) -> Source:
    rules, budget = access.rules, access.budget
    try:
        # own_job=None: the worker cannot tell whose another job is; submit checked jobs/<id>/.
        check_source(source, rules=rules, bucket=bucket, project_id=access.project_id, own_job=None)
    except SourceRefused as exc:
        raise DatasetError(str(exc)) from None
    if source.startswith("sklearn:"):
        name = source.removeprefix("sklearn:")
        return SklearnSource(name, read_sklearn(name))
    if source.startswith(("https://", "http://")):
        return HttpSource(source, scratch, rules, budget)
    if source.startswith("dataset:"):
        sha = source.removeprefix("dataset:")
        blob = find_upload(access.project_id, sha, bucket=bucket)
        if blob is None:
            raise DatasetError(f"no dataset {sha} was uploaded by this project; upload it first (POST /v1/datasets)")
        return StoredUploadSource(sha, blob, budget)
    if source.startswith("gs://"):
        from worker.staging.gcs_source import GcsSource

        return GcsSource.open(source, budget)
    path = rules.host_path(source)  # checked above: allowed, resolved
    try:
        exists = path.exists()
    except OSError:  # a name too long for the filesystem: there is nothing there to read
        exists = False
    if not exists:
        raise DatasetError(f"no file or folder at {source}")
    return LocalSource(path, rules, budget)
