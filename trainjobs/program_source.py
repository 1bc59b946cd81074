"""A program job's code as it travels (issue 20): one .py file, a package folder zipped by the client
(`<folder>/...` inside a .zip), a .tar.gz, or a folder of objects under a gs:// prefix. Staging reads
the list of its files to check the entrypoint before any machine starts (worker/staging_adapter.py);
the agent unpacks it on the machine and runs the entrypoint (agent/program.py). Both decide the same
way here: which folder is the program's root and which file is run.

An archive is read within bounds (members, decompressed bytes, its compression) and unpacked without
anything that could write outside the destination (absolute names, `..`, links, devices):
trainjobs/program_archive.py.
"""

from __future__ import annotations

from collections.abc import Iterable

# Reading an archive within bounds is its own module; callers take it from here with the rest.
from trainjobs.program_archive import (
    MAX_FILES as MAX_FILES, ProgramSourceError as ProgramSourceError, archive_names as archive_names,
    unpack as unpack,
)

ARCHIVES = (".zip", ".tar.gz", ".tgz")
DEFAULT_PACKAGE_ENTRYPOINT = "__main__.py"


def is_archive(name: str) -> bool:
    return name.endswith(ARCHIVES)


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
