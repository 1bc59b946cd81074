"""A program's requirements (issue 20), installed into an environment layered over the agent's: a
virtual environment without packages of its own but with the agent's site-packages on its path (a .pth
file), so what the image brings (TensorFlow, Keras, NumPy and the rest) is there and only what is
missing is installed. TensorFlow, Keras and NumPy stay the image's: a requirement whose versions leave
out the installed one is refused with that reason before pip runs, and pip runs with them pinned as
constraints, so nothing it resolves can replace them.

A Keras 2 program (`program.keras: 2`) runs with TF_USE_LEGACY_KERAS=1, under which `tf.keras` is tf_keras:
`keras_2_requirements` adds the tf-keras release of the image's TensorFlow to what is installed, unless
the image has it (or its Keras is Keras 2 already). tf-keras is released with each TensorFlow and
requires that one (tf-keras 2.21 needs TensorFlow 2.21), so the pin on the image's TensorFlow chooses it.

Environments are kept on the machine by the hash of the requirements and the interpreter, under
TRAINJOBS_CACHE_DIR (default ~/.cache/trainjobs): a second attempt or job on the same machine with the same
requirements starts at once. A half-built environment (the install failed or was killed) is never
reused: it is only moved to its cached name once pip has succeeded.

A cached environment is code that runs as the next job, trusted because it is there: whoever can write
the cache can run code in any job that reads it. The local provisioner gives each project's machines a
cache of that project's own (issue 36, finding 7; worker/local/provisioner.py `project_cache`), so a job
reuses only what its own project's jobs built: a project can still plant code in its own later jobs, which
are its own tenant. On a cloud VM the cache is the VM's disk, which one job uses.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import site
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from trainjobs.program_env import LEGACY_KERAS_ENV
from trainjobs.requirement_urls import requirement_url_problem

log = logging.getLogger("trainjobs.agent")

IMAGE_PACKAGES = ("tensorflow", "tensorflow-cpu", "tensorflow-tpu", "keras", "numpy")
TF_KERAS = "tf-keras"
PIP_TIMEOUT_S = 1800.0
PIP_OUTPUT_CHARS = 4000  # of pip's output, in the job's error
# Set by the local provisioner on a sandboxed machine whose one way out is its storage guard.
NETWORK_ENV, STORAGE_ONLY = "TRAINJOBS_MACHINE_NETWORK", "storage-only"
OFFLINE_HINT = (" (this local machine's sandbox reaches no package index: only packages already installed "
                "and file:// wheels in the operator's TRAINJOBS_HOST_DATA_DIRS install)")


class RequirementsError(Exception):
    """The requirements cannot be installed; the message says why (pip's own words where pip said it)."""


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def image_versions() -> dict[str, str]:
    """The installed versions of the packages a program may not replace."""
    return {name: version for name in IMAGE_PACKAGES if (version := installed_version(name)) is not None}


def keras_2_requirements(requirements: list[str], installed: dict[str, str], tf_keras: str | None) -> list[str]:
    """What a `program.keras: 2` program needs installed beyond `requirements`: `tf-keras==X.Y.*` for the
    image's TensorFlow X.Y, or nothing where the image's tf-keras (version `tf_keras`) is that release,
    where its Keras is Keras 2 (TensorFlow <= 2.15, whose `tf.keras` is Keras 2 itself), or where the
    program names tf-keras itself."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    if any(canonicalize_name(Requirement(line).name) == TF_KERAS for line in requirements):
        return []
    tensorflow = next((installed[n] for n in ("tensorflow", "tensorflow-cpu", "tensorflow-tpu") if n in installed), None)
    try:
        if tensorflow is None or ("keras" in installed and Version(installed["keras"]).major < 3):
            return []
        tf = Version(tensorflow)
        if tf_keras is not None and Version(tf_keras).release[:2] == tf.release[:2]:
            return []
    except InvalidVersion:
        return []
    return [f"{TF_KERAS}=={tf.major}.{tf.minor}.*"]


def refusals(requirements: list[str], installed: dict[str, str]) -> list[str]:
    """Why requirements would replace an image package, one sentence each."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    problems = []
    for line in requirements:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        version = installed.get(name)
        if version is None and name == "tensorflow":  # the image's build may be tensorflow-cpu or -tpu
            version = installed.get("tensorflow-cpu") or installed.get("tensorflow-tpu")
        if version is not None and not req.specifier.contains(version, prereleases=True):
            problems.append(f"{line!r} would replace this machine's {req.name} {version}: the image's "
                            f"TensorFlow, Keras and NumPy stay (allow {req.name}=={version}, or choose an image with "
                            "the version you need)")
    return problems


def cached_environment(requirements: list[str], installed: dict[str, str]) -> Path:
    """Where the environment of `requirements` over these image packages is kept on this machine."""
    key = hashlib.sha256(json.dumps([sorted(requirements), sys.version, sorted(installed.items())]).encode()).hexdigest()
    cache = Path(os.environ.get("TRAINJOBS_CACHE_DIR") or Path.home() / ".cache" / "trainjobs") / "requirements"
    return cache / key[:32]


def install_requirements(requirements: list[str], scratch: Path) -> Path:
    """The python of an environment that has `requirements` over the agent's packages."""
    installed = image_versions()
    # Where pip may be pointed (issue 36, finding 9) again here: a stored job skips the submit-only rules.
    problems = refusals(requirements, installed) + [p for line in requirements if (p := requirement_url_problem(line))]
    if problems:
        raise RequirementsError("; ".join(problems))
    ready = cached_environment(requirements, installed)
    cache = ready.parent
    python = ready / "bin" / "python"
    if python.exists():
        log.info("requirements: reusing the environment of an earlier job (%s)", ready)
        return python
    # Built beside its cached name, on the same file system, so that the rename publishing it cannot fail
    # for crossing one (a sandboxed machine's cache is a mount of its own, apart from its work directory).
    # A name of its own, not the pid: every sandbox numbers its agent alike (pid 3), so two machines of a
    # project building the same environment at once (a sweep's trials) would empty each other's.
    cache.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{ready.name}.building-", dir=cache))
    try:
        return _build(requirements, installed, scratch, building, ready)
    finally:
        shutil.rmtree(building, ignore_errors=True)  # published by now, or never to be: half-built


def _build(requirements: list[str], installed: dict[str, str], scratch: Path, building: Path, ready: Path) -> Path:
    python = ready / "bin" / "python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(building)], check=True,
                   capture_output=True, timeout=120)
    env_python = building / "bin" / "python"
    # The agent's own packages, after the environment's: what pip installs there comes first.
    layered = subprocess.run([str(env_python), "-c", "import site; print(site.getsitepackages()[0])"],
                             check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    ours = [p for p in site.getsitepackages() + [site.getusersitepackages()] if Path(p).is_dir()]
    (Path(layered) / "trainjobs-agent.pth").write_text("\n".join(ours) + "\n")
    scratch.mkdir(parents=True, exist_ok=True)
    constraints = scratch / "constraints.txt"
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in installed.items()))
    wanted = scratch / "requirements.txt"
    wanted.write_text("".join(f"{line}\n" for line in requirements))
    log.info("requirements: installing %s", ", ".join(requirements))
    # A machine that reaches nothing but its storage (a sandboxed local machine, issue 36): pip asks no
    # index, so it fails at once with its own words instead of retrying an unreachable one for minutes.
    offline = os.environ.get(NETWORK_ENV) == STORAGE_ONLY
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(env_python), "install", "--disable-pip-version-check",
             "--no-input", *(["--no-index"] if offline else []), "-r", str(wanted), "-c", str(constraints)],
            capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RequirementsError(f"installing the requirements took over {PIP_TIMEOUT_S:.0f}s") from None
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip())[-PIP_OUTPUT_CHARS:]
        hint = OFFLINE_HINT if offline else ""
        raise RequirementsError(f"pip could not install the requirements{hint}:\n{said}")
    for line in done.stdout.splitlines():
        log.info("pip: %s", line)
    try:
        building.rename(ready)
    except OSError:  # another job on this machine finished the same environment first
        if not python.exists():
            raise RequirementsError(f"the environment could not be moved to {ready}") from None
    return python
