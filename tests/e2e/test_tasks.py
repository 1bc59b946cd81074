"""Tasks beyond classification (issue 21) through the whole product, on data scikit-learn ships, judged
here from the downloaded SavedModel on the staged validation split (never from the job's own numbers).
Every job of the module is submitted at once to one local stack."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support.census import census, rows
from tests.support.jobs import ModuleJobs, finished, module_jobs, submit_all
from tests.support.local import local_stack_running
from trainjobs import storage
from trainjobs.job_paths import JobPaths, dataset_file, dataset_manifest

pytestmark = pytest.mark.tf

SKLEARN_DATA = Path(__import__("sklearn.datasets").datasets.__file__).parent / "data"


def _diabetes_csv() -> bytes:
    """scikit-learn's diabetes set (442 patients, 10 features, a disease progression score) as a CSV."""
    from sklearn.datasets import load_diabetes

    bunch = load_diabetes()
    header = ",".join([*bunch.feature_names, "target"])
    rows = [",".join(f"{v:.6g}" for v in (*x, t)) for x, t in zip(bunch.data, bunch.target, strict=True)]
    return ("\n".join([header, *rows]) + "\n").encode()


def _tags_csvs() -> tuple[bytes, bytes]:
    """The same multi-label data two ways: three 0/1 tag columns, and one column of tag names joined by
    '|' (an empty cell: no tag). Each tag is a rule over the features, some rows have none, some all."""
    rng = np.random.default_rng(11)
    x = rng.normal(0, 1, (500, 6))
    tags = np.stack([x[:, 0] > 0, x[:, 1] + x[:, 2] > 0.5, x[:, 3] < -0.3], axis=1)
    features = [",".join(f"{v:.5f}" for v in row) for row in x]
    columns = "f0,f1,f2,f3,f4,f5"
    wide = [f"{columns},urgent,billing,outage"] + [f"{f},{','.join(str(int(t)) for t in row)}"
                                                   for f, row in zip(features, tags, strict=True)]
    names = np.array(["urgent", "billing", "outage"])
    joined = [f"{columns},tags"] + [f"{f},{'|'.join(names[row])}" for f, row in zip(features, tags, strict=True)]
    return ("\n".join(wide) + "\n").encode(), ("\n".join(joined) + "\n").encode()


def _linnerud_csv() -> bytes:
    """scikit-learn's linnerud files as they ship (space-separated, a header each), side by side: three
    exercises, then the three physiological measurements a multi-target regression predicts."""
    exercise = (SKLEARN_DATA / "linnerud_exercise.csv").read_text().split("\n")
    body = (SKLEARN_DATA / "linnerud_physiological.csv").read_text().split("\n")
    rows = [f"{a.strip()} {b.strip()}" for a, b in zip(exercise, body, strict=True) if a.strip()]
    return ("\n".join(rows) + "\n").encode()


def _upload(client: httpx.Client, name: str, data: bytes) -> str:
    r = client.post("/v1/datasets", files={"file": (name, data)})
    assert r.status_code == 201, r.text
    return f"dataset:{r.json()['sha256']}"


# A model of the user's for any task: the four-argument build_model (README, Your model).
WIDE_AND_DEEP = b'''
import keras


def build_model(input_shape, num_outputs, params, task):
    inputs = keras.Input(input_shape)
    x = keras.layers.Normalization()(inputs)  # adapted by nobody: the data here is already scaled
    deep = keras.layers.Dense(32, activation="relu")(x)
    merged = keras.layers.Concatenate()([x, deep])
    activation = {"binary": "sigmoid", "classification": "softmax"}.get(task)
    return keras.Model(inputs, keras.layers.Dense(num_outputs, activation=activation, dtype="float32")(merged))
'''


def _specs(client: httpx.Client) -> dict[str, dict[str, Any]]:
    diabetes = _upload(client, "diabetes.csv", _diabetes_csv())
    cancer = _upload(client, "breast_cancer.csv", (SKLEARN_DATA / "breast_cancer.csv").read_bytes())
    yes_no = _upload(client, "answers.csv", b"a,b,label\n" + b"".join(
        f"{i},{i % 7},{'yes' if i % 3 else 'no'}\n".encode() for i in range(60)))
    linnerud = _upload(client, "linnerud.csv", _linnerud_csv())
    people = _upload(client, "census.csv", census(3000, seed=1))
    wide, joined = _tags_csvs()
    tag_columns, tag_names = _upload(client, "tags_wide.csv", wide), _upload(client, "tags.csv", joined)
    module = client.post("/v1/modules", files={"file": ("wide_and_deep.py", WIDE_AND_DEEP)})
    assert module.status_code == 201, module.text
    cpu = {"accelerator": {"type": "cpu"}, "strategy": "default"}
    return {
        "regression_user_model": {**cpu, "task": "regression", "precision": "mixed_bfloat16",
                                  "dataset": {"source": diabetes, "options": {"label_column": "target"}},
                                  "model": {"module": module.json()["module"]},
                                  "training": {"epochs": 15, "global_batch_size": 32, "learning_rate": 0.005,
                                               "loss": "huber", "metrics": ["r2", "mape"]}},
        "regression": {**cpu, "task": "regression", "dataset": {"source": diabetes, "options": {"label_column": "target"}},
                       "model": {"name": "mlp", "params": {"hidden_units": [32], "dropout": 0.1}},
                       "training": {"epochs": 60, "global_batch_size": 32, "learning_rate": 0.005,
                                    "early_stopping": {"monitor": "val_r2", "patience": 3, "min_delta": 0.005}}},
        "multilabel_columns": {**cpu, "task": "multilabel", "strategy": "mirrored", "accelerator": {"type": "cpu", "replicas": 2},
                               "dataset": {"source": tag_columns, "options": {"label_column": ["urgent", "billing", "outage"]}},
                               "model": {"name": "mlp"}, "training": {"epochs": 20, "global_batch_size": 32,
                                                                      "learning_rate": 0.01},
                               "export": {"tflite": {"quantization": "dynamic"}}},
        "multilabel_names": {**cpu, "task": "multilabel", "dataset": {"source": tag_names, "options": {
            "label_column": "tags", "label_separator": "|"}}, "model": {"name": "mlp"},
            "training": {"epochs": 12, "global_batch_size": 32, "learning_rate": 0.01}},
        "three_targets": {**cpu, "task": "regression", "dataset": {"source": linnerud, "options": {
            "delimiter": " ", "label_column": ["Weight", "Waist", "Pulse"], "validation_split": 0.2}},
            "model": {"name": "mlp", "params": {"hidden_units": [8]}},
            "training": {"epochs": 5, "global_batch_size": 4, "learning_rate": 0.01}},
        "regression_as_classes": {**cpu, "dataset": {"source": diabetes, "options": {"label_column": "target"}},
                                  "model": {"name": "mlp"}},
        "binary": {**cpu, "task": "binary", "precision": "float32",
                   "dataset": {"source": cancer, "options": {"skip_rows": 1, "header": "none", "label_column": -1}},
                   "model": {"name": "mlp", "params": {"hidden_units": [32]}},
                   "training": {"epochs": 30, "global_batch_size": 32, "learning_rate": 0.003, "class_weight": "balanced"},
                   "export": {"tflite": {"quantization": "dynamic"}}},
        "weighted_unknown_label": {**cpu, "dataset": {"source": cancer, "options": {
            "skip_rows": 1, "header": "none", "label_column": -1}}, "model": {"name": "mlp"},
            "training": {"class_weight": {"0": 1.0, "malignant": 2.0}}},
        # Columns of three kinds, the served model fed raw rows: city and notes named, the rest detected.
        "census": {**cpu, "task": "binary", "precision": "mixed_bfloat16",
                   "dataset": {"source": people, "options": {"label_column": "income", "positive_label": ">50K",
                                                              "na_policy": "fill",
                                                              "columns": {"city": "categorical", "notes": "text"}}},
                   "model": {"name": "mlp", "params": {"hidden_units": [32], "dropout": 0.1}},
                   "training": {"epochs": 12, "global_batch_size": 64, "learning_rate": 0.003,
                                "metrics": ["accuracy", "auc", "pr_auc"]},
                   "export": {"tflite": {"quantization": "dynamic"}}},
        "binary_text_without_positive": {**cpu, "task": "binary", "dataset": {"source": yes_no}, "model": {"name": "mlp"}},
    }


Jobs = ModuleJobs


@pytest.fixture(scope="module")
def jobs(database_url: str, api_url: str, gcs_emulator: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    with module_jobs(database_url, api_url, "tasks") as (client, _, _):
        ids = submit_all(client, _specs(client))
        with local_stack_running(database_url, tmp_path_factory.mktemp("stack")):
            yield client, ids


_done = finished


def _split(job_id: str, split: str, into: Path) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """A staged split as arrays, read with TensorFlow the way the manifest says."""
    import tensorflow as tf

    uri = storage.read_json(JobPaths.for_job(job_id).spec)["dataset_uri"]
    manifest = storage.read_json(dataset_manifest(uri))
    files = []
    for shard in manifest["splits"][split]["shards"]:
        local = into / split / Path(shard).name
        local.parent.mkdir(parents=True, exist_ok=True)
        storage.blob(dataset_file(uri, shard)).download_to_filename(str(local))
        files.append(str(local))
    label = manifest["label"]
    y_feature = (tf.io.FixedLenFeature(label["shape"], tf.float32) if label["dtype"] == "float32"
                 else tf.io.FixedLenFeature([], tf.int64))
    spec = {"x": tf.io.FixedLenFeature([int(np.prod(manifest["feature"]["shape"]))], tf.float32), "y": y_feature}
    xs, ys = [], []
    for record in tf.data.TFRecordDataset(files):
        ex = tf.io.parse_single_example(record, spec)
        xs.append(ex["x"].numpy())
        ys.append(ex["y"].numpy())
    return np.stack(xs), np.array(ys), manifest


def _served(jobs: Jobs, name: str, into: Path) -> Any:
    import tensorflow as tf

    from trainjobs.client.api import Client

    client, ids = jobs
    Client(api_url=str(client.base_url), api_key=client.headers["authorization"].split()[1]).download_artifacts(
        ids[name], into)
    return tf.saved_model.load(str(into / "saved_model"))


def test_a_regression_on_the_diabetes_csv_predicts_held_out_patients_in_the_targets_units(
        jobs: Jobs, tmp_path: Path) -> None:
    import tensorflow as tf
    from sklearn.linear_model import LinearRegression
    from sklearn.metrics import r2_score

    job = _done(jobs, "regression")
    assert job["status"] == "SUCCEEDED", job.get("error")
    client, ids = jobs
    history = client.get(f"/v1/jobs/{ids['regression']}/metrics").json()["epochs"]
    assert {"loss", "mae", "rmse", "r2", "val_loss", "val_mae", "val_rmse", "val_r2"} <= set(history[-1])
    x_train, y_train, manifest = _split(ids["regression"], "train", tmp_path)
    x_val, y_val, _ = _split(ids["regression"], "validation", tmp_path)
    assert manifest["task"] == "regression" and manifest["label"]["names"] == ["target"]
    served = _served(jobs, "regression", tmp_path / "download")  # kept: its functions need its variables
    predicted = served.serve(tf.constant(x_val)).numpy()
    ours = r2_score(y_val[:, 0], predicted[:, 0])
    reference = r2_score(y_val[:, 0], LinearRegression().fit(x_train, y_train[:, 0]).predict(x_val))
    print(f"diabetes, validation R²: trainjobs mlp {ours:.3f}, scikit-learn LinearRegression {reference:.3f}")
    assert ours >= 0.40, (ours, reference)
    assert 25 <= float(np.median(predicted)) <= 346  # the data's units, not a standardised score
    final = client.get(f"/v1/jobs/{ids['regression']}").json()["metrics"]
    assert final["saved_model_r2"] == pytest.approx(ours, abs=0.02)

    # The README's example, as written, against this download and the CSV that was uploaded.
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("Predicting with a downloaded regression model:", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "diabetes.csv").write_bytes(_diabetes_csv())
    shown = _run_example(block, tmp_path)["predictions"]
    assert shown.shape == (5, 1) and 25 <= float(np.median(shown)) <= 346, shown


def _run_example(block: str, where: Path) -> dict[str, Any]:
    """A README example run in `where` (its download/ and data file); it must print something."""
    import contextlib
    import io
    import os

    here, printed = os.getcwd(), io.StringIO()
    os.chdir(where)
    try:
        with contextlib.redirect_stdout(printed):
            scope: dict[str, Any] = {}
            exec(compile(block, "README.md", "exec"), scope)  # noqa: S102 - our own README's example
    finally:
        os.chdir(here)
    assert printed.getvalue().strip()
    return scope


def test_a_regression_target_staged_as_classes_fails_at_staging_with_the_task_to_choose(jobs: Jobs) -> None:
    job = _done(jobs, "regression_as_classes")
    assert job["status"] == "FAILED"
    assert "looks continuous" in job["error"] and "did you mean task: regression?" in job["error"], job["error"]
    client, ids = jobs
    events = client.get(f"/v1/jobs/{ids['regression_as_classes']}/events").json()["events"]
    assert "PROVISIONING" not in {e["to_status"] for e in events}


def test_breast_cancer_as_a_binary_task_scores_an_auc_of_098_from_its_saved_model_and_its_tflite(
        jobs: Jobs, tmp_path: Path) -> None:
    import tensorflow as tf
    from sklearn.metrics import roc_auc_score

    job = _done(jobs, "binary")
    assert job["status"] == "SUCCEEDED", job.get("error")
    x_val, y_val, manifest = _split(jobs[1]["binary"], "validation", tmp_path)
    assert manifest["class_names"] == ["0", "1"] and set(y_val) == {0, 1}
    served = _served(jobs, "binary", tmp_path / "download")
    probability = served.serve(tf.constant(x_val)).numpy()
    assert probability.shape == (len(y_val), 1)
    auc = roc_auc_score(y_val, probability[:, 0])
    assert auc >= 0.98, auc
    classified = served.classify(tf.constant(x_val[:5]))
    assert [int(i) for i in classified["class_id"]] == [int(p > 0.5) for p in probability[:5, 0]]
    final = job["metrics"]
    assert {"val_auc", "val_precision", "val_recall"} <= set(final)  # the task's metrics, by default
    assert final["saved_model_auc"] == pytest.approx(auc, abs=0.01)
    assert final["tflite_auc"] == pytest.approx(auc, abs=0.02)  # the TFLite model, scored the same way


def test_binary_text_labels_need_the_positive_one_named(jobs: Jobs) -> None:
    job = _done(jobs, "binary_text_without_positive")
    assert job["status"] == "FAILED"
    assert "name the positive one with dataset.options.positive_label" in job["error"], job["error"]


def test_a_users_build_model_that_takes_the_task_trains_a_regression_in_bfloat16(jobs: Jobs, tmp_path: Path) -> None:
    import tensorflow as tf
    from sklearn.metrics import r2_score

    job = _done(jobs, "regression_user_model")
    assert job["status"] == "SUCCEEDED", job.get("error")
    assert job["runtime"]["precision"] == "mixed_bfloat16"
    x_val, y_val, _ = _split(jobs[1]["regression_user_model"], "validation", tmp_path)
    served = _served(jobs, "regression_user_model", tmp_path / "download")
    ours = r2_score(y_val[:, 0], served.serve(tf.constant(x_val)).numpy()[:, 0])
    assert ours >= 0.35
    # training.metrics: r2 and mape, in the target's units, and none of the task's others.
    history = jobs[0].get(f"/v1/jobs/{jobs[1]['regression_user_model']}/metrics").json()["epochs"]
    assert {"r2", "mape", "val_r2", "val_mape"} <= set(history[-1]) and "val_mae" not in history[-1], history[-1]
    assert 5 < history[-1]["val_mape"] < 100  # percent of a target of 25 to 346, not of a standardised one
    assert job["metrics"]["val_r2"] == pytest.approx(ours, abs=0.05)


def test_early_stopping_ends_a_job_whose_validation_r2_stops_improving_and_keeps_its_best_epoch(
        jobs: Jobs, tmp_path: Path) -> None:
    import tensorflow as tf
    from sklearn.metrics import r2_score

    job = _done(jobs, "regression")  # its model is judged above
    assert job["status"] == "SUCCEEDED", job.get("error")
    client, ids = jobs
    history = client.get(f"/v1/jobs/{ids['regression']}/metrics").json()["epochs"]
    final = json.loads(client.get(f"/v1/jobs/{ids['regression']}/artifacts/metrics.json").content)
    assert final["stopped_at_epoch"] == len(history) < 60, final
    best: dict[str, Any] = {"val_r2": float("-inf")}
    for entry in history:  # Keras' rule: an improvement beats the best so far by more than min_delta
        if entry["val_r2"] - 0.005 > best["val_r2"]:
            best = entry
    assert final["best_epoch"] == best["epoch"] and final["stopped_at_epoch"] == best["epoch"] + 3, (final, history)
    assert final["early_stopping"].startswith("val_r2 did not improve by more than 0.005 for 3 epochs; best")
    # restore_best: the exported model is the best epoch's, so it scores that epoch's val_r2.
    x_val, y_val, _ = _split(ids["regression"], "validation", tmp_path)
    served = _served(jobs, "regression", tmp_path / "download")
    assert r2_score(y_val[:, 0], served.serve(tf.constant(x_val)).numpy()[:, 0]) == pytest.approx(best["val_r2"], abs=0.01)


def test_balanced_class_weights_come_from_the_training_split_and_an_unknown_label_fails_at_staging(
        jobs: Jobs, tmp_path: Path) -> None:
    job = _done(jobs, "binary")  # its AUC is judged above
    assert job["status"] == "SUCCEEDED", job.get("error")
    client, ids = jobs
    _, y_train, _ = _split(ids["binary"], "train", tmp_path)
    counts = np.bincount(y_train)
    final = json.loads(client.get(f"/v1/jobs/{ids['binary']}/artifacts/metrics.json").content)
    assert final["class_weight"] == pytest.approx({"0": len(y_train) / (2 * counts[0]), "1": len(y_train) / (2 * counts[1])})

    refused = _done(jobs, "weighted_unknown_label")
    assert refused["status"] == "FAILED"
    assert "training.class_weight names 1 label(s) the data does not have (first: 'malignant')" in refused["error"]


@pytest.mark.parametrize("name", ["multilabel_columns", "multilabel_names"])
def test_a_multilabel_task_from_tag_columns_or_joined_names_predicts_each_tag(jobs: Jobs, tmp_path: Path, name: str) -> None:
    import tensorflow as tf
    from sklearn.metrics import f1_score

    job = _done(jobs, name)
    assert job["status"] == "SUCCEEDED", job.get("error")
    client, ids = jobs
    x_val, y_val, manifest = _split(ids[name], "validation", tmp_path)
    names = ["urgent", "billing", "outage"] if name == "multilabel_columns" else ["billing", "outage", "urgent"]  # sorted
    assert manifest["task"] == "multilabel" and manifest["class_names"] == names and y_val.shape[1] == 3
    labels = json.loads(client.get(f"/v1/jobs/{ids[name]}/artifacts/labels.json").content)
    assert labels["class_names"] == names
    served = _served(jobs, name, tmp_path / "download")
    probabilities = served.serve(tf.constant(x_val)).numpy()
    micro = f1_score(y_val, probabilities > 0.5, average="micro")
    assert micro >= 0.85, micro
    assert [list(r) for r in served.classify(tf.constant(x_val[:4]))["labels"].numpy()] == \
        [list((p > 0.5).astype(int)) for p in probabilities[:4]]
    final = json.loads(client.get(f"/v1/jobs/{ids[name]}/artifacts/metrics.json").content)
    assert final["saved_model_f1_micro"] == pytest.approx(micro, abs=0.01)
    assert final["saved_model_f1_macro"] == pytest.approx(f1_score(y_val, probabilities > 0.5, average="macro"), abs=0.01)
    if name == "multilabel_columns":
        assert final["tflite_f1_micro"] == pytest.approx(micro, abs=0.03)


def test_a_regression_of_three_targets_answers_each_in_its_own_units(jobs: Jobs, tmp_path: Path) -> None:
    """linnerud (20 men): too few for a good model, enough to show three targets staged, trained and served
    in their units (weight in pounds, waist in inches, pulse per minute)."""
    import tensorflow as tf

    job = _done(jobs, "three_targets")
    assert job["status"] == "SUCCEEDED", job.get("error")
    client, ids = jobs
    x_train, y_train, manifest = _split(ids["three_targets"], "train", tmp_path)
    assert manifest["label"]["names"] == ["Weight", "Waist", "Pulse"] and y_train.shape == (16, 3)
    assert manifest["label"]["mean"] == pytest.approx(list(y_train.mean(axis=0)), rel=1e-5)
    served = _served(jobs, "three_targets", tmp_path / "download")
    predicted = served.serve(tf.constant(x_train)).numpy()
    assert predicted.shape == (16, 3)
    # Each column near its own target's scale: a standardised answer would sit near 0 for all three.
    assert np.all(np.abs(predicted.mean(axis=0) - y_train.mean(axis=0)) < 2 * y_train.std(axis=0)), predicted.mean(axis=0)
    labels = json.loads(client.get(f"/v1/jobs/{ids['three_targets']}/artifacts/labels.json").content)
    assert labels["targets"] == ["Weight", "Waist", "Pulse"]


def test_a_census_table_of_numbers_categories_and_text_is_served_from_raw_rows(jobs: Jobs, tmp_path: Path) -> None:
    """Rows the job never saw, drawn from the same population, fed to the downloaded SavedModel as
    their cells (strings and numbers by column name), a city it never saw among them."""
    import tensorflow as tf
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    job = _done(jobs, "census")
    assert job["status"] == "SUCCEEDED", job.get("error")
    assert job["runtime"]["dataset"]["columns"] == {
        "age": "numeric", "workclass": "categorical", "education": "categorical", "city": "categorical",
        "hours-per-week": "numeric", "native country": "categorical", "notes": "text"}
    served = _served(jobs, "census", tmp_path / "download")
    labels = json.loads((tmp_path / "download" / "labels.json").read_text())
    inputs = {i["column"]: i for i in labels["inputs"]}
    assert inputs["native country"]["name"] == "native_country" and inputs["hours-per-week"]["name"] == "hours_per_week"
    assert inputs["age"]["dtype"] == "float32" and inputs["notes"]["dtype"] == "string"
    assert "City00" in inputs["city"]["vocabulary"] and "promoted" in inputs["notes"]["vocabulary"]
    signature = served.signatures["serving_default"].structured_input_signature[1]
    assert {k: v.dtype for k, v in signature.items()} == {i["name"]: tf.as_dtype(i["dtype"]) for i in labels["inputs"]}

    held_out = rows(1000, seed=2)
    held_out[0][3], held_out[1][6] = "Atlantis", ""  # a city never seen, a row without notes
    cells = list(zip(*held_out, strict=True))
    feed = {inputs[name]["name"]: tf.constant(np.asarray(column, np.float32) if inputs[name]["dtype"] == "float32"
                                              else list(column))
            for name, column in zip(["age", "workclass", "education", "city", "hours-per-week", "native country",
                                     "notes"], cells, strict=False)}
    truth = np.array([r[-1] == ">50K" for r in held_out])
    probability = served.serve(feed).numpy()[:, 0]
    auc = roc_auc_score(truth, probability)
    numbers = np.array([[float(r[0]), float(r[4])] for r in held_out])
    train_rows = rows(3000, seed=1)
    baseline = LogisticRegression().fit(np.array([[float(r[0]), float(r[4])] for r in train_rows]),
                                        [r[-1] == ">50K" for r in train_rows])
    numbers_only = roc_auc_score(truth, baseline.predict_proba(numbers)[:, 1])
    print(f"census, held-out AUC: trainjobs mlp on raw rows {auc:.3f}, numeric columns only {numbers_only:.3f}")
    assert auc >= 0.90 and auc > numbers_only + 0.1, (auc, numbers_only)
    classified = served.classify(feed)
    assert set(classified["class_name"].numpy().tolist()) == {b">50K", b"<=50K"}
    final = jobs[0].get(f"/v1/jobs/{jobs[1]['census']}").json()["metrics"]
    assert 0.8 < final["val_pr_auc"] <= 1 and "val_precision" not in final  # training.metrics chose them
    assert final["saved_model_auc"] >= 0.88 and final["tflite_auc"] == pytest.approx(final["saved_model_auc"], abs=0.02)

    # The README's example, as written, against this download and rows of the CSV that was uploaded.
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("Predicting from raw rows:", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "census.csv").write_bytes(census(3000, seed=1))
    scope = _run_example(block, tmp_path)
    shown = scope["probabilities"]
    assert shown.shape == (5, 1) and ((shown >= 0) & (shown <= 1)).all(), shown
