"""A program's archive, read within bounds (issue 36, findings 6 and 8). The worker lists it before any
machine starts (archive_names, from worker/staging_adapter.py); the agent unpacks it on the machine
(unpack, from agent/program.py). Both read it here, the same way, in one pass that stops at the first
thing past a bound, so what one tenant's archive costs the worker does not depend on what it holds:

- the compression its name promises and no other: .tar.gz and .tgz are gzip, .zip is zip (tarfile's
  "r:*" also took xz and bzip2: a 186 KB xz tar named .tar.gz held 200,000 members);
- at most MAX_FILES members, folders included, counted as they are read (never listed first); a zip's
  central directory, which zipfile parses whole when it opens, is bounded before it is opened;
- at most MAX_UNPACKED_BYTES decompressed: a tar's whole stream (headers and padding included) passes a
  counter, and a member whose declared size would pass the bound is refused at its header, before its
  data is read; a zip's declared sizes add up to at most the bound, and the bytes written count again;
- tar extension headers (pax, GNU long names) of at most MAX_HEADER_BYTES each, MAX_TAR_HEADERS in all;
- every member, folders included, named inside the folder (no absolute name, no '..'), and nothing but
  regular files and folders (no links, devices, fifos or sparse files).

Unpacking writes each member itself rather than through extractall: folders 0o755, files 0o644 (0o755
when the archive marks them executable by their owner), none of the archive's owners, times or other
mode bits. That is tarfile's filter="data", on every Python the agent runs on (the TPU VM images' 3.10
has filters only from 3.10.12), and the writer counts the bytes it writes.
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from trainjobs.uploads import MAX_MODULE_BYTES

MAX_FILES = 10_000  # members, files and folders alike: each costs the reader the same
# What a program archive may unpack to: ten times the code upload cap (MAX_MODULE_BYTES, 50 MiB), so a
# cap-sized archive of incompressible files fits ten times over and one of source text (gzip: 4-6x)
# about twice. At the bound, reading through the stream costs the worker about 1.5 s of CPU.
MAX_UNPACKED_BYTES = 512 << 20
MAX_HEADER_BYTES = 64 << 10  # a pax header or GNU long name; a path is at most 4 KiB on Linux
MAX_TAR_HEADERS = 4 * MAX_FILES  # a member's own header and up to three extension headers before it
_GZIP_MAGIC = b"\x1f\x8b"
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")  # a local file header; an empty zip's end record
_ZIP_DIRECTORY_RECORD = b"PK\x01\x02"
_TAR_EXTENSIONS = frozenset({tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE,
                             tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK})
_CHUNK = 1 << 20


class ProgramSourceError(ValueError):
    """The program's code cannot be run as the spec says; the message says why, for the user."""


@dataclass(frozen=True)
class _Member:
    name: str  # checked and normalised; "" for the archive's own top folder ("./")
    is_dir: bool
    executable: bool
    open: Callable[[], IO[bytes]]  # its data; a tar member's only until the next member is read


def archive_names(path: Path) -> list[str]:
    """The regular files of an archive, as the names inside it; ProgramSourceError for an archive past a
    bound, or with a member that is not a regular file or folder inside the folder it is unpacked into."""
    return [m.name for m in _members(path) if not m.is_dir]


def unpack(archive: Path, dest: Path) -> list[str]:
    """Unpack an archive into dest, which is replaced (an earlier attempt's program may have left links
    in it); its files' names. On any refusal nothing of it is left."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    names, written = [], _Written()
    try:
        for member in _members(archive):
            target = dest.joinpath(member.name)
            try:
                if member.is_dir:
                    target.mkdir(mode=0o755, parents=True, exist_ok=True)
                else:
                    target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                    _write(member, target, written)
                    names.append(member.name)
            except OSError as exc:  # a file where the archive has a folder, or the other way round
                raise ProgramSourceError(f"{member.name} in the program's archive cannot be unpacked: "
                                         f"{exc.strerror}") from None
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return names


@dataclass
class _Written:
    total: int = 0


def _write(member: _Member, target: Path, written: _Written) -> None:
    # O_NOFOLLOW: dest is fresh and no member is a link, but a file is never written through one anyway.
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o755 if member.executable else 0o644)
    with os.fdopen(fd, "wb") as out, member.open() as data:
        while chunk := data.read(_CHUNK):
            written.total += len(chunk)
            if written.total > MAX_UNPACKED_BYTES:  # counted as written, whatever the archive declared
                raise _too_big()
            out.write(chunk)


def _members(path: Path) -> Iterator[_Member]:
    size = path.stat().st_size
    if size > MAX_MODULE_BYTES:
        raise ProgramSourceError(f"the program's archive is {size} bytes, over the {MAX_MODULE_BYTES >> 20} MiB "
                                 "code limit")
    with path.open("rb") as raw:
        head = raw.read(4)
        raw.seek(0)
        if path.name.endswith(".zip"):
            if not head.startswith(_ZIP_MAGICS):
                raise ProgramSourceError(f"the program's archive is named {path.name} but is not a zip file")
            yield from _zip_members(raw)
        else:
            if not head.startswith(_GZIP_MAGIC):
                raise ProgramSourceError(f"the program's archive is named {path.name} but is not gzip: a .tar.gz "
                                         "or .tgz is a gzip-compressed tar (for other compressions, upload a .zip)")
            yield from _tar_members(raw)


def _safe(name: str) -> str:
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts:
        raise ProgramSourceError(f"{name!r} in the program's archive would be unpacked outside its folder")
    return path.as_posix() if path.parts else ""


def _check_count(count: int) -> None:
    if count > MAX_FILES:
        raise ProgramSourceError(f"the program's archive holds more than {MAX_FILES} files and folders, "
                                 "over the limit")


def _too_big() -> ProgramSourceError:
    return ProgramSourceError(f"the program's archive unpacks to more than {MAX_UNPACKED_BYTES >> 20} MiB, "
                              "over the limit")


# --- tar ------------------------------------------------------------------------------------------

class _Counted:
    """The decompressed tar stream, refused past MAX_UNPACKED_BYTES; never asked for more than one byte
    beyond it, so no single read (a pax header's, a member's) can make the reader hold more. tarfile's
    stream mode ("r|") only reads it."""

    def __init__(self, stream: gzip.GzipFile):
        self.stream, self.count = stream, 0

    def read(self, size: int, /) -> bytes:
        data = self.stream.read(min(size, MAX_UNPACKED_BYTES - self.count + 1))
        self.count += len(data)
        if self.count > MAX_UNPACKED_BYTES:
            raise _too_big()
        return data

    def write(self, b: bytes, /) -> object:
        raise io.UnsupportedOperation("read only")

    def tell(self) -> int:
        return self.count

    def seek(self, pos: int, /) -> object:
        raise io.UnsupportedOperation("a stream")

    def close(self) -> object:
        return None


def _tar_members(raw: IO[bytes]) -> Iterator[_Member]:
    headers = 0

    class CheckedHeader(tarfile.TarInfo):
        """Every 512-byte header, counted and its extension's size checked before tarfile reads its body
        (frombuf is tarfile's public constructor of a header, called for extension headers too)."""

        @classmethod
        def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> CheckedHeader:
            nonlocal headers
            headers += 1
            if headers > MAX_TAR_HEADERS:
                raise ProgramSourceError(f"the program's archive has more than {MAX_TAR_HEADERS} tar headers, "
                                         "over the limit")
            info = super().frombuf(buf, encoding, errors)
            if info.type in _TAR_EXTENSIONS and info.size > MAX_HEADER_BYTES:
                raise ProgramSourceError(f"the program's archive has a tar extension header of {info.size} bytes, "
                                         f"over the limit of {MAX_HEADER_BYTES}")
            return info

    try:
        # "r|": a stream, read once front to back through the counter; nothing is listed ahead.
        with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped, \
                tarfile.open(fileobj=_Counted(unzipped), mode="r|", tarinfo=CheckedHeader) as tf:
            for count, member in enumerate(tf, start=1):
                _check_count(count)
                name = _safe(member.name)
                if member.offset_data + member.size > MAX_UNPACKED_BYTES:  # refused before its data is read
                    raise _too_big()
                if member.isdir():
                    yield _Member(name, True, False, lambda: io.BytesIO())
                elif member.type in (tarfile.REGTYPE, tarfile.AREGTYPE) and name:
                    yield _Member(name, False, bool(member.mode & 0o100), _opener(tf, member))
                else:
                    raise ProgramSourceError(f"{member.name} in the program's archive is not a regular file")
    # RecursionError: tarfile reads a chain of pax headers recursively, one frame per header.
    except (EOFError, zlib.error, gzip.BadGzipFile, tarfile.TarError, RecursionError) as exc:
        raise ProgramSourceError(f"the program's archive is not a readable .tar.gz ({type(exc).__name__})") from None


def _opener(tf: tarfile.TarFile, member: tarfile.TarInfo) -> Callable[[], IO[bytes]]:
    def open_member() -> IO[bytes]:
        data = tf.extractfile(member)
        assert data is not None  # a regular file's
        return data
    return open_member


# --- zip ------------------------------------------------------------------------------------------

def _zip_members(raw: IO[bytes]) -> Iterator[_Member]:
    _bound_zip_directory(raw)
    try:
        with zipfile.ZipFile(raw) as zf:
            declared = 0
            for count, info in enumerate(zf.infolist(), start=1):
                _check_count(count)
                name = _safe(info.filename)
                kind = (info.external_attr >> 16) & 0o170000
                if kind == 0o120000:
                    raise ProgramSourceError(f"{info.filename} in the program's archive is a symbolic link")
                if kind not in (0, 0o100000, 0o040000):
                    raise ProgramSourceError(f"{info.filename} in the program's archive is not a regular file")
                if info.flag_bits & 0x1:
                    raise ProgramSourceError(f"{info.filename} in the program's archive is encrypted")
                declared += info.file_size
                if declared > MAX_UNPACKED_BYTES:
                    raise _too_big()
                if info.is_dir() or kind == 0o040000:
                    yield _Member(name, True, False, lambda: io.BytesIO())
                elif name:
                    yield _Member(name, False, bool((info.external_attr >> 16) & 0o100), _zip_opener(zf, info))
                else:
                    raise ProgramSourceError(f"{info.filename!r} in the program's archive is not a file name")
    except (zipfile.BadZipFile, NotImplementedError, EOFError, zlib.error) as exc:
        raise ProgramSourceError(f"the program's archive is not a readable .zip ({type(exc).__name__})") from None


def _zip_opener(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> Callable[[], IO[bytes]]:
    return lambda: zf.open(info)


def _bound_zip_directory(raw: IO[bytes]) -> None:
    """zipfile reads a zip's whole central directory when it opens it, one object per record: a 50 MiB
    zip of 600,000 empty members cost 3.8 s and 290 MiB there. Each record it parses starts with the
    record signature at its own place in the file, so counting the signatures in the file bounds that
    work whatever the end record claims. The bound is twice MAX_FILES: a zip stored uncompressed inside
    the program carries records of its own."""
    records, tail = 0, b""
    while chunk := raw.read(_CHUNK):
        window = tail + chunk
        records += window.count(_ZIP_DIRECTORY_RECORD)
        # A signature cut by the chunk's end is counted in the next window; none fits wholly in the tail.
        tail = window[-3:]
        if records > 2 * MAX_FILES:
            raise ProgramSourceError(f"the program's archive has more than {2 * MAX_FILES} zip directory records, "
                                     f"over the limit of {MAX_FILES} files and folders")
    raw.seek(0)
