"""The pure parts of program jobs (issue 20): how a program's code is unpacked and its entrypoint found
(trainjobs/program_source.py), which requirements would replace the image's packages
(agent/requirements.py), what SageMaker's SM_HPS gets, how a requirements.txt is read. The jobs
themselves: tests/e2e/test_programs.py, tests/e2e/test_program_runs.py."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from agent.program import _hyperparameters
from agent.requirements import refusals
from trainjobs.client.local_paths import requirements_lines
from trainjobs.storage import restorable
from trainjobs.program_source import (
    ProgramSourceError, archive_names, entrypoint_in, root_of, single_file_entrypoint, unpack,
)


def _zip(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def test_a_zipped_folder_runs_from_inside_its_folder(tmp_path: Path) -> None:
    names = archive_names(_zip(tmp_path / "trainer.zip", {"trainer/task.py": "", "trainer/util/io.py": ""}))
    assert root_of(names) == "trainer"
    assert entrypoint_in(names, "task.py") == "trainer/task.py"
    assert entrypoint_in(names, "util/io.py") == "trainer/util/io.py"


def test_an_archive_of_loose_files_runs_from_its_top(tmp_path: Path) -> None:
    names = archive_names(_zip(tmp_path / "p.zip", {"__main__.py": "", "lib/x.py": ""}))
    assert root_of(names) == "" and entrypoint_in(names, None) == "__main__.py"


def test_a_missing_entrypoint_names_what_the_folder_holds() -> None:
    with pytest.raises(ProgramSourceError, match=r"no __main__.py: set program.entrypoint .*train.py, util.py"):
        entrypoint_in(["pkg/train.py", "pkg/util.py", "pkg/data.csv"], None)
    with pytest.raises(ProgramSourceError, match="program.entrypoint main.py is not in the program's folder"):
        entrypoint_in(["pkg/train.py"], "main.py")


def test_a_single_file_is_its_own_entrypoint() -> None:
    single_file_entrypoint("train.py", None)
    single_file_entrypoint("train.py", "train.py")
    with pytest.raises(ProgramSourceError, match="single file train.py"):
        single_file_entrypoint("train.py", "other.py")


@pytest.mark.parametrize("name", ["../evil.py", "/etc/cron.d/x", "a/../../b.py"])
def test_a_zip_entry_that_would_land_outside_is_refused(tmp_path: Path, name: str) -> None:
    archive = _zip(tmp_path / "bad.zip", {"ok.py": "", name: "boom"})
    with pytest.raises(ProgramSourceError, match="outside its folder"):
        unpack(archive, tmp_path / "out")
    assert not (tmp_path / "evil.py").exists() and not (tmp_path / "out").exists()


def _tarball(path: Path, files: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            link = tarfile.TarInfo(name)
            link.type, link.linkname = tarfile.SYMTYPE, target
            tf.addfile(link)
    return path


def test_links_in_a_tarball_are_refused(tmp_path: Path) -> None:
    archive = _tarball(tmp_path / "p.tar.gz", {"p/__main__.py": b"print('hi')"}, {"p/secrets": "/root/.config"})
    with pytest.raises(ProgramSourceError, match="p/secrets .* is not a regular file"):
        archive_names(archive)


def test_a_symlink_in_a_zip_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "l.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        info = zipfile.ZipInfo("p/link")
        info.external_attr = (0o120777 << 16)
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(ProgramSourceError, match="symbolic link"):
        archive_names(archive)


def test_a_tarball_unpacks_its_files(tmp_path: Path) -> None:
    data = b"print('hi')\n"
    archive = _tarball(tmp_path / "p.tgz", {"p/__main__.py": data})
    assert unpack(archive, tmp_path / "out") == ["p/__main__.py"]
    assert (tmp_path / "out" / "p" / "__main__.py").read_bytes() == data


INSTALLED = {"tensorflow": "2.21.0", "keras": "3.15.0", "numpy": "2.1.3"}


@pytest.mark.parametrize(("line", "refused"), [
    ("numpy<2", True),
    ("numpy>=1.26", False),
    ("keras==3.15.*", False),
    ("keras<3", True),
    ("tensorflow==2.20.*", True),
    ("TensorFlow>=2.16", False),
    ("pandas==1.0", False),  # not the image's to keep
])
def test_a_requirement_may_not_leave_out_the_images_version(line: str, refused: bool) -> None:
    problems = refusals([line], INSTALLED)
    assert bool(problems) == refused, problems
    if refused:
        assert "would replace this machine's" in problems[0] and line in problems[0]


def test_tensorflow_is_the_images_build_whatever_its_distribution_is_called() -> None:
    assert refusals(["tensorflow<2.18"], {"tensorflow-cpu": "2.21.0"})
    assert not refusals(["tensorflow>=2.18"], {"tensorflow-tpu": "2.20.0"})


def test_sagemaker_hyperparameters_are_the_named_arguments() -> None:
    assert _hyperparameters(["--epochs", "20", "--verbose", "--lr", "0.1", "data.csv"]) == {"epochs": "20", "lr": "0.1"}


def test_a_requirements_file_gives_its_requirement_lines() -> None:
    text = "# pinned for the paper\nkeras-hub==0.21.*  # the model zoo\n\n-r base.txt\npandas>=2\n"
    assert requirements_lines(text) == ["keras-hub==0.21.*", "-r base.txt", "pandas>=2"]


def test_a_program_needs_neither_model_nor_dataset() -> None:
    from trainjobs.spec import SPEC_VERSION, JobSpec, parse_stored

    spec = JobSpec.model_validate({"program": {"source": "gs://b/uploads/p/train.py", "args": ["--epochs", "3"]}})
    assert spec.is_program and spec.model is None and spec.dataset is None
    assert spec.code == ("program.source", "gs://b/uploads/p/train.py")
    assert spec.spec_version == SPEC_VERSION == 3
    assert parse_stored(spec.model_dump(mode="json")) == spec


def test_object_names_that_would_climb_out_of_a_restored_directory_are_left_in_storage(tmp_path: Path) -> None:
    """A program writes any name under its own job's checkpoint prefix (GCS takes '..' in one); a new
    attempt restores that prefix into its checkpoint directory."""
    names = ["ckpt/state.json", "../../../.bashrc", "ckpt/../../escaped", "ckpt/../kept.txt", "/etc/cron.d/x",
             "ckpt/"]
    assert restorable(names, tmp_path / "work" / "checkpoints") == ["ckpt/state.json", "ckpt/../kept.txt"]


def test_what_the_program_left_in_sm_output_data_dir_is_kept_with_its_artifacts_and_nothing_else(
        tmp_path: Path) -> None:
    import os
    import socket

    from agent.job import WorkDir
    from agent.program import _keep_output_data
    from trainjobs.storage import local_files

    work, out = WorkDir(tmp_path / "w"), tmp_path / "artifacts"
    data = work.root / "output" / "data"
    (data / "eval").mkdir(parents=True)
    (data / "eval" / "scores.json").write_text("{}")
    os.mkfifo(data / "pipe")  # a pipe or socket failed the job after its program had succeeded
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(data / "sock"))
        _keep_output_data(work, out)
    assert [p.relative_to(out).as_posix() for p in local_files(out)] == ["output/data/eval/scores.json"]

    # The folder replaced by a link: what it leads to is none of the program's output.
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "secret").write_text("s")
    again, out = WorkDir(tmp_path / "w2"), tmp_path / "artifacts2"
    (again.root / "output").mkdir(parents=True)
    (again.root / "output" / "data").symlink_to(tmp_path / "elsewhere")
    _keep_output_data(again, out)
    assert not (out / "output").exists()
