"""The artifacts: a float32 SavedModel, an optional TFLite model, their measured accuracy, a manifest.

Export works on a float32 copy of the trained model, built by the same builder outside any
strategy. A model trained under mixed_bfloat16 or mixed_float16 computes in that dtype, and the
TFLite converter cannot quantize those graphs (int8 calibration needs float32 activations); the
copy also serves on any CPU, where bfloat16 and float16 kernels are slow or missing.
"""

from __future__ import annotations

import hashlib
import logging
import warnings
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainjobs.spec import TfliteExport
from worker.agent.models import Builder, ModelInputs, build

log = logging.getLogger("trainjobs.agent")

EVAL_BATCH = 256


def float32_copy(builder: Builder, inputs: ModelInputs, trained: Any) -> Any:
    keras.mixed_precision.set_global_policy("float32")
    copy = build(builder, inputs)
    if not copy.built:
        copy.build((None, *inputs.input_shape))
    copy.set_weights(trained.get_weights())
    return copy


def save_model(model: Any, input_shape: tuple[int, ...], directory: Path) -> None:
    """A SavedModel whose `serve` (also `serving_default`) runs the model in inference mode.

    Not model.export(): it serves `model.__call__` without `training=`, and in Keras 3.15 a
    Resizing layer (a tf.data-style preprocessing layer) leaves the layers after it in training
    mode on such calls, so BatchNormalization would serve with batch statistics."""
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serve", lambda x: model(x, training=False),
                         input_signature=[tf.TensorSpec((None, *input_shape), tf.float32)])
    archive.write_out(str(directory), verbose=False)


def saved_model_accuracy(directory: Path, x: Any, y: Any) -> float | None:
    """Load the export the way a user would and score it: proves it loads and predicts."""
    if len(y) == 0:
        return None
    loaded = tf.saved_model.load(str(directory))
    preds = [loaded.serve(tf.constant(x[i:i + EVAL_BATCH])).numpy() for i in range(0, len(x), EVAL_BATCH)]
    return float(np.mean(np.concatenate(preds).argmax(axis=-1) == y))


def to_tflite(saved_model: Path, options: TfliteExport, calibration: Any) -> bytes:
    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model))
    if options.quantization != "none":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if options.quantization == "float16":
        converter.target_spec.supported_types = [tf.float16]
    if options.quantization == "int8":
        # Full-integer kernels with float input and output, calibrated on training examples.
        converter.representative_dataset = lambda: ([calibration[i:i + 1]] for i in range(len(calibration)))
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    flatbuffer: bytes = converter.convert()
    return flatbuffer


def tflite_accuracy(model: bytes, x: Any, y: Any) -> float | None:
    if len(y) == 0:
        return None
    interpreter = _interpreter(model)
    inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    preds, size = [], None
    for i in range(0, len(x), EVAL_BATCH):
        chunk = x[i:i + EVAL_BATCH].astype(inp["dtype"])
        if len(chunk) != size:
            size = len(chunk)
            interpreter.resize_tensor_input(inp["index"], [size, *x.shape[1:]])
            interpreter.allocate_tensors()
        interpreter.set_tensor(inp["index"], chunk)
        interpreter.invoke()
        preds.append(interpreter.get_tensor(out["index"]))
    return float(np.mean(np.concatenate(preds).argmax(axis=-1) == y))


def _interpreter(model: bytes) -> Any:
    # tf.lite.Interpreter is deprecated in favour of LiteRT (ai-edge-litert) but still ships with
    # TF 2.21; use LiteRT where it is installed.
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return tf.lite.Interpreter(model_content=model)
    return Interpreter(model_content=model)


def artifact_manifest(directory: Path, remote: str) -> list[dict[str, Any]]:
    entries = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel == "manifest.json":
            continue
        entries.append({"path": rel, "size": path.stat().st_size, "sha256": _sha256(path), "uri": f"{remote}/{rel}"})
    return entries


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
