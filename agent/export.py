"""The artifacts: a float32 SavedModel, an optional TFLite model, their measured accuracy, a manifest.

Export works on a float32 copy of the trained model, built by the same builder outside any
strategy. A model trained under mixed_bfloat16 or mixed_float16 computes in that dtype, and the
TFLite converter cannot quantize those graphs (int8 calibration needs float32 activations); the
copy also serves on any CPU, where bfloat16 and float16 kernels are slow or missing.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import warnings
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainjobs import storage
from trainjobs.job_paths import ARTIFACT_MANIFEST
from trainjobs.spec import TfliteExport
from agent.models import Builder, ModelInputs, build

log = logging.getLogger("trainjobs.agent")

EVAL_BATCH = 256


def float32_copy(builder: Builder, inputs: ModelInputs, trained: Any) -> Any:
    keras.mixed_precision.set_global_policy("float32")
    copy = build(builder, inputs)
    if not copy.built:
        copy.build((None, *inputs.input_shape))
    copy.set_weights(trained.get_weights())
    return copy


def save_model(model: Any, input_shape: tuple[int, ...], directory: Path, class_names: list[str]) -> None:
    """A SavedModel whose `serve` (also `serving_default`) runs the model in inference mode and
    returns class probabilities, and whose `classify` also returns each example's `class_id` and
    `class_name` (the names of labels.json, kept in the graph). labels.json is also in its assets,
    so the directory carries its class names wherever it is copied.

    Not model.export(): it serves `model.__call__` without `training=`, and in Keras 3.15 a
    Resizing layer (a tf.data-style preprocessing layer) leaves the layers after it in training
    mode on such calls, so BatchNormalization would serve with batch statistics."""
    archive = keras.export.ExportArchive()
    archive.track(model)
    signature = [tf.TensorSpec((None, *input_shape), tf.float32)]
    names = tf.constant(class_names)

    def classify(x: Any) -> dict[str, Any]:
        probabilities = model(x, training=False)
        ids = tf.argmax(probabilities, axis=-1, output_type=tf.int32)
        return {"probabilities": probabilities, "class_id": ids, "class_name": tf.gather(names, ids)}

    archive.add_endpoint("serve", lambda x: model(x, training=False), input_signature=signature)
    archive.add_endpoint("classify", classify, input_signature=signature)
    # `verbose` (off: no endpoint summary on stdout) is not in Keras 3.4, the TF 2.17 images' (3.6 has it).
    quiet = {"verbose": False} if "verbose" in inspect.signature(archive.write_out).parameters else {}
    archive.write_out(str(directory), **quiet)
    (directory / "assets").mkdir(exist_ok=True)
    write_labels(directory / "assets" / LABELS_NAME, class_names)


LABELS_NAME = "labels.json"


def labels_doc(class_names: list[str]) -> dict[str, Any]:
    """What the model's class ids mean: class_names[i] is the label (the data's value, or its image
    folder's name) that became class id i."""
    return {"num_classes": len(class_names), "class_names": list(class_names),
            "label_mapping": {str(i): name for i, name in enumerate(class_names)}}


def write_labels(path: Path, class_names: list[str]) -> None:
    path.write_text(json.dumps(labels_doc(class_names), indent=2, ensure_ascii=False))


def saved_model_accuracy(directory: Path, x: Any, y: Any) -> float | None:
    """Load the export the way a user would and score it: proves it loads and predicts."""
    if len(y) == 0:
        return None
    loaded = tf.saved_model.load(str(directory))
    preds = [loaded.serve(tf.constant(x[i:i + EVAL_BATCH])).numpy() for i in range(0, len(x), EVAL_BATCH)]
    return float(np.mean(np.concatenate(preds).argmax(axis=-1) == y))


_IO_TYPES = {"int8": tf.int8, "uint8": tf.uint8}


def to_tflite(saved_model: Path, options: TfliteExport, calibration: Any) -> bytes:
    # The serving signature only: `classify` returns strings, which TFLite's integer kernels cannot hold.
    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model), signature_keys=["serving_default"])
    if options.quantization != "none":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if options.quantization == "float16":
        converter.target_spec.supported_types = [tf.float16]
    if options.quantization == "int8":
        # Full-integer kernels, calibrated on training examples; float input and output unless io_type asks
        # for integers (edge accelerators), when the caller quantizes with the input tensor's parameters.
        converter.representative_dataset = lambda: ([calibration[i:i + 1]] for i in range(len(calibration)))
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        if options.io_type in _IO_TYPES:
            converter.inference_input_type = converter.inference_output_type = _IO_TYPES[options.io_type]
    flatbuffer: bytes = converter.convert()
    return flatbuffer


def tflite_accuracy(model: bytes, x: Any, y: Any) -> float | None:
    if len(y) == 0:
        return None
    interpreter = _interpreter(model)
    inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    preds, size = [], None
    for i in range(0, len(x), EVAL_BATCH):
        chunk = quantize_input(x[i:i + EVAL_BATCH], inp)
        if len(chunk) != size:
            size = len(chunk)
            interpreter.resize_tensor_input(inp["index"], [size, *x.shape[1:]])
            interpreter.allocate_tensors()
        interpreter.set_tensor(inp["index"], chunk)
        interpreter.invoke()
        # Integer outputs are an increasing function of the probabilities (scale > 0): argmax holds.
        preds.append(interpreter.get_tensor(out["index"]))
    return float(np.mean(np.concatenate(preds).argmax(axis=-1) == y))


def quantize_input(x: Any, detail: dict[str, Any]) -> Any:
    """x as the input tensor takes it: as is for float, x / scale + zero_point for integer inputs."""
    dtype = detail["dtype"]
    if not np.issubdtype(dtype, np.integer):
        return x.astype(dtype)
    scale, zero_point = detail["quantization"]
    info = np.iinfo(dtype)
    return np.clip(np.round(x / scale + zero_point), info.min, info.max).astype(dtype)


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
    for path in storage.local_files(directory):  # what upload_dir uploads
        rel = path.relative_to(directory).as_posix()
        if rel == ARTIFACT_MANIFEST:
            continue
        entries.append({"path": rel, "size": path.stat().st_size, "sha256": _sha256(path), "uri": f"{remote}/{rel}"})
    return entries


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
