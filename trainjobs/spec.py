"""The job spec: what a user asks for, validated before anything is stored or paid for.

Imports only Pydantic and the accelerator catalogue, so the API, the worker and the agent on the accelerator VM share it.
Every contradiction we can see at submit time is rejected here with the field that is wrong
(`loc`) and the reason, so a job never fails later for a reason we could have checked.

A spec is parsed in two ways. At submit (the API, the CLI's dry run) every rule applies and the spec is
stamped with `SPEC_VERSION`, the rules it was accepted under. A stored spec (the worker's driver, the agent's
spec.json) was accepted by some release already: `parse_stored` reads it without the submit-only rules,
so a rule tightened in a later release refuses new jobs but never fails a job already queued or running
(issue 19). A new rule that refuses what an older release accepted is written as submit-only
(`_submitting(info)`).
"""

from __future__ import annotations

import json
import math
import re
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from trainjobs.catalogue import GPU_TYPES, TPU_GENERATIONS
from trainjobs.model_params import BUILTIN_PARAMS, did_you_mean, params_problem
from trainjobs.tpu_runtimes import default_tpu_runtime, tpu_runtime_problem

# Strict numbers: JSON true is not the integer 1, and "3" is not the number 3.
Int = Annotated[int, Strict()]
Number = Annotated[float, Strict()]
# model.params is stored with the job and returned by every GET: keep it small and shallow.
MAX_PARAMS_BYTES = 64 << 10
MAX_NESTING = 32
# The spec rules a stored job was accepted under. 1: every job stored before versions were written;
# 2: built-in models' params checked at submit.
SPEC_VERSION = 2
# Validation context of a spec read back from storage: see the module's docstring.
STORED: dict[str, bool] = {"stored": True}


def _submitting(info: ValidationInfo) -> bool:
    """True when the spec is being submitted, False when it is read back from storage (parse_stored)."""
    return not (isinstance(info.context, dict) and info.context.get("stored"))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _drop_retired_fields(cls, data: Any, info: ValidationInfo) -> Any:
        """A stored spec may carry a field a later release removed: it was valid when stored, so it is
        dropped, not refused. At submit an unknown field stays an error (with a "did you mean")."""
        if not _submitting(info) and isinstance(data, dict):
            return {k: v for k, v in data.items() if k in cls.model_fields}
        return data

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        """Refuse what PostgreSQL's JSONB cannot hold, anywhere in the spec (model.params included):
        it rejects NUL, a lone surrogate cannot be encoded as UTF-8, and JSON has no NaN or Infinity.
        The outermost model sees the whole input first, so the path it names is the full one."""
        if problem := _unstorable(data):
            raise _fail(*problem)
        return data


def _fail(field: str, msg: str) -> PydanticCustomError:
    """A validation error that remembers which field is wrong, even when raised by a model validator."""
    return PydanticCustomError("invalid_spec", msg, {"field": field})


_UNSTORABLE_CHAR = re.compile(r"[\x00\ud800-\udfff]")


def _unstorable(data: Any) -> tuple[str, str] | None:
    """(dotted path, reason) of the first value in `data` that cannot be stored, else None.
    Iterative, so a deeply nested params dict cannot exhaust the interpreter's stack."""
    stack: list[tuple[tuple[str, ...], Any]] = [((), data)]
    while stack:
        path, value = stack.pop()
        where = ".".join(path)
        if len(path) > MAX_NESTING:
            return where, f"nested deeper than {MAX_NESTING} levels"
        if isinstance(value, str) and (m := _UNSTORABLE_CHAR.search(value)):
            return where, ("contains a NUL character (\\u0000)" if m.group() == "\x00"
                           else "contains an unpaired surrogate, which is not valid Unicode")
        if isinstance(value, float) and not math.isfinite(value):
            return where, "NaN and Infinity are not JSON numbers"
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str) and _UNSTORABLE_CHAR.search(key):
                    return where, "a key contains a NUL character or an unpaired surrogate"
                stack.append(((*path, str(key)), item))
        elif isinstance(value, list | tuple):
            stack.extend(((*path, str(i)), item) for i, item in enumerate(value))
    return None


def describe_errors(errors: list[dict[str, Any]], strip: tuple[str, ...] = ()) -> list[dict[str, str]]:
    """Pydantic errors -> [{field: 'accelerator.tpu_type', reason: ...}] for humans and the API."""
    out = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if str(p) not in strip]
        # A discriminated union adds its tag to the path (accelerator.tpu.tpu_type); users never wrote it.
        loc = [p for i, p in enumerate(loc) if not (i and loc[i - 1] == "accelerator" and p in ("tpu", "gpu", "cpu"))]
        field = (err.get("ctx") or {}).get("field")
        if field and (not loc or loc[-1] != field):
            loc.append(field)
        reason = err.get("msg", "invalid")
        if err.get("type") == "extra_forbidden" and (hint := closest_field([str(p) for p in err.get("loc", ())])):
            reason += f"; did you mean {hint!r}?"
        out.append({"field": ".".join(loc) or "body", "reason": reason})
    return out


def closest_field(loc: list[str]) -> str | None:
    """The valid field name nearest to the unknown one at the end of `loc` (a JobSpec path as Pydantic
    gives it, tags of unions included), for a typo like `trainig` or `tpu_typ`; None if nothing is close."""
    import typing

    def models(annotation: Any) -> list[type[BaseModel]]:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return [annotation]
        return [m for arg in typing.get_args(annotation) for m in models(arg)]

    candidates: list[type[BaseModel]] = [JobSpec]
    for part in loc[:-1]:
        inner = [m for c in candidates if part in c.model_fields for m in models(c.model_fields[part].annotation)]
        candidates = inner or candidates  # a union's tag (accelerator.tpu) names no field: stay
    names = sorted({n for c in candidates for n in c.model_fields})
    return did_you_mean(loc[-1], names) if loc else None


# --- accelerators -------------------------------------------------------------------------------

# Patterns are matched with fullmatch: `$` also matches before a trailing newline.
_TPU_TYPE = re.compile(rf"({'|'.join(TPU_GENERATIONS)})-(\d{{1,4}})")


class TpuAccelerator(_Strict):
    type: Literal["tpu"]
    tpu_type: str = Field(description="Cloud TPU accelerator type, e.g. v4-8, v5litepod-8, v6e-16.")
    runtime_version: str = Field(
        default="tpu-vm-tf-2.18.0-pjrt", min_length=1, max_length=100,
        description="TPU VM software version (image): a TensorFlow PJRT image, tpu-vm-tf-X.Y.Z-pjrt for one "
                    "host or tpu-vm-tf-X.Y.Z-pod-pjrt for a slice of several (TensorFlow 2.16 or newer). "
                    "Default: the tested 2.18.0 image of the slice's kind.",
    )
    topology: str | None = Field(default=None, pattern=r"^\d{1,3}x\d{1,3}(x\d{1,3})?$")
    spot: bool = False

    @model_validator(mode="before")
    @classmethod
    def _default_runtime(cls, data: Any) -> Any:
        """No runtime_version: the default image of the slice's kind (a multi-host slice needs a pod image)."""
        if isinstance(data, dict) and data.get("runtime_version") is None and isinstance(data.get("tpu_type"), str):
            if (m := _TPU_TYPE.fullmatch(data["tpu_type"])) is not None:
                data = {**data, "runtime_version": default_tpu_runtime(_tpu_hosts(m.group(1), int(m.group(2))))}
        return data

    @model_validator(mode="after")
    def _usable_runtime(self) -> TpuAccelerator:
        # The agent trains with the image's own TensorFlow: refuse at submit what it cannot run on.
        if (problem := tpu_runtime_problem(self.runtime_version, self.hosts)) is not None:
            raise _fail("runtime_version", problem)
        return self

    @field_validator("tpu_type")
    @classmethod
    def _known_type(cls, v: str) -> str:
        m = _TPU_TYPE.fullmatch(v)
        if not m:
            raise _fail("tpu_type", f"unknown TPU type {v!r}: expected e.g. v4-8, v5litepod-8, v6e-8")
        gen, n = m.group(1), int(m.group(2))
        units = TPU_GENERATIONS[gen].units_per_replica
        if n < units or n % units or n & (n - 1):
            raise _fail("tpu_type", f"{v!r} is not a TPU size Google sells (sizes are powers of two)")
        return v

    @property
    def replicas(self) -> int:
        gen, n = self.tpu_type.rsplit("-", 1)
        return int(n) // TPU_GENERATIONS[gen].units_per_replica

    @property
    def hosts(self) -> int:
        gen, n = self.tpu_type.rsplit("-", 1)
        return _tpu_hosts(gen, int(n))


def _tpu_hosts(generation: str, units: int) -> int:
    g = TPU_GENERATIONS[generation]
    return max(1, units // g.units_per_replica // g.replicas_per_host)


class GpuAccelerator(_Strict):
    type: Literal["gpu"]
    gpu_type: str
    count: Int = Field(default=1, ge=1, le=16)
    machine_type: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9]*(-[a-z0-9]+)+$")
    spot: bool = False

    @field_validator("gpu_type")
    @classmethod
    def _known_gpu(cls, v: str) -> str:
        if v not in GPU_TYPES:
            raise _fail("gpu_type", f"unknown GPU type {v!r}; known: {', '.join(sorted(GPU_TYPES))}")
        return v

    @model_validator(mode="after")
    def _count_allowed(self) -> GpuAccelerator:
        allowed = GPU_TYPES[self.gpu_type].counts
        if self.count not in allowed:
            raise _fail("count", f"{self.gpu_type} attaches in counts of {list(allowed)}, not {self.count}")
        return self

    @property
    def compute_capability(self) -> float:
        return GPU_TYPES[self.gpu_type].compute_capability

    @property
    def replicas(self) -> int:
        return self.count


class CpuAccelerator(_Strict):
    type: Literal["cpu"]
    replicas: Int = Field(default=1, ge=1, le=64, description="CPU devices to train over (logical devices locally).")


Accelerator = Annotated[TpuAccelerator | GpuAccelerator | CpuAccelerator, Field(discriminator="type")]

# --- data, model, training, export ----------------------------------------------------------------

DatasetFormat = Literal["auto", "npz", "csv", "tfrecord", "image_folder"]
_SOURCE = re.compile(r"gs://[a-z0-9][a-z0-9._-]{1,220}/.+|https://\S+|http://\S+|file://\S+|dataset:[0-9a-f]{64}|sklearn:(digits|iris|wine|breast_cancer)|[^:\n]+")


_KEY = Annotated[str, Field(min_length=1, max_length=256)]
_SIDE = Annotated[Int, Field(ge=1, le=4096)]
# Which format reads each option; an option set for another format is refused, never ignored.
OPTION_FORMATS: dict[str, tuple[str, ...]] = {
    "header": ("csv",), "skip_rows": ("csv",), "label_column": ("csv",), "delimiter": ("csv",),
    "na_values": ("csv",), "na_policy": ("csv",), "na_fill": ("csv",),
    "x_key": ("npz", "tfrecord"), "y_key": ("npz", "tfrecord"),
    "features": ("tfrecord",), "image_shape": ("tfrecord",), "compression": ("tfrecord",),
    "image_size": ("image_folder",),
}


class DatasetOptions(_Strict):
    validation_split: Number = Field(default=0.2, ge=0.0, le=0.5)
    # --- csv ---
    header: Int | Literal["none"] | None = Field(
        default=None, description="csv: the header row, counted from 0 after skip_rows (default 0), or 'none' "
        "when every row is data (columns are then named by position).")
    skip_rows: Int = Field(default=0, ge=0, le=1_000_000, description="csv: lines skipped before the header or data")
    label_column: str | Int | None = Field(
        default=None, description="csv: the label column, by header name, or by position from 0 (negative counts "
        "from the end: -1 is the last). Default 'label' with a header, the last column without.")
    delimiter: str | None = Field(default=None, min_length=1, max_length=1, description="csv: the field separator (default ',')")
    na_values: list[Annotated[str, Field(max_length=64)]] | None = Field(
        default=None, max_length=64, description="csv: cell texts that mean 'missing' (default: the empty cell)")
    na_policy: Literal["error", "drop", "fill"] = Field(
        default="error", description="csv: a missing cell fails the job naming its line and column (error), leaves "
        "its row out (drop, counted in the job's runtime), or, for features, becomes na_fill (fill)")
    na_fill: Number | None = Field(default=None, description="csv: the feature value of a missing cell under na_policy fill (default 0)")
    # --- npz and tfrecord ---
    x_key: _KEY | None = Field(default=None, description="npz: the features array (default 'x'); tfrecord: the "
                               "feature holding the example (a float or int64 list, or encoded image bytes)")
    y_key: _KEY | None = Field(default=None, description="npz: the labels array (default 'y'); tfrecord: the label "
                               "feature (int64 class ids or byte-string class names)")
    features: list[_KEY] | None = Field(default=None, min_length=1, max_length=4096, description="tfrecord: several "
                                        "float or int64 features concatenated, in this order, into the example (instead of x_key)")
    image_shape: tuple[_SIDE, _SIDE, Annotated[Int, Field(ge=1, le=4)]] | None = Field(
        default=None, description="tfrecord: [height, width, channels]; flat lists are reshaped to it, encoded images "
        "resized to it (default: the decoded size)")
    compression: Literal["auto", "none", "gzip", "zlib"] = Field(
        default="auto", description="tfrecord: auto detects GZIP and ZLIB files")
    # --- image_folder ---
    image_size: tuple[Annotated[Int, Field(ge=8, le=1024)], Annotated[Int, Field(ge=8, le=1024)]] | None = None
    shard_examples: Int = Field(default=4096, ge=64, le=1_000_000, description="examples per staged TFRecord shard")

    # Checked before the unions are tried, so a bad value gets one reason, not one per union member.
    @field_validator("header", mode="before")
    @classmethod
    def _header_row(cls, v: Any) -> Any:
        if v is None or v == "none" or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 1000):
            return v
        raise _fail("header", "header is the header's row number, 0 to 1000 (after skip_rows), or 'none'")

    @field_validator("label_column", mode="before")
    @classmethod
    def _label_column(cls, v: Any) -> Any:
        if v is None or (isinstance(v, str) and 1 <= len(v) <= 256):
            return v
        if isinstance(v, int) and not isinstance(v, bool) and -10_000 <= v <= 10_000:
            return v
        raise _fail("label_column", "label_column is a column's name (1 to 256 characters) or its position "
                    "(an integer from 0; negative counts from the end)")

    @field_validator("delimiter")
    @classmethod
    def _usable_delimiter(cls, v: str | None) -> str | None:
        if v is not None and v in ('"', "\r", "\n"):
            raise _fail("delimiter", "the delimiter cannot be a quote or a line break")
        return v

    @model_validator(mode="after")
    def _consistent_options(self) -> DatasetOptions:
        if self.x_key is not None and self.features is not None:
            raise _fail("features", "give x_key (one feature) or features (several), not both")
        if self.na_fill is not None and self.na_policy != "fill":
            raise _fail("na_fill", f"na_fill is the value of a missing cell under na_policy fill, not {self.na_policy}")
        if isinstance(self.label_column, str) and self.header == "none":
            raise _fail("label_column", "a CSV without a header has no column names: give label_column as a position")
        return self

    def set_options(self) -> list[str]:
        """The format-specific options this spec sets to other than their defaults. By value, not by
        model_fields_set: a stored spec is dumped with every default written out."""
        fields = type(self).model_fields
        return [k for k in OPTION_FORMATS if getattr(self, k) != fields[k].default]

    def formats_allowed(self) -> set[str]:
        """The formats that read every option set here."""
        allowed = {"npz", "csv", "tfrecord", "image_folder"}
        for key in self.set_options():
            allowed &= set(OPTION_FORMATS[key])
        return allowed


def options_problem(options: DatasetOptions, fmt: str) -> tuple[str, str] | None:
    """(option, reason) for the first option set that format `fmt` does not read, else None. Shared by
    submit (format given or guessed from the source) and staging (the format it detected)."""
    for key in options.set_options():
        if fmt not in OPTION_FORMATS[key]:
            return key, f"{key} applies to {' and '.join(OPTION_FORMATS[key])} data, not {fmt}"
    return None


_FORMAT_BY_SUFFIX = {".csv": "csv", ".npz": "npz", ".tfrecord": "tfrecord", ".tfrecords": "tfrecord", ".tfr": "tfrecord"}


def guess_format(source: str) -> str | None:
    """The format a source's name gives away (what staging's `auto` will detect), or None."""
    if source.startswith("sklearn:"):
        return "sklearn"
    name = source.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1].lower()
    for suffix, fmt in _FORMAT_BY_SUFFIX.items():
        if name.endswith(suffix):
            return fmt
    if ".tfrecord" in name:  # TFDS-style train.tfrecord-00000-of-00008
        return "tfrecord"
    return None


class DatasetSpec(_Strict):
    source: str = Field(
        min_length=1, max_length=2048,
        description="dataset:<sha256> (uploaded through POST /v1/datasets), https:// (public hosts), "
        "gs://BUCKET/PATH (in trainjobs' own bucket only the project's uploads and jobs), sklearn:digits "
        "(bundled data), or a worker host path / file:// inside a directory the operator allows.",
    )
    format: DatasetFormat = "auto"
    options: DatasetOptions = DatasetOptions()

    @field_validator("source")
    @classmethod
    def _source_shape(cls, v: str) -> str:
        if not _SOURCE.fullmatch(v):
            raise _fail("source", f"unsupported dataset source {v!r}")
        return v

    @model_validator(mode="after")
    def _options_match_format(self) -> DatasetSpec:
        o = self.options
        if not o.formats_allowed():
            formats = {k: OPTION_FORMATS[k] for k in o.set_options()}
            raise _fail("options", "these options belong to different formats and no format reads them all: "
                        + "; ".join(f"{k}: {'/'.join(v)}" for k, v in formats.items()))
        fmt = self.format if self.format != "auto" else guess_format(self.source)
        if fmt == "sklearn":
            if o.set_options():
                raise _fail("options", f"{o.set_options()[0]} does not apply to sklearn: bundled data, which has no such option")
        elif fmt is not None and (problem := options_problem(o, fmt)):
            raise _fail(f"options.{problem[0]}", problem[1] + ("" if self.format != "auto" else " (the format of the source's name)"))
        return self


BUILTIN_MODELS = tuple(BUILTIN_PARAMS)
# keras.applications architectures in the pinned Keras (3.15); tests/test_user_models.py checks this
# list against Keras itself, so a Keras upgrade that drops one fails CI rather than a user's job.
KERAS_APPLICATIONS = (
    "ConvNeXtBase", "ConvNeXtLarge", "ConvNeXtSmall", "ConvNeXtTiny", "ConvNeXtXLarge", "DenseNet121", "DenseNet169",
    "DenseNet201", "EfficientNetB0", "EfficientNetB1", "EfficientNetB2", "EfficientNetB3", "EfficientNetB4",
    "EfficientNetB5", "EfficientNetB6", "EfficientNetB7", "EfficientNetV2B0", "EfficientNetV2B1", "EfficientNetV2B2",
    "EfficientNetV2B3", "EfficientNetV2L", "EfficientNetV2M", "EfficientNetV2S", "InceptionResNetV2", "InceptionV3",
    "MobileNet", "MobileNetV2", "MobileNetV3Large", "MobileNetV3Small", "NASNetLarge", "NASNetMobile", "ResNet101",
    "ResNet101V2", "ResNet152", "ResNet152V2", "ResNet50", "ResNet50V2", "VGG16", "VGG19", "Xception",
)


class ModelSpec(_Strict):
    name: str | None = Field(
        default=None, description="mlp, cnn, resnet, or a keras.applications architecture (random init)."
    )
    module: str | None = Field(
        default=None, min_length=1, max_length=2048, description="Your model: a gs:// URI to a .py file or a zipped package (POST /v1/modules returns one), or a path on the machine inside a directory the operator allows."
    )
    function: str = Field(default="build_model", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    params: dict[str, Any] = Field(default_factory=dict, description=f"keyword arguments for your model function, or "
                                   f"the built-in or keras.applications model's settings; at most {MAX_PARAMS_BYTES >> 10} KiB as JSON")

    @field_validator("params")
    @classmethod
    def _params_small(cls, v: dict[str, Any]) -> dict[str, Any]:
        size = len(json.dumps(v, ensure_ascii=False).encode())
        if size > MAX_PARAMS_BYTES:
            raise _fail("params", f"params are {size} bytes as JSON, over the {MAX_PARAMS_BYTES >> 10} KiB limit: "
                                  "pass data as a dataset or inside your module, not as params")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.name is None) == (self.module is None):
            raise _fail("module", "give exactly one of model.name (built-in) or model.module (your code)")
        if self.name is not None and self.name not in BUILTIN_MODELS + KERAS_APPLICATIONS:
            raise _fail("name", f"unknown model {self.name!r}: use {', '.join(BUILTIN_MODELS)} or a keras.applications "
                                "architecture such as MobileNetV2 or ResNet50")
        return self

    @model_validator(mode="after")
    def _known_params(self, info: ValidationInfo) -> ModelSpec:
        # Submit-only: releases before SPEC_VERSION 2 stored any params for a named model.
        if self.name is not None and _submitting(info) and (problem := params_problem(self.name, self.params)):
            raise _fail(f"params.{problem[0]}", problem[1])
        return self


class TrainingSpec(_Strict):
    epochs: Int = Field(default=10, ge=1, le=10_000)
    per_replica_batch_size: Int | None = Field(default=None, ge=1, le=65_536)
    global_batch_size: Int | None = Field(default=None, ge=1, le=1_048_576)
    optimizer: Literal["adam", "adamw", "sgd", "rmsprop"] = "adam"
    learning_rate: Number = Field(default=1e-3, gt=0.0, le=10.0)
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"
    lr_base_batch_size: Int = Field(default=256, ge=1, le=1_048_576, description="batch the learning rate was tuned for")
    warmup_epochs: Number = Field(default=0.0, ge=0.0, le=1000.0)
    seed: Int = Field(default=0, ge=0, le=2**31 - 1)
    checkpoint_every_epochs: Int = Field(default=1, ge=1, le=10_000)
    checkpoint_every_steps: Int | None = Field(
        default=None, ge=1, le=100_000_000,
        description="Also checkpoint every this many optimizer steps, counted over the whole job, so a restarted "
        "job resumes mid-epoch. A save happens between calls of the train function: with steps_per_execution > 1, "
        "at the end of the first call that reaches each multiple. Combines with checkpoint_every_epochs.",
    )
    cache_dataset: bool = False

    @model_validator(mode="after")
    def _one_batch(self) -> TrainingSpec:
        if self.per_replica_batch_size is not None and self.global_batch_size is not None:
            raise _fail("global_batch_size", "give per_replica_batch_size or global_batch_size, not both")
        if self.warmup_epochs > self.epochs:
            raise _fail("warmup_epochs", f"warmup of {self.warmup_epochs} epochs is longer than training ({self.epochs})")
        return self


DEFAULT_CALIBRATION_EXAMPLES = 200


class TfliteExport(_Strict):
    quantization: Literal["none", "dynamic", "float16", "int8"] = "none"
    calibration_examples: Int | None = Field(
        default=None, ge=0, le=100_000, description=f"int8: representative training examples; default: up to "
        f"{DEFAULT_CALIBRATION_EXAMPLES}, as many as the training split has. A number asked for must be there.")
    io_type: Literal["float32", "int8", "uint8"] = Field(
        default="float32", description="int8: the model's input and output type. float32 (default) keeps the float "
        "interface (the model quantizes inside); int8 or uint8 is fully integer, as edge accelerators need, and the "
        "caller quantizes inputs with the input tensor's scale and zero point")

    @model_validator(mode="after")
    def _int8_needs_data(self) -> TfliteExport:
        if self.quantization == "int8" and self.calibration_examples == 0:
            raise _fail("calibration_examples", "int8 quantization needs calibration data: calibration_examples must be > 0")
        if self.io_type != "float32" and self.quantization != "int8":
            raise _fail("io_type", f"an {self.io_type} input and output needs quantization int8, not {self.quantization}")
        return self

    @property
    def calibration_limit(self) -> int:
        """At most this many training examples calibrate int8."""
        return DEFAULT_CALIBRATION_EXAMPLES if self.calibration_examples is None else self.calibration_examples


class ExportSpec(_Strict):
    saved_model: Literal[True] = Field(default=True, description="A SavedModel is always exported.")
    tflite: TfliteExport | None = None


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d)")
MAX_RUNTIME = timedelta(days=14)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class LimitsSpec(_Strict):
    max_runtime: timedelta = Field(default=timedelta(hours=24), description="'90m', '2h', seconds, or ISO 8601")
    max_retries: Int = Field(default=2, ge=0, le=20)
    max_cost_usd: Number | None = Field(default=None, gt=0, le=1_000_000)

    @field_validator("max_runtime", mode="before")
    @classmethod
    def _parse_duration(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise _fail("max_runtime", "max_runtime is a duration ('90m', '2h', seconds), not true/false")
        if isinstance(v, str) and (m := _DURATION.fullmatch(v.strip())):
            seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
            # Checked before timedelta() sees it: a huge number of hours overflows it (an OverflowError, a 500).
            if not 0 < seconds <= MAX_RUNTIME.total_seconds():
                raise _fail("max_runtime", "max_runtime must be between 1 second and 14 days")
            return timedelta(seconds=seconds)
        return v

    @field_validator("max_runtime")
    @classmethod
    def _sane_runtime(cls, v: timedelta) -> timedelta:
        if v <= timedelta(0) or v > MAX_RUNTIME:
            raise _fail("max_runtime", "max_runtime must be between 1 second and 14 days")
        return v


# GCP label rules (https://cloud.google.com/compute/docs/labeling-resources): at most 64 labels;
# keys 1-63 chars starting with a lowercase letter; keys and values use lowercase letters, digits,
# '_' and '-'; values may be empty. We copy labels onto VMs, so we refuse what GCP would refuse.
_LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")
RESERVED_LABEL_PREFIX = "trainjobs-"


def label_problem(key: str, value: str) -> str | None:
    """Why GCP would refuse this label, or None. Also checks the label filters of GET /v1/jobs."""
    if not _LABEL_KEY.fullmatch(key):
        return f"label key {key!r} is not a GCP label key: lowercase letters, digits, '_' or '-', starting with a letter, at most 63"
    if not _LABEL_VALUE.fullmatch(value):
        return f"label value {value!r} for {key!r} is not a GCP label value: lowercase letters, digits, '_' or '-', at most 63"
    return None

Strategy = Literal["auto", "default", "one_device", "mirrored", "multi_worker_mirrored", "tpu"]
Precision = Literal["auto", "float32", "mixed_float16", "mixed_bfloat16"]


class JobSpec(_Strict):
    name: str = Field(default="job", pattern=r"^[A-Za-z0-9][A-Za-z0-9._ -]{0,127}$")
    accelerator: Accelerator = CpuAccelerator(type="cpu")
    workers: Int = Field(default=1, ge=1, le=64, description="hosts training together")
    strategy: Strategy = "auto"
    precision: Precision = "auto"
    steps_per_execution: Int | Literal["auto"] = "auto"
    dataset: DatasetSpec
    model: ModelSpec
    training: TrainingSpec = TrainingSpec()
    export: ExportSpec = ExportSpec()
    limits: LimitsSpec = LimitsSpec()
    labels: dict[str, str] = Field(default_factory=dict)
    spec_version: Int = Field(default=SPEC_VERSION, ge=1, le=SPEC_VERSION,
                              description="The spec rules the job was accepted under; the API writes it at submit.")

    @model_validator(mode="before")
    @classmethod
    def _stamp_version(cls, data: Any, info: ValidationInfo) -> Any:
        """A submitted spec is checked by today's rules, so it says so, whatever version it was copied from."""
        if _submitting(info) and isinstance(data, dict) and "spec_version" in data:
            return {**data, "spec_version": SPEC_VERSION}
        return data

    @field_validator("steps_per_execution", mode="before")
    @classmethod
    def _spe_not_bool(cls, v: Any) -> Any:
        # Python counts True as the integer 1, and the int | 'auto' union would take it as one.
        if isinstance(v, bool):
            raise _fail("steps_per_execution", "steps_per_execution is an integer or 'auto', not true/false")
        return v

    @field_validator("steps_per_execution")
    @classmethod
    def _spe_range(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 10_000:
            raise _fail("steps_per_execution", "steps_per_execution must be between 1 and 10000, or 'auto'")
        return v

    @field_validator("labels")
    @classmethod
    def _gcp_labels(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > 32:
            raise _fail("labels", "at most 32 labels (GCP allows 64; trainjobs adds its own)")
        for key, value in v.items():
            if problem := label_problem(key, value):
                raise _fail("labels", problem)
            if key.startswith(RESERVED_LABEL_PREFIX):
                raise _fail("labels", f"label key {key!r}: the prefix {RESERVED_LABEL_PREFIX!r} is reserved")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        check_consistency(self)
        return self

    # --- derived facts shared by the validator, the worker and the agent ---

    @property
    def replicas_per_worker(self) -> int:
        if self.resolved_strategy in ("one_device", "default"):
            return 1
        return self.accelerator.replicas

    @property
    def num_replicas(self) -> int:
        return self.replicas_per_worker * self.workers

    @property
    def resolved_strategy(self) -> str:
        return resolve_strategy(self)

    @property
    def global_batch_size(self) -> int:
        t = self.training
        if t.global_batch_size is not None:
            return t.global_batch_size
        return (t.per_replica_batch_size or 32) * self.num_replicas

    def scaled_learning_rate(self, global_batch: int | None = None) -> float:
        """training.learning_rate scaled (lr_scaling) from lr_base_batch_size to global_batch (default:
        the batch this spec implies; the agent passes the batch its machine really runs)."""
        t = self.training
        ratio = (global_batch or self.global_batch_size) / t.lr_base_batch_size
        factor: float = {"none": 1.0, "linear": ratio, "sqrt": ratio**0.5}[t.lr_scaling]
        return t.learning_rate * factor


def resolve_strategy(spec: JobSpec) -> str:
    """`auto` as the issue defines it: TPU -> tpu, several workers -> multi-worker, several devices -> mirrored,
    one GPU -> one_device, else the default strategy."""
    if spec.strategy != "auto":
        return spec.strategy
    acc = spec.accelerator
    if isinstance(acc, TpuAccelerator):
        return "tpu"
    if spec.workers > 1:
        return "multi_worker_mirrored"
    if acc.replicas > 1:
        return "mirrored"
    if isinstance(acc, GpuAccelerator):
        return "one_device"
    return "default"


def check_consistency(spec: JobSpec) -> None:
    acc, strategy = spec.accelerator, spec.strategy
    is_tpu = isinstance(acc, TpuAccelerator)
    if strategy == "tpu" and not is_tpu:
        raise _fail("strategy", f"strategy 'tpu' needs a TPU accelerator, got {acc.type}")
    if is_tpu and strategy not in ("auto", "tpu"):
        raise _fail("strategy", f"a TPU trains under strategy 'tpu' (or 'auto'), not {strategy!r}")
    if is_tpu and spec.precision == "mixed_float16":
        raise _fail("precision", "TPUs compute in bfloat16: use mixed_bfloat16 (or auto), not mixed_float16")
    if is_tpu and spec.workers != 1:
        raise _fail("workers", "a TPU slice brings its own hosts: choose a bigger tpu_type instead of workers > 1")
    if strategy == "multi_worker_mirrored" and spec.workers < 2:
        raise _fail("workers", "multi_worker_mirrored needs workers >= 2; use mirrored for one machine")
    if spec.workers > 1 and strategy not in ("auto", "multi_worker_mirrored"):
        raise _fail("strategy", f"{spec.workers} workers train together only under multi_worker_mirrored, not {strategy!r}")
    if strategy in ("one_device", "default") and acc.replicas > 1:
        raise _fail("strategy", f"{strategy!r} uses one device but the accelerator has {acc.replicas}; use mirrored or fewer devices")
    if isinstance(acc, GpuAccelerator) and spec.precision == "mixed_float16" and acc.compute_capability < 6.0:
        raise _fail("precision", f"{acc.gpu_type} has no fast float16")
    if spec.precision == "mixed_bfloat16" and isinstance(acc, GpuAccelerator) and acc.compute_capability < 8.0:
        raise _fail("precision", f"{acc.gpu_type} (compute capability {acc.compute_capability}) has no bfloat16 support; use mixed_float16")
    t = spec.training
    if t.global_batch_size is not None and t.global_batch_size % spec.num_replicas:
        raise _fail("training.global_batch_size", f"global batch {t.global_batch_size} does not divide evenly over {spec.num_replicas} replicas")
    if spec.global_batch_size > 1_048_576:
        raise _fail("training.per_replica_batch_size", f"global batch {spec.global_batch_size} is absurd (max 1048576)")


def parse_stored(raw: dict[str, Any]) -> JobSpec:
    """A spec as stored by any release: without today's submit-only rules, and a spec stored before versions
    were written is version 1."""
    return JobSpec.model_validate({"spec_version": 1, **raw}, context=STORED)
