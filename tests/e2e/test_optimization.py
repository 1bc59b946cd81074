"""export.variants and optimization.json (issue 23) through the agent alone, as a machine runs it: the
digits cnn pruned to 80%, exported as a float32 model.tflite and every variant, judged from the
downloaded artifacts: each model loaded and scored here on the validation digits against what the
report says, its sizes, its weights (int8 kernels where Keras quantized), and a latency for each
batch size. Also: a regression's int8 SavedModel predicts in the target's units, and a model with
nothing Keras quantizes fails before it trains."""

from __future__ import annotations

import gzip
import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.agent import digits, make_job, read, run_agent, spec, write_dataset
from trainjobs import storage
from trainjobs.job_paths import ARTIFACT_METRICS, JobPaths

pytestmark = pytest.mark.tf

VARIANTS = ["saved_model_int8", "tflite_dynamic", "tflite_float16", "tflite_int8"]


@pytest.fixture(scope="module")
def optimized(gcs_emulator: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    storage.ensure_bucket(bucket)
    x, y = digits()
    dataset = write_dataset(bucket, tmp_path_factory.mktemp("digits"), x, y, 10, val=359)
    job_dir = make_job(bucket, spec(
        accelerator={"type": "cpu"}, strategy="default", model={"name": "cnn"},
        training={"epochs": 5, "global_batch_size": 32, "learning_rate": 0.003, "seed": 3,
                  "pruning": {"target_sparsity": 0.8, "begin_epoch": 0, "end_epoch": 3, "frequency_steps": 5}},
        export={"tflite": {"quantization": "none"}, "variants": VARIANTS}), dataset)
    rc, log = run_agent(job_dir)
    assert rc == 0, "\n".join(line for line in log.splitlines() if " I " not in line and "W0000" not in line)[-4000:]
    local = tmp_path_factory.mktemp("artifacts")
    storage.download_prefix(JobPaths(job_dir).artifacts, local)
    return {"dir": local, "x": x[-359:], "y": y[-359:], "report": json.loads((local / "optimization.json").read_text())}


def _predict(path: Path, x: np.ndarray) -> np.ndarray:
    import tensorflow as tf

    if path.is_dir():
        loaded = tf.saved_model.load(str(path))  # held: a bare .serve would outlive the variables
        return loaded.serve(tf.constant(x)).numpy()
    interpreter = tf.lite.Interpreter(model_content=path.read_bytes())
    inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    interpreter.resize_tensor_input(inp["index"], list(x.shape))
    interpreter.allocate_tensors()
    interpreter.set_tensor(inp["index"], x.astype(np.float32))
    interpreter.invoke()
    return interpreter.get_tensor(out["index"])


def _variables(saved_model: Path) -> dict[str, np.ndarray]:
    import tensorflow as tf

    loaded = tf.saved_model.load(str(saved_model))
    # Not a weight: the state of Dropout's random generator.
    return {name: v.numpy() for v in loaded.variables if "seed_generator" not in (name := getattr(v, "path", v.name))}


def test_the_report_lists_each_model_scored_as_its_file_scores_here(optimized: dict[str, Any]) -> None:
    report, local, x, y = optimized["report"], optimized["dir"], optimized["x"], optimized["y"]
    models = report["models"]
    assert [m["name"] for m in models] == ["saved_model", "model.tflite", *VARIANTS]
    assert [(m["format"], m["quantization"]) for m in models] == [
        ("saved_model", "none"), ("tflite", "none"), ("saved_model", "int8"), ("tflite", "dynamic"),
        ("tflite", "float16"), ("tflite", "int8")]
    assert report["eval_examples"] == 359 and report["scores"] == ["accuracy"]
    accuracy = {}
    for m in models:
        accuracy[m["name"]] = float(np.mean(_predict(local / m["path"], x).argmax(axis=-1) == y))
        assert m["scores"]["accuracy"] == pytest.approx(accuracy[m["name"]], abs=1e-9), m["name"]
    print("digits cnn pruned to 80%, accuracy by model:", json.dumps(accuracy))
    assert all(a > 0.85 for a in accuracy.values()), accuracy
    # The float32 TFLite model computes what the SavedModel does; the quantized ones stay close to it.
    assert accuracy["model.tflite"] == pytest.approx(accuracy["saved_model"], abs=0.003)
    assert all(abs(a - accuracy["saved_model"]) <= 0.03 for a in accuracy.values()), accuracy


def test_sizes_weights_and_latency_are_the_files(optimized: dict[str, Any]) -> None:
    local = optimized["dir"]
    by_name = {m["name"]: m for m in optimized["report"]["models"]}
    for name, m in by_name.items():
        path = local / m["path"]
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        assert m["bytes"] == sum(p.stat().st_size for p in files), name
        zipped = sum(len(gzip.compress(p.read_bytes())) for p in files)
        assert m["gzip_bytes"] == pytest.approx(zipped, rel=0.1), name
        assert set(m["latency_ms"]) == {"1", "32"} and all(v > 0 for v in m["latency_ms"].values()), name
    for name in ("saved_model", "saved_model_int8"):  # every value its variables hold, and their zeros
        values = list(_variables(local / by_name[name]["path"]).values())
        assert by_name[name]["params"] == sum(v.size for v in values), name
        zeros = sum(int(np.count_nonzero(v == 0)) for v in values) / sum(v.size for v in values)
        assert by_name[name]["sparsity"] == pytest.approx(zeros, abs=1e-4), name
    assert by_name["saved_model"]["sparsity"] > 0.6  # 80% of the hidden kernels, which are most weights
    # Pruned zeros compress: each gzip-compressed TFLite file is well under its size.
    for name in ("model.tflite", "tflite_dynamic", "tflite_float16", "tflite_int8"):
        assert by_name[name]["gzip_bytes"] < 0.6 * by_name[name]["bytes"], name
    assert by_name["tflite_int8"]["bytes"] < 0.4 * by_name["model.tflite"]["bytes"]
    assert by_name["tflite_float16"]["bytes"] < 0.6 * by_name["model.tflite"]["bytes"]


def test_the_int8_saved_model_holds_its_dense_kernels_as_int8(optimized: dict[str, Any]) -> None:
    local, report = optimized["dir"], optimized["report"]
    int8 = next(m for m in report["models"] if m["name"] == "saved_model_int8")
    variables = _variables(local / int8["path"])
    int8_kernels = {n for n, v in variables.items() if v.dtype == np.int8}
    dense = [layer for layer in int8["quantized_layers"]]
    assert dense and all(layer.startswith("dense") or layer == "probabilities" for layer in dense), dense
    assert len(int8_kernels) == len(dense), (int8_kernels, dense)  # one kernel each; conv kernels stay float
    assert {n for n, v in variables.items() if "conv" in n and "kernel" in n and v.dtype == np.float32}
    assert int8["bytes"] < by_size(report, "saved_model")
    # The pruned zeros stay zeros: abs-max scaling maps 0 to 0.
    hidden = [v for n, v in variables.items() if v.dtype == np.int8 and v.size > 1000]
    assert hidden and all(float(np.mean(v == 0)) >= 0.79 for v in hidden)
    # Served like saved_model/: `classify` names the classes.
    import tensorflow as tf

    loaded = tf.saved_model.load(str(local / int8["path"]))
    out = loaded.classify(tf.constant(optimized["x"][:4]))
    assert [n.decode() for n in out["class_name"].numpy()] == [str(i) for i in out["class_id"].numpy()]
    assert json.loads((local / int8["path"] / "assets" / "labels.json").read_text())["num_classes"] == 10


def by_size(report: dict[str, Any], name: str) -> int:
    return int(next(m["bytes"] for m in report["models"] if m["name"] == name))


def test_the_final_metrics_carry_the_reports_summary(optimized: dict[str, Any]) -> None:
    metrics = json.loads((optimized["dir"] / ARTIFACT_METRICS).read_text())
    rows = metrics["optimization"]
    assert [r["name"] for r in rows] == [m["name"] for m in optimized["report"]["models"]]
    for row, m in zip(rows, optimized["report"]["models"], strict=True):
        assert row["accuracy"] == m["scores"]["accuracy"] and row["gzip_bytes"] == m["gzip_bytes"]
        assert (row["latency_ms_1"], row["latency_ms_32"]) == (m["latency_ms"]["1"], m["latency_ms"]["32"])
    assert rows[0]["accuracy"] == metrics["saved_model_accuracy"]


def test_a_regressions_int8_saved_model_predicts_in_the_targets_units(bucket: str, tmp_path: Path) -> None:
    from sklearn.datasets import load_diabetes

    x, y = load_diabetes(return_X_y=True)
    x, y = x.astype(np.float32), y.astype(np.float32)
    dataset = write_dataset(bucket, tmp_path, x, y, 0, val=88, task="regression")
    job_dir = make_job(bucket, spec(
        accelerator={"type": "cpu"}, strategy="default", task="regression", model={"name": "mlp"},
        dataset={"source": "diabetes.csv", "options": {"label_column": "target"}},
        training={"epochs": 30, "global_batch_size": 32, "learning_rate": 0.01, "seed": 1},
        export={"variants": ["saved_model_int8", "tflite_int8"]}), dataset)
    rc, log = run_agent(job_dir)
    assert rc == 0, log[-4000:]
    local = tmp_path / "dl"
    storage.download_prefix(JobPaths(job_dir).artifacts, local)
    report = json.loads((local / "optimization.json").read_text())
    assert [m["name"] for m in report["models"]] == ["saved_model", "saved_model_int8", "tflite_int8"]
    x_val, y_val = x[-88:], y[-88:]
    float_pred = _predict(local / "saved_model", x_val).reshape(-1)
    int8_pred = _predict(local / "variants" / "saved_model_int8", x_val).reshape(-1)
    assert float(np.mean(np.abs(int8_pred - y_val))) == pytest.approx(
        next(m for m in report["models"] if m["name"] == "saved_model_int8")["scores"]["mae"], rel=1e-4)
    assert 50 < float(np.mean(int8_pred)) < 250  # the target's units (about 150), not standardized ones
    assert float(np.max(np.abs(int8_pred - float_pred))) < 0.1 * float(np.std(y_val))


def test_a_model_with_nothing_to_quantize_fails_before_it_trains(bucket: str, tmp_path: Path) -> None:
    module = tmp_path / "convs.py"
    module.write_text(
        "import keras\n\n"
        "def build_model(input_shape, num_classes, params):\n"
        "    inp = keras.Input(input_shape)\n"
        "    x = keras.layers.Conv2D(num_classes, 8, padding='valid', activation='softmax')(inp)\n"
        "    return keras.Model(inp, keras.layers.Reshape((num_classes,))(x))\n")
    x, y = digits()
    dataset = write_dataset(bucket, tmp_path / "data", x[:300], y[:300], 10, val=60)
    job_dir = make_job(bucket, spec(
        accelerator={"type": "cpu"}, strategy="default", model={"module": str(module)},
        training={"epochs": 1, "global_batch_size": 32}, export={"variants": ["saved_model_int8"]}), dataset)
    rc, log = run_agent(job_dir)
    status = read(JobPaths(job_dir).status)
    assert rc != 0 and status["state"] == "failed", log[-3000:]
    assert "saved_model_int8" in status["error"]["message"] and "no layer Keras quantizes" in status["error"]["message"]
    assert not status.get("progress")  # not one step trained
