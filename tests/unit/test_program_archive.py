"""A program's archive costs the worker and the agent a bounded amount whatever it holds, and unpacks
nothing outside its folder (issue 36, findings 6 and 8; trainjobs/program_archive.py). Each attack is
an archive built here: the worker's staging check (worker/staging_adapter.py check_program) lists it,
the agent unpacks it (agent/program.py calls unpack). The work is judged by counting what was read
(tar headers parsed, zip records made), never by timing."""

from __future__ import annotations

import functools
import gzip
import io
import lzma
import os
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainjobs.program_archive import MAX_FILES, MAX_HEADER_BYTES, MAX_UNPACKED_BYTES
from trainjobs.program_source import ProgramSourceError, archive_names, unpack
from trainjobs.source_rules import DataAccessRules
from trainjobs.spec import ProgramSpec
from worker.ports import ProgramError
from worker.staging_adapter import check_program

MIB = 1 << 20
ZERO_MIB_GZ = gzip.compress(b"\0" * MIB)  # one gzip member of 1 MiB of zeros, ~1 KB
END_OF_TAR = b"\0" * 1024


def _header(name: str, size: int = 0, kind: bytes = tarfile.REGTYPE, mode: int = 0o644) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.mode = size, kind, mode
    return info.tobuf(tarfile.USTAR_FORMAT)


def _gz_zeros(n: int) -> bytes:
    """gzip members that decompress to n zero bytes: gzip readers join concatenated members, so a bomb of
    any size costs this test a few KB and no compressing."""
    return ZERO_MIB_GZ * (n // MIB) + gzip.compress(b"\0" * (n % MIB))


def _tarball(path: Path, members: dict[str, tuple[bytes, int]]) -> Path:
    """A .tar.gz of members name -> (type, mode), empty files and folders, with any names."""
    path.write_bytes(gzip.compress(b"".join(_header(n, 0, k, m) for n, (k, m) in members.items()) + END_OF_TAR))
    return path


@pytest.fixture
def headers_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many 512-byte tar headers were parsed: tarfile makes each with TarInfo.frombuf."""
    count = [0]
    original: Callable[..., Any] = tarfile.TarInfo.frombuf.__func__  # type: ignore[attr-defined]

    def counting(cls: type[tarfile.TarInfo], buf: bytes, encoding: str, errors: str) -> tarfile.TarInfo:
        count[0] += 1
        return original(cls, buf, encoding, errors)  # type: ignore[no-any-return]

    monkeypatch.setattr(tarfile.TarInfo, "frombuf", classmethod(counting))
    return count


@functools.cache
def _empty_members(compress: Callable[[bytes], bytes]) -> bytes:
    """200,000 empty members, as the review's bomb: 100 MB of tar, 300 KB of xz or 1.7 MB of gzip."""
    return compress(_header("p/x.py") * 200_000 + END_OF_TAR)


def _xz(data: bytes) -> bytes:
    return lzma.compress(data, preset=0)


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=1)


@pytest.mark.parametrize("read", [archive_names, lambda p: unpack(p, p.parent / "out")], ids=["listed", "unpacked"])
def test_an_xz_tar_named_tar_gz_is_refused_before_a_member_is_read(tmp_path: Path, headers_read: list[int],
                                                                   read: Callable[[Path], list[str]]) -> None:
    bomb = tmp_path / "program.tar.gz"
    bomb.write_bytes(_empty_members(_xz))

    with pytest.raises(ProgramSourceError, match="named program.tar.gz but is not gzip"):
        read(bomb)
    assert headers_read[0] == 0
    assert not (tmp_path / "out").exists()


def test_a_zip_that_is_not_a_zip_is_refused_by_its_name(tmp_path: Path) -> None:
    fake = tmp_path / "program.zip"
    fake.write_bytes(gzip.compress(END_OF_TAR))

    with pytest.raises(ProgramSourceError, match="named program.zip but is not a zip file"):
        archive_names(fake)


@pytest.mark.parametrize("read", [archive_names, lambda p: unpack(p, p.parent / "out")], ids=["listed", "unpacked"])
def test_a_tar_gz_of_200000_empty_members_stops_at_the_first_past_the_limit(
        tmp_path: Path, headers_read: list[int], read: Callable[[Path], list[str]]) -> None:
    bomb = tmp_path / "program.tar.gz"
    bomb.write_bytes(_empty_members(_gz))

    with pytest.raises(ProgramSourceError, match=f"more than {MAX_FILES} files and folders"):
        read(bomb)
    assert headers_read[0] == MAX_FILES + 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("sizes", [
    [600 * MIB],  # one member over the bound
    [1024, MAX_UNPACKED_BYTES - 1024],  # each under it, together over
], ids=["one member", "two members"])
@pytest.mark.parametrize("read", [archive_names, lambda p: unpack(p, p.parent / "out")], ids=["listed", "unpacked"])
def test_a_tar_gz_that_unpacks_past_the_bound_is_refused_at_the_header_that_passes_it(
        tmp_path: Path, headers_read: list[int], read: Callable[[Path], list[str]], sizes: list[int]) -> None:
    """The data is there (zeros, as gzip members): a reader that went through it would parse the end block."""
    bomb = tmp_path / "program.tgz"
    with bomb.open("wb") as out:
        for i, size in enumerate(sizes):
            out.write(gzip.compress(_header(f"p/{i}.bin", size)))
            out.write(_gz_zeros(size) + gzip.compress(b"\0" * (-size % 512)))
        out.write(gzip.compress(END_OF_TAR))

    with pytest.raises(ProgramSourceError, match=f"unpacks to more than {MAX_UNPACKED_BYTES >> 20} MiB"):
        read(bomb)
    assert headers_read[0] == len(sizes)
    assert not (tmp_path / "out").exists()


def test_a_pax_header_past_its_bound_is_refused_before_it_is_read(tmp_path: Path, headers_read: list[int]) -> None:
    archive = tmp_path / "program.tar.gz"
    with tarfile.open(archive, "w:gz", format=tarfile.PAX_FORMAT) as tf:
        info = tarfile.TarInfo("p/__main__.py")
        info.pax_headers = {"comment": "x" * (4 * MAX_HEADER_BYTES)}
        tf.addfile(info, io.BytesIO(b""))

    with pytest.raises(ProgramSourceError, match="tar extension header"):
        archive_names(archive)
    assert headers_read[0] == 1


def _zip_of_empty_records(path: Path, count: int) -> Path:
    """A zip of `count` empty members, written record by record (zipfile's writer would take seconds)."""
    import struct

    files, directory = io.BytesIO(), io.BytesIO()
    for i in range(count):
        name = b"%x" % i
        offset = files.tell()
        files.write(struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, 0, 0, 0, len(name), 0) + name)
        directory.write(struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, 0, 0, 0, len(name), 0, 0, 0, 0,
                                    0, offset) + name)
    records = directory.getvalue()
    start = files.tell()
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, min(count, 0xFFFF), min(count, 0xFFFF), len(records), start, 0)
    path.write_bytes(files.getvalue() + records + end)
    return path


def test_a_zip_of_30000_empty_members_is_refused_before_zipfile_parses_its_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = [0]
    original = zipfile.ZipInfo.__init__

    def counting(self: zipfile.ZipInfo, *args: Any, **kwargs: Any) -> None:
        made[0] += 1
        original(self, *args, **kwargs)

    bomb = _zip_of_empty_records(tmp_path / "program.zip", 3 * MAX_FILES)
    monkeypatch.setattr(zipfile.ZipInfo, "__init__", counting)

    with pytest.raises(ProgramSourceError, match=f"over the limit of {MAX_FILES} files and folders"):
        archive_names(bomb)
    assert made[0] == 0


ESCAPES = ["../../escape", "{tmp}/absolute-escape"]


def _escaping_tar(path: Path, folder: str) -> Path:
    return _tarball(path, {"p/": (tarfile.DIRTYPE, 0o755), folder: (tarfile.DIRTYPE, 0o777),
                           "p/__main__.py": (tarfile.REGTYPE, 0o644)})


def _escaping_zip(path: Path, folder: str) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("p/__main__.py", "")
        info = zipfile.ZipInfo(folder.rstrip("/") + "/")
        info.external_attr = (0o40777 << 16) | 0x10
        zf.writestr(info, "")
    return path


@pytest.mark.parametrize("make", [_escaping_tar, _escaping_zip], ids=["tar", "zip"])
@pytest.mark.parametrize("escape", ESCAPES)
def test_a_folder_member_outside_the_archives_folder_is_refused_and_never_made(
        tmp_path: Path, escape: str, make: Callable[[Path, str], Path]) -> None:
    folder = escape.format(tmp=tmp_path)
    dest = tmp_path / "a" / "b" / "out"
    outside = {tmp_path / "a" / "escape", tmp_path / "absolute-escape"}
    archive = make(tmp_path / ("program.zip" if make is _escaping_zip else "program.tar.gz"), folder)

    with pytest.raises(ProgramSourceError, match="outside its folder"):
        archive_names(archive)
    with pytest.raises(ProgramSourceError, match="outside its folder"):
        unpack(archive, dest)
    assert not any(p.exists() for p in outside) and not dest.exists()


def test_the_staging_check_refuses_a_folder_member_outside(tmp_path: Path) -> None:
    archive = _escaping_tar(tmp_path / "program.tar.gz", "../../escape")
    rules = DataAccessRules(host_dirs=(tmp_path.resolve(),))

    with pytest.raises(ProgramError, match="'../../escape' in the program's archive would be unpacked outside"):
        check_program(ProgramSpec(source=str(archive)), rules, "bucket", "project", tmp_path / "work")


def test_unpacking_keeps_none_of_the_archives_modes_and_leaves_the_destination_as_made(tmp_path: Path) -> None:
    """A shared-writable folder, a set-uid script and './' asking for 0o777 on the destination itself."""
    archive = _tarball(tmp_path / "program.tgz", {"./": (tarfile.DIRTYPE, 0o777), "p": (tarfile.DIRTYPE, 0o777),
                                                  "p/run.sh": (tarfile.REGTYPE, 0o4777),
                                                  "p/__main__.py": (tarfile.REGTYPE, 0o666)})
    dest = tmp_path / "out"
    umask = os.umask(0)
    os.umask(umask)

    assert unpack(archive, dest) == ["p/run.sh", "p/__main__.py"]

    modes = {p.relative_to(dest).as_posix(): p.stat().st_mode & 0o7777 for p in (dest, *dest.rglob("*"))}
    assert modes == {".": 0o777 & ~umask, "p": 0o755 & ~umask, "p/run.sh": 0o755 & ~umask,
                     "p/__main__.py": 0o644 & ~umask}


def test_unpacking_replaces_what_an_earlier_attempt_left(tmp_path: Path) -> None:
    """An earlier attempt's program could have left a link where the next unpack writes."""
    dest = tmp_path / "out"
    (dest / "p").mkdir(parents=True)
    (dest / "p" / "__main__.py").symlink_to(tmp_path / "victim.txt")
    archive = _tarball(tmp_path / "program.tgz", {"p/__main__.py": (tarfile.REGTYPE, 0o644)})

    unpack(archive, dest)

    assert not (tmp_path / "victim.txt").exists() and not (dest / "p" / "__main__.py").is_symlink()
