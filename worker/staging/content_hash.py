"""The content address of a staged dataset.

    sha256( canonical JSON {"staging_format": STAGING_FORMAT, "format": <requested format>,
                            "options": <ConversionOptions, defaults filled>} + "\\n"
            + one line per source file, in sorted relative-path order:
              JSON [relative path, size in bytes, digest] + "\\n" )

A single file has relative path "" (its name does not matter, so an upload and a local copy of the
same bytes are one dataset). The digest is the file's sha256, except for objects read from gs://,
where it is "crc32c:<GCS checksum>" and the path is the full gs:// URI: GCS already knows that,
so a dataset staged before is recognised without reading it again. scikit-learn data hashes the
arrays it loads. Bump STAGING_FORMAT whenever the same input would be converted differently.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from worker.staging.budget import StagingBudget
from worker.staging.errors import DatasetError
from worker.staging.options import ConversionOptions

STAGING_FORMAT = 1
_CHUNK = 1 << 20


@dataclass(frozen=True)
class SourceFile:
    path: str  # relative to the source root; "" for a single-file source
    size: int
    digest: str


def dataset_sha256(requested_format: str, options: ConversionOptions, files: Iterable[SourceFile]) -> str:
    head = {"staging_format": STAGING_FORMAT, "format": requested_format, "options": options.as_dict()}
    h = hashlib.sha256(json.dumps(head, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    for f in sorted(files, key=lambda f: f.path):
        h.update(json.dumps([f.path, f.size, f.digest]).encode() + b"\n")
    return h.hexdigest()


def file_sha256(path: Path, budget: StagingBudget) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            budget.check_stop()
            h.update(chunk)
    return h.hexdigest()


def local_files(root: Path, budget: StagingBudget, *, within: Callable[[Path], bool] | None = None) -> list[SourceFile]:
    """SourceFiles for a local file or every file under a local folder, counted against the budget
    while the tree is walked. With `within`, every file and folder, links followed, must pass it."""
    found = sorted(walk_files(root, budget, within), key=lambda f: f[0])
    return [SourceFile(rel, size, file_sha256(path, budget)) for rel, path, size in found]


def walk_files(root: Path, budget: StagingBudget, within: Callable[[Path], bool] | None) -> Iterator[tuple[str, Path, int]]:
    """(relative path, path, size) of each file; a symlinked folder is walked once (cycles end)."""
    try:
        if root.is_file():
            budget.count(root.stat().st_size, root.name)
            yield "", root, root.stat().st_size
            return
        seen = {root.resolve()}
        pending = [root]
        while pending:
            folder = pending.pop()
            with os.scandir(folder) as entries:
                for entry in entries:
                    path = Path(entry.path)
                    rel = path.relative_to(root).as_posix()
                    if within is not None and entry.is_symlink() and not within(path.resolve()):
                        raise DatasetError(f"{rel} in {root.name} links outside the directories this deployment allows host data from")
                    if entry.is_dir():
                        if (real := path.resolve()) not in seen:
                            seen.add(real)
                            pending.append(path)
                    elif entry.is_file():
                        size = entry.stat().st_size
                        budget.count(size, root.name)
                        yield rel, path, size
    except OSError as exc:
        raise DatasetError(f"cannot read {root.name}: {exc.strerror or type(exc).__name__}") from None
