"""spec.program: the user's own training program (issue 20), run on the machine with the runtime
(trainjobs/runtime) that hands it the strategy, precision, step fusion, data and directories the rest of
the spec asks for. It excludes spec.model (trainjobs/spec/job.py).

What is checked here, at submit: the entrypoint is a relative path inside the source, the arguments and
environment are small and storable, each requirement is a PEP 508 line, and none would replace the
TensorFlow, Keras or NumPy the machine's image brings (only a version range that still admits some
version is let through: the agent checks it against the image's own versions before it installs).
Whether the entrypoint exists in the uploaded source is staging's to check (worker/staging_adapter.py).
A requirement's own URL (`name @ url`) is fetched by pip on the machine, past any check of ours: at
submit it must be https:// to a public host name or a file:// (trainjobs/requirement_urls.py); whether
the operator lets pip fetch from that host or folder is the deployment's to check (service/db/admission.py,
and staging again), as it reads the deployment's settings.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from trainjobs.program_env import reserved
from trainjobs.requirement_urls import requirement_url_problem
from trainjobs.spec.strict import StrictModel, fail, submitting

MAX_ARGS, MAX_ARG_CHARS = 256, 4096
MAX_ENV, MAX_ENV_VALUE = 128, 4096
MAX_REQUIREMENTS = 64
# The image's own: a requirement may name them only to say which versions the program works with.
IMAGE_PACKAGES = frozenset({"tensorflow", "tensorflow-cpu", "tensorflow-tpu", "keras", "numpy"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class ProgramSpec(StrictModel):
    source: str = Field(min_length=1, max_length=2048, description=(
        "Your program: a .py file or a package folder (`trainjobs submit` uploads a local path; "
        "POST /v1/modules returns the gs:// URI of an upload)."))
    entrypoint: str | None = Field(default=None, max_length=512, description=(
        "The file run as __main__, relative to the source folder; default: the .py file itself, or "
        "the folder's __main__.py."))
    args: list[str] = Field(default_factory=list, description="Command-line arguments, passed as written.")
    requirements: list[str] = Field(default_factory=list, description=(
        "PEP 508 lines, installed on the machine over the image's packages (TensorFlow, Keras and "
        "NumPy stay the image's)."))
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables for the program.")
    keras: Literal[2, 3] = Field(default=3, description=(
        "The Keras the program is written for. 3: the image's Keras (`import keras`; `tf.keras` is Keras 3 "
        "from TensorFlow 2.16 on). 2: tf_keras, the Keras 2 of TensorFlow <= 2.15, for scripts written for those "
        "containers (`model.save(dir)` to a SavedModel, `.h5` files, `keras.optimizers.legacy`): the program runs "
        "with TF_USE_LEGACY_KERAS=1, so `tf.keras` is tf_keras, and the tf-keras release of the machine's "
        "TensorFlow is installed if the image lacks it."))

    @field_validator("entrypoint")
    @classmethod
    def _relative(cls, v: str | None) -> str | None:
        if v is None:
            return v
        path = PurePosixPath(v)
        if path.is_absolute() or ".." in path.parts or "\\" in v or not v.endswith(".py"):
            raise fail("entrypoint", f"entrypoint {v!r} must be a .py file given relative to the source folder, "
                                     "inside it (no leading '/', no '..')")
        return v

    # A field validator's error is already on its field's path: fail() names the part inside it.

    @field_validator("args")
    @classmethod
    def _args(cls, v: list[str]) -> list[str]:
        return _each(v, "args", MAX_ARGS, "arguments", lambda arg: (
            f"an argument of {len(arg)} characters, over the limit of {MAX_ARG_CHARS}" if len(arg) > MAX_ARG_CHARS
            else None))

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        _each(list(v), "env", MAX_ENV, "variables", lambda name: None)
        for name, value in v.items():
            if not _ENV_NAME.match(name):
                raise fail(name, f"{name!r} is not an environment variable name (letters, digits, '_')")
            if reserved(name):
                raise fail(name, f"{name} is set by trainjobs for every program (the runtime's "
                                          "directories, TF_CONFIG, storage); it cannot be overridden")
            if len(value) > MAX_ENV_VALUE:
                raise fail(name, f"a value of {len(value)} characters, over the limit of {MAX_ENV_VALUE}")
        return v

    @field_validator("requirements")
    @classmethod
    def _requirements(cls, v: list[str], info: ValidationInfo) -> list[str]:
        # Where a URL may point is a rule of issue 36: a job stored before it was accepted as it was.
        problem = _submitted_requirement_problem if submitting(info) else requirement_problem
        return _each(v, "requirements", MAX_REQUIREMENTS, "requirements", problem)


def _each(items: list[str], field: str, limit: int, what: str, problem: Callable[[str], str | None]) -> list[str]:
    """At most `limit` items, each without a problem; an error names the item by its index."""
    if len(items) > limit:
        raise fail(field, f"{len(items)} {what}, over the limit of {limit}")
    for i, item in enumerate(items):
        if found := problem(item):
            raise fail(str(i), found)
    return items


def _submitted_requirement_problem(line: str) -> str | None:
    return requirement_problem(line) or requirement_url_problem(line)


def requirement_problem(line: str) -> str | None:
    """Why a requirement line is refused at submit, or None."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    text = line.strip()
    if not text or text.startswith(("-", "#")):
        return (f"{line!r} is not a requirement: give one PEP 508 line per entry (pip options such as "
                "--index-url and -r are not taken)")
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        return f"{line!r} is not a PEP 508 requirement: {exc}"
    if canonicalize_name(req.name) in IMAGE_PACKAGES and req.url is not None:
        return (f"{line!r} would replace the image's {req.name} with a build from elsewhere: the machine's "
                "TensorFlow, Keras and NumPy stay as the image brings them")
    return None
