"""A program's channels at staging (issue 37): each source's files copied, as they are, into the job's
own directory (jobs/<id>/channels/<name>/), before any machine starts; the agent downloads them from
there (agent/channels.py).

What the job may name is the same as for its dataset (trainjobs/source_rules.py, applied again here as
the operator's rules stand today); what only the data can tell fails the job here, naming the channel:
a source that does not exist, holds no files, or passes the limits of what a job's channels may hold
together (TRAINJOBS_CHANNELS_MAX_BYTES, and staging's TRAINJOBS_STAGING_MAX_FILES). Every file is
counted as it is listed, so a source too large fails at the first file past a limit (a prefix of millions
of objects is not listed to its end), and before the first is copied, so it copies nothing.

    gs://bucket/key            one object, under its own name
    gs://bucket/prefix/        every object under it, by its name below the prefix (server-side copies)
    dataset:<sha256>           the project's upload; an archive (.zip, .tar, .tar.gz, .tgz) is unpacked,
                               which is how `trainjobs submit` sends a local file or folder
    /host/path                 a file or folder inside the operator's TRAINJOBS_HOST_DATA_DIRS
    https://host/file          downloaded under its name (fetch.py's rules)

The copies are the job's: what the program reads is what was staged, whatever becomes of the source.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlparse

from trainjobs import storage
from trainjobs.addresses import shown
from trainjobs.job_paths import JobPaths
from trainjobs.source_rules import DataAccessRules, SourceRefused, check_source
from trainjobs.uploads import find_upload
from worker.ports import DatasetError, ProgramError
from worker.staging.budget import StagingBudget, StagingLimits
from worker.staging.fetch import fetch
from worker.staging.formats import unpack_counted
from worker.staging.gcs_source import listed_objects

MAX_BYTES_ENV = "TRAINJOBS_CHANNELS_MAX_BYTES"
DEFAULT_MAX_BYTES = 20 << 30  # a job's channels together: what one machine's disk is asked to hold
ARCHIVES = (".zip", ".tar", ".tar.gz", ".tgz")


@dataclass(frozen=True)
class ChannelFile:
    """One file of a channel: its name in the channel's folder, its size, and how to copy it."""

    name: str
    size: int
    blob: Any = None  # a gs:// object, copied server-side
    path: Path | None = None  # a file on this host (an allowed host path, a download, an unpacked member)


def max_bytes() -> int:
    """TRAINJOBS_CHANNELS_MAX_BYTES, read at each staging; a bad value is refused naming the variable."""
    text = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"{MAX_BYTES_ENV} must be a positive number of bytes, not {text!r}")
    return value


class ChannelCounter:
    """The files and bytes of a job's channels together, against their limits."""

    def __init__(self, limits: StagingLimits):
        self.max_files = limits.max_files
        self.max_bytes = max_bytes()
        self.files = self.bytes = 0

    def count(self, name: str, size: int) -> None:
        self.files, self.bytes = self.files + 1, self.bytes + size
        if self.files > self.max_files:
            raise ProgramError(f"program.channels.{name}: the job's channels hold more than {self.max_files} files "
                               "(TRAINJOBS_STAGING_MAX_FILES)")
        if self.bytes > self.max_bytes:
            raise ProgramError(f"program.channels.{name}: the job's channels hold more than {self.max_bytes} bytes "
                               f"({MAX_BYTES_ENV})")


def stage_channels(channels: dict[str, str], *, job_id: str, project_id: str, rules: DataAccessRules,
                   limits: StagingLimits, bucket: str, work: Path) -> None:
    """Every channel listed and counted, then copied to the job's directory; ProgramError naming the
    channel when one cannot be."""
    counter = ChannelCounter(limits)
    found: dict[str, list[ChannelFile]] = {}
    try:
        for name, source in channels.items():
            found[name] = []
            for f in _files(name, source, project_id, rules, limits, bucket, work / name):
                counter.count(name, f.size)
                found[name].append(f)
            if not found[name]:
                raise ProgramError(f"program.channels.{name}: {shown(source)} holds no files")
        paths = JobPaths.for_job(job_id)  # the job's own directory, where its agent reads
        for name, files in found.items():
            _copy(files, paths.channel(name))
    except DatasetError as exc:
        if isinstance(exc, ProgramError):
            raise
        raise ProgramError(f"program.channels: {exc}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _files(name: str, source: str, project_id: str, rules: DataAccessRules, limits: StagingLimits, bucket: str,
           scratch: Path) -> Iterable[ChannelFile]:
    field = f"program.channels.{name}"
    try:
        check_source(source, rules=rules, bucket=bucket, project_id=project_id, own_job=None)
    except SourceRefused as exc:
        raise ProgramError(f"{field}: {exc}") from None
    if source.startswith("gs://"):
        return _gcs_files(field, source)
    if source.startswith("dataset:"):
        blob = find_upload(project_id, source.removeprefix("dataset:"), bucket=bucket)
        if blob is None:
            raise ProgramError(f"{field}: no upload {shown(source)} in this project (POST /v1/datasets)")
        file_name = PurePosixPath(blob.name).name
        if not file_name.lower().endswith(ARCHIVES):
            return [ChannelFile(file_name, int(blob.size or 0), blob=blob)]
        scratch.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(scratch / file_name), raw_download=True)
        return _unpacked(field, scratch / file_name, scratch / "unpacked", limits)
    if source.startswith(("https://", "http://")):
        file_name = PurePosixPath(unquote(urlparse(source).path)).name
        if file_name in ("", ".."):  # '..' ('%2e%2e') would name the folder above the download's
            file_name = "download"
        target = fetch(source, scratch / file_name, rules=rules, budget=StagingBudget(limits))
        return [ChannelFile(file_name, target.stat().st_size, path=target)]
    path = rules.host_path(source)  # allowed and resolved: check_source said so
    if path.is_file():
        return [ChannelFile(path.name, path.stat().st_size, path=path)]
    if not path.is_dir():
        raise ProgramError(f"{field}: no file or folder at {shown(source)}")
    return _tree(path, lambda p: any(p.is_relative_to(d) for d in rules.host_dirs))


def _gcs_files(field: str, uri: str) -> Iterator[ChannelFile]:
    """As they are listed: the caller counts each, and stops the listing at the first past a limit."""
    listed = 0
    try:
        for prefix, blob in listed_objects(uri):
            if prefix == blob.name:  # the one object the URI names
                rel = PurePosixPath(prefix).name
            else:
                rel = blob.name[len(prefix):]
                if any(part in ("", ".", "..") for part in rel.split("/")):
                    raise ProgramError(f"{field}: object {blob.name} has a name that cannot be a file's")
            listed += 1
            yield ChannelFile(rel, int(blob.size or 0), blob=blob)
    except ProgramError:
        raise
    except DatasetError as exc:
        raise ProgramError(f"{field}: {exc}") from None
    if not listed:
        raise ProgramError(f"{field}: no object or folder at {shown(uri)}")


def _unpacked(field: str, archive: Path, into: Path, limits: StagingLimits) -> Iterator[ChannelFile]:
    """An archive's files, unpacked after their sizes were counted: a bomb fails before a byte is written."""
    try:
        unpack_counted(archive, into, StagingBudget(limits))
    except DatasetError as exc:
        raise ProgramError(f"{field}: {exc}") from None
    return _tree(into, lambda p: p.is_relative_to(into.resolve()))


def _tree(root: Path, inside: Any) -> Iterator[ChannelFile]:
    """The files under root, by their names below it, as they are found (the caller counts each); a link
    that leads outside what `inside` allows is left out (it would copy the worker's files into the job)."""
    for path in root.rglob("*"):
        if path.is_file() and inside(path.resolve()):
            yield ChannelFile(path.relative_to(root).as_posix(), path.stat().st_size, path=path)


def _copy(files: list[ChannelFile], prefix: str) -> None:
    """Into the job's folder for the channel: what an earlier staging of the job left there goes first."""
    bucket_name, key = storage.split_uri(prefix + "/")
    dest = storage.bucket(bucket_name)
    for old in storage.client().list_blobs(bucket_name, prefix=key):
        old.delete()
    for f in files:
        if f.blob is not None:
            # A rewrite, call by call: one copy call may not finish a large object or one between buckets of
            # other locations or storage classes (GCS's objects.rewrite; copyTo does not continue).
            target = dest.blob(key + f.name)
            token, _, _ = target.rewrite(f.blob)
            while token is not None:
                token, _, _ = target.rewrite(f.blob, token=token)
        else:
            assert f.path is not None
            dest.blob(key + f.name).upload_from_filename(str(f.path))
