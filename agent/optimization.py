"""optimization.json (issue 23): every model the job exported, compared on the same footing.

For each one (agent/variants.py: saved_model/, model.tflite, each of export.variants):
- its scores on the same validation examples as the final metrics' (agent/tasks.py: SCORES), from the
  file as written: the SavedModel loaded with tf.saved_model.load and called through `serve`, the
  TFLite model through the interpreter;
- its size on disk and gzip-compressed (export.gzip_size: what a pruned model's zeros save);
- its weights (`params`: every value the Keras model it was saved or converted from holds, as
  `get_weights` lists them, so a BatchNormalization's statistics and an int8 layer's scales count) and
  `sparsity`, the share of those that are exactly zero;
- its CPU latency for one example and for a batch of 32, measured the same way for every model: the
  input prepared before the clock starts, WARMUP calls, then the median of up to REPEATS calls (at
  most LATENCY_BUDGET_S each size), each from input to output in numpy. TensorFlow and the TFLite
  interpreter both get every CPU this process may use (`threads`).
The final metrics (and so GET /v1/jobs/{id}) carry `summary()` of it: one row per model.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from agent import export
from agent.tasks import SCORES, score
from agent.variants import Made

OPTIMIZATION_NAME = "optimization.json"
WARMUP = 3
REPEATS = 30
LATENCY_BUDGET_S = 1.0
BATCHES = (1, 32)


def threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def report(made: list[Made], out: Path, task: str, served_x: Any, tensor_x: Any, y: Any) -> dict[str, Any]:
    """The report of every model in `made`, written under `out` (artifacts/). served_x is what the
    SavedModels take (a CSV's raw columns, by input name), tensor_x what the TFLite models take (the
    encoded array); y their labels."""
    models = [_one(m, out, task, served_x, tensor_x, y) for m in made]
    return {"task": task, "scores": list(SCORES[task]), "eval_examples": int(len(y)), "threads": threads(),
            "latency": {"batches": list(BATCHES), "warmup": WARMUP, "repeats": REPEATS,
                        "budget_s": LATENCY_BUDGET_S, "statistic": "median"},
            "models": models}


def summary(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per model for the final metrics: name, its first score, sizes, weights, latency."""
    first = doc["scores"][0]
    return [{"name": m["name"], "format": m["format"], "quantization": m["quantization"], first: m["scores"][first],
             "bytes": m["bytes"], "gzip_bytes": m["gzip_bytes"], "params": m["params"], "sparsity": m["sparsity"],
             "latency_ms_1": m["latency_ms"]["1"], "latency_ms_32": m["latency_ms"]["32"]} for m in doc["models"]]


def _one(made: Made, out: Path, task: str, served_x: Any, tensor_x: Any, y: Any) -> dict[str, Any]:
    import tensorflow as tf

    path = out / made.path
    if made.format == "saved_model":
        loaded = tf.saved_model.load(str(path))
        x = served_x
        predict = (lambda batch: export.saved_model_predictions(loaded, batch, _length(batch)))
        call = _saved_model_call(loaded)
    else:
        flatbuffer = path.read_bytes()
        x = tensor_x
        predict = (lambda batch: export.tflite_predictions(flatbuffer, batch))
        call = _tflite_call(flatbuffer)
    scores: dict[str, float | None] = {k: None for k in SCORES[task]}
    if len(y):
        scores.update(score(task, predict(x), y))
    doc: dict[str, Any] = {
        "name": made.name, "path": made.path, "format": made.format, "quantization": made.quantization,
        "scores": scores, "bytes": _bytes(path), "gzip_bytes": export.gzip_size(path),
        "params": made.params, "sparsity": round(made.zeros / made.params, 4) if made.params else 0.0,
        "latency_ms": {str(n): (_latency(call, _batch(x, n)) if _length(x) else None) for n in BATCHES},
    }
    if made.quantized_layers:
        doc["quantized_layers"] = list(made.quantized_layers)
    return doc


def _saved_model_call(loaded: Any) -> Callable[[Any], Callable[[], Any]]:
    import tensorflow as tf

    def prepare(batch: Any) -> Callable[[], Any]:
        inputs = ({k: tf.constant(v) for k, v in batch.items()} if isinstance(batch, dict) else tf.constant(batch))
        return lambda: loaded.serve(inputs).numpy()

    return prepare


def _tflite_call(flatbuffer: bytes) -> Callable[[Any], Callable[[], Any]]:
    def prepare(batch: Any) -> Callable[[], Any]:
        # An interpreter per batch size: TF 2.18's TFLite crashes (SIGSEGV) in a dynamic-range model's
        # invoke after its input grew from 1 to 32 examples on the same interpreter.
        interpreter = export.interpreter_of(flatbuffer, num_threads=threads())
        inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
        interpreter.resize_tensor_input(inp["index"], list(batch.shape))
        interpreter.allocate_tensors()
        values = export.quantize_input(batch, inp)

        def call() -> Any:
            interpreter.set_tensor(inp["index"], values)
            interpreter.invoke()
            return interpreter.get_tensor(out["index"])

        return call

    return prepare


def _latency(prepare: Callable[[Any], Callable[[], Any]], batch: Any) -> float:
    """Milliseconds: the median of up to REPEATS calls after WARMUP, within LATENCY_BUDGET_S."""
    call = prepare(batch)
    for _ in range(WARMUP):
        call()
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < REPEATS and (len(times) < 5 or time.perf_counter() - started < LATENCY_BUDGET_S):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1000, 4)


def _length(x: Any) -> int:
    return len(next(iter(x.values()))) if isinstance(x, dict) else len(x)


def _batch(x: Any, n: int) -> Any:
    """The first n examples, repeated from the start where there are fewer."""
    index = np.arange(n) % _length(x)
    return {k: np.asarray(v)[index] for k, v in x.items()} if isinstance(x, dict) else np.asarray(x)[index]


def _bytes(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
