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
from agent import columns
from agent.data import LocalDataset
from agent.models import Builder, ModelInputs, build
from agent.tasks import SCORES, score

log = logging.getLogger("trainjobs.agent")

EVAL_BATCH = 256


def float32_copy(builder: Builder, inputs: ModelInputs, trained: Any) -> Any:
    keras.mixed_precision.set_global_policy("float32")
    copy = build(builder, inputs)
    if not copy.built:
        copy.build((None, *inputs.input_shape))
    copy.set_weights(trained.get_weights())
    return copy


def save_model(model: Any, input_shape: tuple[int, ...], directory: Path, labels: dict[str, Any],
               columns_: tuple[dict[str, Any], ...] | None = None, encoder: Any = None) -> None:
    """A SavedModel whose `serve` (also `serving_default`) runs the model in inference mode and returns
    its output: class probabilities (classification), the positive label's probability (binary), the
    targets in the data's units (regression). For classes, `classify` also returns each example's
    `class_id` and `class_name` (the names of labels.json, kept in the graph). labels.json (labels_doc)
    is also in its assets, so the directory carries what its outputs mean wherever it is copied.

    Not model.export(): it serves `model.__call__` without `training=`, and in Keras 3.15 a
    Resizing layer (a tf.data-style preprocessing layer) leaves the layers after it in training
    mode on such calls, so BatchNormalization would serve with batch statistics.

    A CSV's categorical and text columns (`columns_` and their `encoder`, agent/columns.py): both
    endpoints take the raw row, one [n] tensor per column by input name (strings for categorical and
    text, float32 for numbers), encoded in the graph by the layers training used."""
    archive = keras.export.ExportArchive()
    archive.track(model)
    signature: list[Any] = [tf.TensorSpec((None, *input_shape), tf.float32)]

    def predict(x: Any) -> Any:
        return model(x, training=False)

    if encoder is not None and columns_ is not None:
        archive.track(encoder)
        for lookup in encoder.lookups:  # their tables, which Keras 3.4's archive finds only this way
            archive.track(lookup)
        signature = [columns.input_signature(columns_)]

        def predict(x: Any) -> Any:
            return model(encoder(x), training=False)

    archive.add_endpoint("serve", predict, input_signature=signature)
    task = labels["task"]
    if task != "regression":
        names = tf.constant(labels["class_names"])

        def classify(x: Any) -> dict[str, Any]:
            out = predict(x)
            if task == "multilabel":  # each label on its own: 1 where its probability passes 0.5
                return {"probabilities": out, "labels": tf.cast(out > 0.5, tf.int32)}
            if task == "binary":
                ids = tf.cast(out[:, 0] > 0.5, tf.int32)
                return {"probability": out[:, 0], "class_id": ids, "class_name": tf.gather(names, ids)}
            ids = tf.argmax(out, axis=-1, output_type=tf.int32)
            return {"probabilities": out, "class_id": ids, "class_name": tf.gather(names, ids)}

        archive.add_endpoint("classify", classify, input_signature=signature)
    # `verbose` (off: no endpoint summary on stdout) is not in Keras 3.4, the TF 2.17 images' (3.6 has it).
    quiet = {"verbose": False} if "verbose" in inspect.signature(archive.write_out).parameters else {}
    archive.write_out(str(directory), **quiet)
    (directory / "assets").mkdir(exist_ok=True)
    write_labels(directory / "assets" / LABELS_NAME, labels)


LABELS_NAME = "labels.json"


def labels_doc(data: LocalDataset) -> dict[str, Any]:
    """What the model's outputs mean. Classes: class_names[i] is the label (the data's value, or its
    image folder's name) that became class id i; binary: class 1 is the positive label, the output its
    probability; regression: the targets in output order, with the training split's mean and std. A
    CSV's categorical and text columns add `inputs`: what the served model takes (columns.inputs_doc)."""
    doc = ({"task": data.task, "targets": list(data.target_names), "target_mean": list(data.target_mean or ()),
            "target_std": list(data.target_std or ())} if data.regression else classes_doc(data.labels, data.task))
    if data.columns is not None:  # what the served model takes (agent/columns.py)
        doc["inputs"] = columns.inputs_doc(data.columns)
    return doc


def classes_doc(names: list[str], task: str = "classification") -> dict[str, Any]:
    """labels.json of a classification or binary model whose class id i is names[i]."""
    return {"task": task, "num_classes": len(names), "class_names": list(names),
            "label_mapping": {str(i): name for i, name in enumerate(names)},
            **({"positive_label": names[1]} if task == "binary" else {})}


def write_labels(path: Path, labels: dict[str, Any]) -> None:
    path.write_text(json.dumps(labels, indent=2, ensure_ascii=False))


def saved_model_scores(directory: Path, task: str, x: Any, y: Any) -> dict[str, float | None]:
    """Load the export the way a user would and score it (agent/tasks.py: SCORES): proves it loads and
    predicts. saved_model_accuracy for classes, saved_model_r2 and _mae for a regression."""
    if len(y) == 0:
        return {f"saved_model_{name}": None for name in SCORES[task]}
    loaded = tf.saved_model.load(str(directory))
    return {f"saved_model_{k}": v for k, v in score(task, saved_model_predictions(loaded, x, len(y)), y).items()}


def saved_model_predictions(loaded: Any, x: Any, n: int) -> Any:
    """`serve` of a loaded SavedModel over the n examples of x (an array, or a CSV's columns by input name)."""
    if isinstance(x, dict):
        preds = [loaded.serve({k: tf.constant(v[i:i + EVAL_BATCH]) for k, v in x.items()}).numpy()
                 for i in range(0, n, EVAL_BATCH)]
    else:
        preds = [loaded.serve(tf.constant(x[i:i + EVAL_BATCH])).numpy() for i in range(0, n, EVAL_BATCH)]
    return np.concatenate(preds)


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


def tflite_scores(model: bytes, task: str, x: Any, y: Any) -> dict[str, float | None]:
    """The TFLite model scored the way saved_model_scores scores the SavedModel: tflite_<score>."""
    if len(y) == 0:
        return {f"tflite_{name}": None for name in SCORES[task]}
    out = tflite_predictions(model, x)
    return {f"tflite_{k}": v for k, v in score(task, out, y).items()}


def tflite_predictions(model: bytes, x: Any) -> Any:
    interpreter = interpreter_of(model)
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
        preds.append(_dequantized(interpreter.get_tensor(out["index"]), out))
    return np.concatenate(preds)


def _dequantized(values: Any, detail: dict[str, Any]) -> Any:
    """An output as floats: integer outputs (io_type int8/uint8) are (q - zero_point) * scale."""
    if detail["dtype"] in (np.float32, np.float16):
        return values
    scale, zero_point = detail.get("quantization", (0.0, 0))
    return (values.astype(np.float32) - zero_point) * (scale or 1.0)


def quantize_input(x: Any, detail: dict[str, Any]) -> Any:
    """x as the input tensor takes it: as is for float, x / scale + zero_point for integer inputs."""
    dtype = detail["dtype"]
    if not np.issubdtype(dtype, np.integer):
        return x.astype(dtype)
    scale, zero_point = detail["quantization"]
    info = np.iinfo(dtype)
    return np.clip(np.round(x / scale + zero_point), info.min, info.max).astype(dtype)


def interpreter_of(model: bytes, num_threads: int | None = None) -> Any:
    # tf.lite.Interpreter is deprecated in favour of LiteRT (ai-edge-litert) but still ships with
    # TF 2.21; use LiteRT where it is installed.
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return tf.lite.Interpreter(model_content=model, num_threads=num_threads)
    return Interpreter(model_content=model, num_threads=num_threads)


def gzip_size(path: Path) -> int:
    """Bytes of `path` gzip-compressed (a directory as a tar of its files, in name order): what a
    pruned model's zeros save in storage and on the wire."""
    import gzip
    import io
    import tarfile

    if path.is_file():
        return len(gzip.compress(path.read_bytes(), mtime=0))
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as zipped, tarfile.open(fileobj=zipped, mode="w") as tar:
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            tar.add(file, arcname=str(file.relative_to(path)))
    return len(buf.getvalue())


def artifact_manifest(directory: Path, remote: str, files: list[Path]) -> list[dict[str, Any]]:
    """The manifest of `files` (storage.local_files(directory), the list upload_dir is given too)."""
    entries = []
    for path in files:
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
