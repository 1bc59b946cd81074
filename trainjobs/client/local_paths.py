"""Which values of a job spec are files or folders on the submitting machine, for `trainjobs submit`
to upload before the job is sent (the API takes no paths of the user's laptop).

A relative path is relative to the spec file's folder and must exist there: otherwise the error
says where it was looked for. An absolute path that exists here is uploaded; one that does not may
be a path on the worker's host (which the operator may allow), so it is left for the API to judge.
Anything with a scheme (gs://, https://, dataset:, sklearn:) is not a local path.
"""

from __future__ import annotations

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
