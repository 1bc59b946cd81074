"""spec.export: the SavedModel always, a TFLite model when asked (and its quantization), and the smaller
variants `variants` names (issue 23), each written beside them and compared in optimization.json."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from trainjobs.spec.strict import Int, StrictModel, fail

if TYPE_CHECKING:
    from trainjobs.spec.job import JobSpec

DEFAULT_CALIBRATION_EXAMPLES = 200


class TfliteExport(StrictModel):
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
            raise fail("calibration_examples", "int8 quantization needs calibration data: calibration_examples must be > 0")
        if self.io_type != "float32" and self.quantization != "int8":
            raise fail("io_type", f"an {self.io_type} input and output needs quantization int8, not {self.quantization}")
        return self

    @property
    def calibration_limit(self) -> int:
        """At most this many training examples calibrate int8."""
        return DEFAULT_CALIBRATION_EXAMPLES if self.calibration_examples is None else self.calibration_examples


Variant = Literal["saved_model_int8", "tflite_float32", "tflite_dynamic", "tflite_float16", "tflite_int8"]
# Each TFLite variant is the model.tflite that export.tflite's quantization of that name makes (float32 input
# and output, int8 calibrated on up to DEFAULT_CALIBRATION_EXAMPLES training examples).
TFLITE_VARIANTS: dict[str, str] = {"tflite_float32": "none", "tflite_dynamic": "dynamic",
                                   "tflite_float16": "float16", "tflite_int8": "int8"}
# Where each variant is written in the job's artifacts/ (agent/variants.py).
VARIANTS_DIR = "variants"


class ExportSpec(StrictModel):
    saved_model: Literal[True] = Field(default=True, description="A SavedModel is always exported.")
    tflite: TfliteExport | None = None
    variants: list[Variant] = Field(default_factory=list, max_length=5, description=(
        "Smaller models besides saved_model/ (and model.tflite), each in artifacts/variants/ and compared with "
        "them in optimization.json: saved_model_int8 (Keras int8 quantization of the Dense, EinsumDense and "
        "Embedding layers, served like saved_model/), tflite_float32, tflite_dynamic, tflite_float16, tflite_int8"))

    @model_validator(mode="after")
    def _variants_once(self) -> ExportSpec:
        for i, name in enumerate(self.variants):
            if name in self.variants[:i]:
                raise fail(f"variants.{i}", f"{name} is named twice")
            if self.tflite is not None and TFLITE_VARIANTS.get(name) == self.tflite.quantization:
                raise fail(f"variants.{i}", f"{name} is model.tflite already (export.tflite.quantization "
                           f"{self.tflite.quantization}): ask for it once, or give export.tflite another quantization")
        return self

    def variant_tflite(self, name: str) -> TfliteExport:
        """The conversion a tflite_ variant is."""
        return TfliteExport(quantization=TFLITE_VARIANTS[name])  # type: ignore[arg-type]

    @property
    def int8_calibration(self) -> TfliteExport | None:
        """The int8 TFLite conversion the job calibrates, if any (export.tflite's, else tflite_int8's): what
        staging checks the training split against."""
        if self.tflite is not None and self.tflite.quantization == "int8":
            return self.tflite
        return self.variant_tflite("tflite_int8") if "tflite_int8" in self.variants else None


def variants_problem(spec: JobSpec) -> tuple[str, str] | None:
    """(field, reason) for variants the rest of the spec rules out. Every built-in model and keras.applications
    architecture ends in a Dense layer (the task's output), so saved_model_int8 always has something to
    quantize there; a model of the user's own is checked when the agent builds it, before training."""
    if spec.export.variants and spec.program is not None:
        return "export.variants", "a program exports its own model: export.variants is the managed trainer's"
    return None
