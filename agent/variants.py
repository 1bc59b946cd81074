"""export.variants (issue 23): smaller models beside saved_model/ and model.tflite, in artifacts/variants/.

- `saved_model_int8` -> variants/saved_model_int8/: Keras 3's own `model.quantize("int8")` on a float32 copy
  of the trained model. Each Dense, EinsumDense and Embedding kernel becomes int8 with a float32 scale per
  output channel (abs-max), and a Dense or EinsumDense quantizes its input per example when called; every
  other layer (convolutions, normalization, pooling) stays float32, so a cnn is int8 only in its Dense
  layers (optimization.json names them). Served like saved_model/ (export.save_model: `serve` and
  `classify`, a regression in the target's units, a CSV's raw columns).
- `tflite_float32`, `tflite_dynamic`, `tflite_float16`, `tflite_int8` -> variants/<name>.tflite: what
  export.tflite with that quantization writes as model.tflite (float32 input and output; int8 calibrated on
  up to DEFAULT_CALIBRATION_EXAMPLES training examples).

Keras versions: model.quantize is in Keras >= 3.2; the images' 3.4.1 and 3.6.0 quantize the same layers as
the pinned 3.15 and export them the same way (tests/e2e/test_pruning.py runs in make test-images). 3.15 also
takes `config` and `filters` and skips a layer without the method; 3.4 raises AttributeError for one, so a
layer counts as supported only where its class has its own `quantize`. The check runs on the model built
for training, before it trains (`check_quantizable`), so a model with nothing to quantize costs no training.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainjobs.spec import ExportSpec
from trainjobs.spec.export import TFLITE_VARIANTS, VARIANTS_DIR
from agent import export, tasks
from agent.data import LocalDataset, read_arrays
from agent.model_inputs import Builder, ModelError, ModelInputs

log = logging.getLogger("trainjobs.agent")

INT8 = "saved_model_int8"
ENCODED_MODEL = "encoded_model"  # in Source.scratch: a CSV's model taking the encoded vector, for TFLite


class VariantError(ModelError):
    """A variant the model cannot be made into; the message says why, for the user."""


@dataclass(frozen=True)
class Made:
    """One exported model the optimization report compares."""

    name: str  # "saved_model", "model.tflite", or the variant's name in export.variants
    path: str  # in artifacts/
    format: str  # "saved_model" or "tflite"
    quantization: str  # "none", "int8", "dynamic", "float16"
    params: int  # values in the weights of the Keras model it was saved or converted from
    zeros: int  # ... of which exactly zero
    quantized_layers: tuple[str, ...] = ()  # saved_model_int8: the layers Keras made int8


@dataclass(frozen=True)
class Source:
    """What the variants are made from: the trained model, how to build its float32 copy, and what the
    main SavedModel was exported with."""

    out: Path  # artifacts/ on this machine
    scratch: Path  # for models that are not artifacts
    builder: Builder
    inputs: ModelInputs
    trained: Any
    exported: Any  # the float32 copy saved_model/ was saved from (export.float32_copy)
    serving: Any  # ... as saved_model/ serves it (tasks.serving_model)
    labels: dict[str, Any]
    data: LocalDataset
    encoder: Any = None  # a CSV's column encoder (agent/columns.py)


def quantizable_layers(model: Any) -> list[str]:
    """The layers model.quantize("int8") makes int8: leaves whose class has its own `quantize` (Dense,
    EinsumDense, Embedding in Keras 3.4 to 3.15). `_flatten_layers` is the walk model.quantize does."""
    import keras

    base = keras.layers.Layer.quantize
    return [layer.name for layer in model._flatten_layers(include_self=False)
            if len(list(layer._flatten_layers())) == 1 and getattr(type(layer), "quantize", base) is not base]


def check_quantizable(model: Any, spec: ExportSpec) -> None:
    """Before training: saved_model_int8 needs a layer Keras can quantize, and a Keras that can."""
    if INT8 not in spec.variants:
        return
    if not hasattr(model, "quantize"):
        import keras

        raise VariantError(f"export.variants {INT8}: Keras {keras.__version__} has no model.quantize (Keras 3.2 "
                           "or newer has); choose an image with a newer Keras or leave the variant out")
    if not quantizable_layers(model):
        raise VariantError(f"export.variants {INT8}: the model has no layer Keras quantizes to int8 (Dense, "
                           "EinsumDense or Embedding); leave the variant out, or use a tflite_ variant")


def weight_counts(model: Any) -> tuple[int, int]:
    """(values, zeros) over every weight of the model."""
    weights = [np.asarray(w) for w in model.get_weights()]
    return sum(w.size for w in weights), sum(int(np.count_nonzero(w == 0)) for w in weights)


def export_variants(spec: ExportSpec, src: Source) -> list[Made]:
    """Write each variant spec.variants asks for; return every exported model, the main ones first."""
    counts = weight_counts(src.exported)
    made = [Made("saved_model", "saved_model", "saved_model", "none", *counts)]
    if spec.tflite is not None:
        made.append(Made("model.tflite", "model.tflite", "tflite", spec.tflite.quantization, *counts))
    if not spec.variants:
        return made
    (src.out / VARIANTS_DIR).mkdir(parents=True, exist_ok=True)
    for name in spec.variants:
        if name == INT8:
            made.append(_saved_model_int8(src))
        else:
            made.append(_tflite(spec, name, src, counts))
    return made


def _saved_model_int8(src: Source) -> Made:
    copy = export.float32_copy(src.builder, src.inputs, src.trained)
    layers = quantizable_layers(copy)
    with warnings.catch_warnings():  # one per layer without `quantize`: the layers stay float32, as intended
        warnings.simplefilter("ignore")
        copy.quantize("int8")
    serving = tasks.serving_model(copy, src.inputs.task, src.inputs.target_mean, src.inputs.target_std)
    path = f"{VARIANTS_DIR}/{INT8}"
    export.save_model(serving, src.inputs.input_shape, src.out / path, src.labels, src.data.columns, src.encoder)
    log.info("%s: int8 layers %s", INT8, ", ".join(layers))
    return Made(INT8, path, "saved_model", "int8", *weight_counts(copy), tuple(layers))


def _tflite(spec: ExportSpec, name: str, src: Source, counts: tuple[int, int]) -> Made:
    options = spec.variant_tflite(name)
    calibration = None
    if options.quantization == "int8":
        calibration, _ = read_arrays(src.data, src.data.train, options.calibration_limit)
    path = f"{VARIANTS_DIR}/{name}.tflite"
    (src.out / path).write_bytes(export.to_tflite(_tflite_source(src), options, calibration))
    return Made(name, path, "tflite", TFLITE_VARIANTS[name], *counts)


def _tflite_source(src: Source) -> Path:
    """The SavedModel TFLite converts: saved_model/, or for a CSV's columns the one taking the encoded
    vector (TFLite holds no string lookups), which model.tflite's conversion may have written already."""
    if src.data.columns is None:
        return src.out / "saved_model"
    encoded = src.scratch / ENCODED_MODEL
    if not encoded.exists():
        export.save_model(src.serving, src.inputs.input_shape, encoded, src.labels)
    return encoded
