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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

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


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def local_files(root: Path) -> list[SourceFile]:
    """SourceFiles for a local file or every file under a local folder."""
    if root.is_file():
        return [SourceFile("", root.stat().st_size, file_sha256(root))]
    return [
        SourceFile(p.relative_to(root).as_posix(), p.stat().st_size, file_sha256(p))
        for p in sorted(root.rglob("*")) if p.is_file()
    ]
