"""A program job's code as it travels (issue 20): one .py file, a package folder zipped by the client
(`<folder>/...` inside a .zip), a .tar.gz, or a folder of objects under a gs:// prefix. Staging reads
the list of its files to check the entrypoint before any machine starts (worker/staging_adapter.py);
the agent unpacks it on the machine and runs the entrypoint (agent/program.py). Both decide the same
way here: which folder is the program's root and which file is run.

Unpacking refuses what could write outside the destination: absolute names, `..`, links and devices.
"""

from __future__ import annotations

import tarfile
import zipfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

ARCHIVES = (".zip", ".tar.gz", ".tgz")
DEFAULT_PACKAGE_ENTRYPOINT = "__main__.py"
MAX_FILES = 10_000


class ProgramSourceError(ValueError):
    """The program's code cannot be run as the spec says; the message says why, for the user."""


def is_archive(name: str) -> bool:
    return name.endswith(ARCHIVES)


def archive_names(path: Path) -> list[str]:
    """The regular files of an archive, as the names inside it; refuses a name that would leave the
    folder it is unpacked into."""
    names: list[str] = []
    if path.name.endswith(".zip"):
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if not info.is_dir():
                    names.append(_safe(info.filename))
                    if (info.external_attr >> 16) & 0o170000 == 0o120000:
                        raise ProgramSourceError(f"{info.filename} in the program's archive is a symbolic link")
    else:
        with tarfile.open(path, "r:*") as tf:
            for member in tf.getmembers():
                if member.isdir():
                    continue
                if not member.isfile():
                    raise ProgramSourceError(f"{member.name} in the program's archive is not a regular file")
                names.append(_safe(member.name))
    if len(names) > MAX_FILES:
        raise ProgramSourceError(f"the program's archive holds {len(names)} files, over the limit of {MAX_FILES}")
    return names


def _safe(name: str) -> str:
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise ProgramSourceError(f"{name!r} in the program's archive would be unpacked outside its folder")
    return path.as_posix()


def root_of(names: Iterable[str]) -> str:
    """The folder the program's paths are relative to: the one top folder every file is in (the client
    zips a folder as `<folder>/...`), else the archive's top."""
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) == 1 and all("/" in n for n in names):
        return next(iter(tops))
    return ""


def entrypoint_in(names: Iterable[str], entrypoint: str | None, root: str | None = None) -> str:
    """The archive (or folder) name of the file run as __main__: `entrypoint` under the program's root
    (root_of(names) unless given: a folder's own files are already relative to it), or its __main__.py.
    Raises ProgramSourceError naming what is there instead."""
    names = list(names)
    root = root_of(names) if root is None else root
    wanted = entrypoint or DEFAULT_PACKAGE_ENTRYPOINT
    full = f"{root}/{wanted}" if root else wanted
    if full in names:
        return full
    scripts = sorted(n.removeprefix(f"{root}/") if root else n for n in names if n.endswith(".py"))
    shown = ", ".join(scripts[:10]) + (", ..." if len(scripts) > 10 else "") or "no .py files"
    if entrypoint is None:
        raise ProgramSourceError(f"the program's folder has no {DEFAULT_PACKAGE_ENTRYPOINT}: set "
                                 f"program.entrypoint to the file to run (it holds {shown})")
    raise ProgramSourceError(f"program.entrypoint {entrypoint} is not in the program's folder (it holds {shown})")


def single_file_entrypoint(file_name: str, entrypoint: str | None) -> None:
    """A .py source is its own entrypoint."""
    if entrypoint is not None and entrypoint != file_name:
        raise ProgramSourceError(f"program.entrypoint {entrypoint} is not the program: its source is the single "
                                 f"file {file_name} (leave entrypoint out, or upload the folder)")


def unpack(archive: Path, dest: Path) -> list[str]:
    """Unpack a checked archive (archive_names) into dest; its files' names."""
    names = archive_names(archive)
    dest.mkdir(parents=True, exist_ok=True)
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(dest)
    else:
        with tarfile.open(archive, "r:*") as tf:
            # Only regular files and folders with safe names (checked above): nothing else to filter, and
            # the `filter` argument is newer than the agent's Python 3.10.
            tf.extractall(dest)  # noqa: S202
    return names
