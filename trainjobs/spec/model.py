"""spec.model: a built-in model, a keras.applications architecture, or the user's own module. Which names
exist and which params each takes is the model table's (trainjobs/model_params.py)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from trainjobs.model_params import BUILTIN_MODELS, KERAS_APPLICATIONS, params_problem
from trainjobs.spec.strict import StrictModel, fail, submitting

# model.params is stored with the job and returned by every GET: keep it small (and shallow: MAX_NESTING).
MAX_PARAMS_BYTES = 64 << 10


class ModelSpec(StrictModel):
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
            raise fail("params", f"params are {size} bytes as JSON, over the {MAX_PARAMS_BYTES >> 10} KiB limit: "
                                 "pass data as a dataset or inside your module, not as params")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.name is None) == (self.module is None):
            raise fail("module", "give exactly one of model.name (built-in) or model.module (your code)")
        if self.name is not None and self.name not in BUILTIN_MODELS + KERAS_APPLICATIONS:
            raise fail("name", f"unknown model {self.name!r}: use {', '.join(BUILTIN_MODELS)} or a keras.applications "
                               "architecture such as MobileNetV2 or ResNet50")
        return self

    @model_validator(mode="after")
    def _known_params(self, info: ValidationInfo) -> ModelSpec:
        # Submit-only: releases before SPEC_VERSION 2 stored any params for a named model.
        if self.name is not None and submitting(info) and (problem := params_problem(self.name, self.params)):
            raise fail(f"params.{problem[0]}", problem[1])
        return self
