"""A program's requirements installed by the real pip into an environment layered over this one's
(agent/requirements.py, issue 20): the package comes from a wheel made here and named by a file:// URL,
so no package index is asked. The whole job with requirements: tests/e2e/test_programs.py."""

from __future__ import annotations

import logging
import os
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

from agent.requirements import RequirementsError, cached_environment, image_versions, install_requirements
from tests.support.wheels import make_wheel


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRAINJOBS_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_requirement_installs_over_the_images_packages_and_is_reused_from_the_cache(
        tmp_path: Path, cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    wheel = make_wheel(tmp_path, "tjgreet", "0.1", {"tjgreet/__init__.py": "def hello():\n    return 'hi'\n"})
    line = f"tjgreet @ {wheel.as_uri()}"

    python = install_requirements([line], tmp_path / "first")

    said = subprocess.run([str(python), "-c", "import numpy, tjgreet; print(tjgreet.hello(), numpy.__version__, "
                           "tjgreet.__file__)"], capture_output=True, text=True, check=True).stdout.split()
    assert said[:2] == ["hi", metadata.version("numpy")]  # the image's NumPy, seen through the layer
    assert Path(said[2]).resolve().is_relative_to(cache.resolve())  # installed in the cached environment ...
    assert not any(d.name == "tjgreet" for d in Path(metadata.distribution("numpy").locate_file("")).iterdir())
    caplog.set_level(logging.INFO, logger="trainjobs.agent")
    assert install_requirements([line], tmp_path / "second") == python  # ... which the next job reuses
    assert "reusing the environment of an earlier job" in caplog.text


def test_an_environment_another_machine_is_still_building_is_left_alone(tmp_path: Path, cache: Path) -> None:
    """Sandboxed machines of one project share its cache, and each sandbox numbers its agent alike: a
    build of the same requirements by another machine's agent with this pid is not this one's to empty."""
    wheel = make_wheel(tmp_path, "tjgreet", "0.1", {"tjgreet/__init__.py": "def hello():\n    return 'hi'\n"})
    line = f"tjgreet @ {wheel.as_uri()}"
    ready = cached_environment([line], image_versions())
    theirs = ready.parent / f".{ready.name}.building-{os.getpid()}"
    theirs.mkdir(parents=True)
    (theirs / "pip-is-writing-here").touch()

    assert install_requirements([line], tmp_path / "scratch") == ready / "bin" / "python"
    assert (theirs / "pip-is-writing-here").exists()


def test_a_requirement_pip_cannot_install_fails_with_pips_words_and_caches_nothing(tmp_path: Path, cache: Path) -> None:
    missing = tmp_path / "nowhere" / "tjmissing-1.0-py3-none-any.whl"

    with pytest.raises(RequirementsError) as failed:
        install_requirements([f"tjmissing @ {missing.as_uri()}"], tmp_path / "scratch")

    assert str(failed.value).startswith("pip could not install the requirements:")
    assert str(missing) in str(failed.value)  # pip's own message names the file it could not find
    assert not (cache / "requirements").exists() or not any((cache / "requirements").iterdir())


def test_on_a_machine_that_reaches_only_its_storage_pip_asks_no_index_and_the_error_says_why(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sandboxed local machine (issue 36) reaches nothing but its storage guard: a wheel the operator's
    folder holds still installs, and a requirement only an index has fails at once, saying why."""
    monkeypatch.setenv("TRAINJOBS_MACHINE_NETWORK", "storage-only")
    wheel = make_wheel(tmp_path, "tjoffline", "0.1", {"tjoffline/__init__.py": "X = 1\n"})
    python = install_requirements([f"tjoffline @ {wheel.as_uri()}"], tmp_path / "first")
    assert subprocess.run([str(python), "-c", "import tjoffline; print(tjoffline.X)"], capture_output=True,
                          text=True, check=True).stdout.strip() == "1"

    with pytest.raises(RequirementsError) as failed:
        install_requirements(["tjonlyonanindex==1.0"], tmp_path / "second")
    assert "reaches no package index" in str(failed.value)
    assert "tjonlyonanindex" in str(failed.value)  # pip's own words follow
