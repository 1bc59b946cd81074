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

import math
import re
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Annotated, Literal

from pydantic import Field, Strict, ValidationInfo, field_validator

from trainjobs.program_env import LEGACY_KERAS_ENV, reserved, reserved_reason
from trainjobs.requirement_urls import requirement_url_problem
from trainjobs.spec.dataset import SOURCE_SHAPE
from trainjobs.spec.strict import StrictModel, fail, submitting

MAX_ARGS, MAX_ARG_CHARS = 256, 4096
MAX_ENV, MAX_ENV_VALUE = 128, 4096
MAX_REQUIREMENTS = 64
# The image's own: a requirement may name them only to say which versions the program works with.
IMAGE_PACKAGES = frozenset({"tensorflow", "tensorflow-cpu", "tensorflow-tpu", "keras", "numpy"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# SageMaker's own limits: 100 hyperparameters, names of 256 characters, values of 2,500; 20 channels,
# named as its InputDataConfig names them (a name is also a folder, and SM_CHANNEL_<NAME> upper-cased).
MAX_HYPERPARAMETERS, MAX_HP_NAME, MAX_HP_VALUE = 100, 256, 2500
MAX_CHANNELS, MAX_CHANNEL_SOURCE = 20, 2048
_HP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_CHANNEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# A hyperparameter is a JSON scalar, kept as given: true stays a boolean, 3 an integer.
Hyperparameter = Annotated[bool, Strict()] | Annotated[int, Strict()] | Annotated[float, Strict()] | str


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
    hyperparameters: dict[str, Hyperparameter] = Field(default_factory=dict, description=(
        "SageMaker's hyperparameters: JSON scalars, passed to the program after `args` as `--name value`, "
        "sorted by name, as SageMaker passes them, and in SM_HPS and SM_HP_<NAME>."))
    channels: dict[str, str] = Field(default_factory=dict, description=(
        "SageMaker's channels: {name: source}. Each source's files (a gs:// object or prefix, an upload "
        "`dataset:<sha256>`, whose archive is unpacked, an allowed host path or an https:// file; a local "
        "path `trainjobs submit` uploads) are copied as they are to the channel's own folder before the "
        "program starts: SM_CHANNEL_<NAME>, listed in SM_CHANNELS; training/validation/test also as "
        "Vertex AI's AIP_TRAINING_DATA_URI, AIP_VALIDATION_DATA_URI and AIP_TEST_DATA_URI."))
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
    def _env(cls, v: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        _each(list(v), "env", MAX_ENV, "variables", lambda name: None)
        for name, value in v.items():
            if not _ENV_NAME.match(name):
                raise fail(name, f"{name!r} is not an environment variable name (letters, digits, '_')")
            if reserved(name):
                raise fail(name, reserved_reason(name))
            # A rule of issue 37 (program.keras says it, and installs the tf-keras it needs): a job
            # stored before it was accepted as it was.
            if name == LEGACY_KERAS_ENV and submitting(info):
                raise fail(name, f"{name} is set by trainjobs from program.keras: give `keras: 2` to run the "
                                 "program with tf_keras (the tf-keras of the machine's TensorFlow is installed)")
            if len(value) > MAX_ENV_VALUE:
                raise fail(name, f"a value of {len(value)} characters, over the limit of {MAX_ENV_VALUE}")
        return v

    @field_validator("hyperparameters")
    @classmethod
    def _hyperparameters(cls, v: dict[str, bool | int | float | str]) -> dict[str, bool | int | float | str]:
        _each(list(v), "hyperparameters", MAX_HYPERPARAMETERS, "hyperparameters", lambda name: None)
        for name, value in v.items():
            if len(name) > MAX_HP_NAME or not _HP_NAME.match(name):
                raise fail(name[:MAX_HP_NAME], f"{name[:60]!r} is not a hyperparameter name: a letter or '_', "
                           f"then letters, digits, '_', '.' or '-', at most {MAX_HP_NAME} characters (passed as --name)")
            if len(str(value)) > MAX_HP_VALUE:
                raise fail(name, f"a value of {len(str(value))} characters, over the limit of {MAX_HP_VALUE}")
            if isinstance(value, float) and not math.isfinite(value):
                raise fail(name, f"{value} is not a number a program can be passed")
        return v

    @field_validator("channels")
    @classmethod
    def _channels(cls, v: dict[str, str]) -> dict[str, str]:
        _each(list(v), "channels", MAX_CHANNELS, "channels", lambda name: None)
        seen: dict[str, str] = {}
        for name, source in v.items():
            if not _CHANNEL_NAME.match(name):
                raise fail(name[:64], f"{name[:70]!r} is not a channel name: a letter or digit, then letters, digits, "
                                      "'_', '.' or '-', at most 64 characters (SageMaker's rule; it names a folder)")
            if (other := seen.setdefault(name.upper(), name)) != name:
                raise fail(name, f"channels {other!r} and {name!r} would both be SM_CHANNEL_{name.upper()}")
            if problem := channel_source_problem(source):
                raise fail(name, problem)
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


def channel_source_problem(source: str) -> str | None:
    """Why a channel's source is refused whatever the deployment allows, or None (where it may point is
    service/db/admission.py's to check, and staging's again)."""
    if not source.strip() or len(source) > MAX_CHANNEL_SOURCE:
        return (f"a channel's source is a gs:// URI, an upload, a host path or an https:// URL of at most "
                f"{MAX_CHANNEL_SOURCE} characters")
    if source.startswith("dataset:") and not SOURCE_SHAPE.fullmatch(source):
        return f"{source[:80]} is not an upload: dataset:<sha256> (64 lower-case hex digits, as POST /v1/datasets answers)"
    if source.startswith("sklearn:"):
        return (f"{source[:80]} is bundled data, not files: give it as dataset.source (staged into "
                "TRAINJOBS_DATA_DIR), or save its arrays to a file and give that")
    return None


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
