"""Which values of a job spec are files or folders on the submitting machine, for `trainjobs submit`
to upload before the job is sent (the API takes no paths of the user's laptop).

A relative path is relative to the spec file's folder and must exist there: otherwise the error
says where it was looked for. An absolute path that exists here is uploaded; one that does not may
be a path on the worker's host (which the operator may allow), so it is left for the API to judge.
Anything with a scheme (gs://, https://, dataset:, sklearn:) is not a local path.
"""

from __future__ import annotations

import gzip
import tarfile
from pathlib import Path


class LocalPathError(Exception):
    """A relative path in the spec names nothing on this machine; the message says where it looked."""


def local_upload(value: object, base: Path, field: str) -> Path | None:
    """The local file or folder `value` (the spec's `field`) names, or None when it is no local path."""
    if not isinstance(value, str) or not value or ":" in value:
        return None
    path = Path(value).expanduser()
    if path.is_absolute():
        return path if path.exists() else None
    located = base / path
    if located.exists():
        return located
    raise LocalPathError(f"{field} {value!r} is a relative path, so it was looked for next to the spec file, at "
                         f"{located.resolve()}, and nothing is there")


def requirements_lines(text: str) -> list[str]:
    """A requirements.txt's requirements: one per line, comments and blank lines left out (pip options
    such as -r or --index-url are kept, for the spec to refuse by name)."""
    lines = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def pack_channel(path: Path, into: Path) -> Path:
    """A program's channel (a local file or folder) as one .tar.gz holding its files at the top, for
    staging to unpack into the channel's folder as they are. Times and owners are left out, so the same
    files pack to the same bytes and upload once (uploads are stored by content)."""
    def plain(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
        return info

    with into.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as zipped, \
            tarfile.open(fileobj=zipped, mode="w") as tar:
        members = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for member in members:
            tar.add(member, arcname=member.name if member == path else member.relative_to(path).as_posix(),
                    recursive=False, filter=plain)
    return into
