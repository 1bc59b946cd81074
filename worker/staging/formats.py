"""Which format a local file or folder is in, and reading it into Examples.

`format: auto` guesses from the extension of a file (.npz, .csv or .csv.gz, .tfrecord/.tfrecords/.tfr,
gzipped or not) or the shape of a folder (only TFRecord files -> tfrecord; class sub-folders ->
image_folder; a single data file -> that file). Archives (.zip, .tar, .tar.gz, .tgz) are unpacked first,
so an image folder can arrive as one upload or one URL; a .csv.gz is decompressed within the staging
budget; TFRecord files are read compressed.
"""

from __future__ import annotations

import gzip
import tarfile
import zipfile
import zlib
from pathlib import Path

from trainjobs.spec import options_problem
from worker.staging.budget import StagingBudget
from worker.staging.errors import DatasetError
from worker.staging.examples import Examples
from worker.staging.options import ConversionOptions
from worker.staging.read_images import read_image_folder, visible
from worker.staging.read_tabular import read_csv, read_npz
from worker.staging.read_tfrecord import read_tfrecord_files

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz")


def is_tfrecord_name(name: str) -> bool:
    """train.tfrecord, x.tfrecords, x.tfr, and TFDS-style train.tfrecord-00000-of-00008."""
    lower = name.lower()
    return ".tfrecord" in lower or lower.endswith(".tfr")


def file_format(path: Path) -> str | None:
    lower = path.name.lower()
    if lower.endswith(".npz"):
        return "npz"
    if lower.endswith((".csv", ".csv.gz")):
        return "csv"
    if is_tfrecord_name(lower):
        return "tfrecord"
    return None


def read_local(path: Path, requested: str, options: ConversionOptions, scratch: Path,
               budget: StagingBudget) -> tuple[str, Examples]:
    """(the format read, its Examples) for a file or folder on local disk."""
    if path.is_file() and path.name.lower().endswith(ARCHIVE_SUFFIXES):
        path = unpack_counted(path, scratch / "unpacked", budget)
    path = _unwrap(path)
    if path.is_file() and path.name.lower().endswith(".csv.gz"):
        path = _gunzip(path, scratch / "gunzipped", budget)
    fmt = requested if requested != "auto" else _guess(path)
    if requested == "auto" and options.spec is not None and (problem := options_problem(options.spec, fmt)):
        raise DatasetError(f"dataset.options.{problem[0]}: {problem[1]} (the source was detected as {fmt}); "
                           "remove the option or set dataset.format")
    if fmt in ("npz", "csv") and not path.is_file():
        raise DatasetError(f"format {fmt} needs a single .{fmt} file, but the source is a folder")
    if fmt == "image_folder" and not path.is_dir():
        raise DatasetError("format image_folder needs a folder with one sub-folder of images per class")
    if fmt == "npz":
        return fmt, read_npz(path, options.x_key, options.y_key)
    if fmt == "csv":
        return fmt, read_csv(path, options.csv)
    if fmt == "image_folder":
        return fmt, read_image_folder(path, options.image_size, budget)
    files = [path] if path.is_file() else [p for p in visible(list(path.rglob("*"))) if p.is_file()]
    return fmt, read_tfrecord_files(files, path, options.tfrecord, budget)


def _guess(path: Path) -> str:
    if path.is_file():
        fmt = file_format(path)
        if fmt is None:
            raise DatasetError(
                f"cannot tell the format of {path.name!r} from its name; set dataset.format (npz, csv, tfrecord, "
                f"image_folder){_loose_arrays_hint([path])}"
            )
        return fmt
    entries = visible(list(path.iterdir()))
    files = [p for p in entries if p.is_file()]
    if files and all(is_tfrecord_name(p.name) for p in files):
        return "tfrecord"
    data_files = [p for p in files if p.suffix.lower() in _ARRAY_SUFFIXES or file_format(p) is not None]
    if any(p.is_dir() for p in entries) and not data_files:  # class folders (beside a LICENSE.txt, say)
        return "image_folder"
    shown = ", ".join(sorted(p.name for p in files)[:5]) + (", ..." if len(files) > 5 else "")
    raise DatasetError(f"cannot tell the format of folder {path.name!r} ({len(files)} file(s): {shown or 'none'}): "
                       "a dataset folder holds TFRecord files, or one sub-folder of images per class; give a "
                       f"single .npz or .csv file otherwise{_loose_arrays_hint(files)}")


_ARRAY_SUFFIXES = (".npy", ".npz", ".csv", ".gz", ".pkl", ".pickle", ".parquet", ".h5", ".hdf5", ".json", ".txt")


def _loose_arrays_hint(files: list[Path]) -> str:
    """What to do with files a managed dataset does not read as they are (a script's own .npy arrays,
    as SageMaker's examples ship them)."""
    if not any(p.suffix.lower() == ".npy" for p in files):
        return ""
    return ("; .npy arrays are not a dataset of their own: save features and labels in one .npz "
            "(numpy.savez(path, x=features, y=labels); dataset.options.x_key and y_key name other keys), or, "
            "for a program that reads its own files, give the folder as a channel (program.channels: "
            "{training: FOLDER}) and it arrives as it is")


def _unwrap(path: Path) -> Path:
    """Step into a folder that only wraps the data: one data file, or one folder of class folders (or
    of one data file: release/data.npz in a tarball)."""
    while path.is_dir():
        entries = visible(list(path.iterdir()))
        if len(entries) != 1:
            return path
        (inner,) = entries
        if inner.is_file() and file_format(inner) is None:
            return path
        if inner.is_dir():
            inside = visible(list(inner.iterdir()))
            one_file = len(inside) == 1 and inside[0].is_file() and file_format(inside[0]) is not None
            if not one_file and not all(p.is_dir() for p in inside):
                return path
        path = inner
    return path


def _gunzip(path: Path, into: Path, budget: StagingBudget) -> Path:
    """A gzipped file, decompressed a chunk at a time against the budget: a gzip bomb fails at the
    first byte past the limit, not after filling the disk. (TFRecord files are read compressed.)"""
    into.mkdir(parents=True, exist_ok=True)
    out = into / path.name[: -len(".gz")]
    total = 0
    try:
        with gzip.open(path, "rb") as src, out.open("wb") as dst:
            while chunk := src.read(1 << 20):
                total += len(chunk)
                budget.check_bytes(total, path.name)
                budget.check_stop()
                dst.write(chunk)
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise DatasetError(f"{path.name} is not a readable gzip file ({type(exc).__name__})") from None
    return out


def unpack_counted(archive: Path, into: Path, budget: StagingBudget) -> Path:
    """Unpack after counting the members against the budget's limits (afresh: what is inside counts on its
    own): an archive bomb fails before a byte is written. A dataset's archive, and a program's channel's."""
    into.mkdir(parents=True)
    unpacked = StagingBudget(budget.limits, budget.should_stop)  # what is inside counts afresh
    try:
        if archive.name.lower().endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                for info in z.infolist():
                    unpacked.count(info.file_size, archive.name)
                z.extractall(into)  # ZipFile drops absolute paths and '..' from member names
        else:
            with tarfile.open(archive) as t:
                for member in t:
                    unpacked.count(member.size, archive.name)
                t.extractall(into, filter="data")  # refuses links and paths that escape `into`
    except (zipfile.BadZipFile, tarfile.TarError, OSError, EOFError, ValueError) as exc:
        # The library's words may quote member names or bytes of the file: name the error's kind only.
        raise DatasetError(f"{archive.name} is not a readable archive ({type(exc).__name__})") from None
    return into
