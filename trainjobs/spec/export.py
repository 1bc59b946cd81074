"""spec.export: the SavedModel always, a TFLite model when asked (and its quantization)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trainjobs.spec.strict import Int, StrictModel, fail


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


class ExportSpec(StrictModel):
    saved_model: Literal[True] = Field(default=True, description="A SavedModel is always exported.")
    tflite: TfliteExport | None = None
