"""Models beyond the built-ins: keras.applications names are checked at submit; user code uploaded
through the API trains, and broken user code fails the job with its own message."""

from __future__ import annotations

import pytest

from tests.support.jobs import digits_spec
from tests.support.jobs import wait_for_job
from tests.support.local import AGENT_JOB_S
from trainjobs.model_params import application_params
from trainjobs.spec import KERAS_APPLICATIONS

pytestmark = pytest.mark.tf

GOOD = b'''
import keras

def build_model(input_shape, num_classes, params):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                             keras.layers.Dense(params.get("units", 16), activation="relu"),
                             keras.layers.Dense(num_classes, activation="softmax")])
'''
NOT_A_MODEL = b"def build_model(input_shape, num_classes, params):\n    return {'layers': 3}\n"
BROKEN_IMPORT = b"import tensorflow_nonexistent_addon\n\ndef build_model(input_shape, num_classes, params):\n    pass\n"


def test_keras_applications_list_matches_the_pinned_keras():
    import keras

    available = {n for n in dir(keras.applications) if n[0].isupper() and callable(getattr(keras.applications, n))}
    assert set(KERAS_APPLICATIONS) == available


# Constructor keywords the agent sets itself or that do nothing without the top it leaves off; MobileNet's
# own `dropout` is replaced by ours (before the classification head).
NOT_THE_USERS = {"include_top", "weights", "input_tensor", "input_shape", "pooling", "classes",
                 "classifier_activation", "name", "dropout_rate", "dropout"}


@pytest.mark.parametrize("name", KERAS_APPLICATIONS)
def test_the_params_table_names_what_each_keras_application_takes(name):
    import inspect

    import keras

    keywords = set(inspect.signature(getattr(keras.applications, name)).parameters) - NOT_THE_USERS
    assert set(application_params(name)) - {"dropout"} == keywords


def test_unknown_architecture_is_rejected_at_submit(api):
    r = api.post("/v1/jobs", json=digits_spec(model={"name": "ResNet9000"}))
    assert r.status_code == 422
    assert any(d["field"] == "model.name" and "unknown model" in d["reason"] for d in r.json()["error"]["details"])


def _submit_with_module(api, code: bytes, **overrides):
    module = api.post("/v1/modules", files={"file": ("my_model.py", code)}).json()["module"]
    spec = digits_spec(model={"module": module, "params": {"units": 24}}, strategy="default",
                       accelerator={"type": "cpu"}, training={"epochs": 4, "learning_rate": 0.01}, **overrides)
    return api.post("/v1/jobs", json=spec).json()


def test_uploaded_user_model_trains(api, local_stack):
    job = wait_for_job(api, _submit_with_module(api, GOOD)["id"], {"SUCCEEDED"}, timeout=AGENT_JOB_S)
    assert job["metrics"]["val_accuracy"] > 0.5


@pytest.mark.parametrize("code,message", [
    (NOT_A_MODEL, "returned dict, not a keras.Model"),
    (BROKEN_IMPORT, "could not import model module"),
], ids=["wrong return type", "import error"])
def test_broken_user_model_fails_the_job_with_its_message(api, local_stack, code, message):
    job = wait_for_job(api, _submit_with_module(api, code)["id"], {"FAILED"}, timeout=AGENT_JOB_S)
    assert message in job["error"]


def test_a_users_csv_and_model_hand_back_class_names_and_an_integer_tflite(api, local_stack, tmp_path, monkeypatch):
    """scikit-learn's wine_data.csv as it ships (a summary first line, no header, the class last), the
    user's build_model(input_shape, num_classes, params), and a uint8-in, uint8-out TFLite model."""
    import shutil
    from pathlib import Path

    import sklearn

    from trainjobs import storage
    from trainjobs.job_paths import ARTIFACT_HISTORY, JobPaths
    from trainjobs.source_rules import HOST_DATA_DIRS_ENV

    shutil.copy(Path(sklearn.__file__).parent / "datasets" / "data" / "wine_data.csv", tmp_path / "wine_data.csv")
    monkeypatch.setenv(HOST_DATA_DIRS_ENV, str(tmp_path))
    module = api.post("/v1/modules", files={"file": ("my_model.py", GOOD)}).json()["module"]
    spec = digits_spec(
        dataset={"source": str(tmp_path / "wine_data.csv"),
                 "options": {"skip_rows": 1, "header": "none", "label_column": -1}},
        model={"module": module, "params": {"units": 16}}, strategy="default", accelerator={"type": "cpu"},
        training={"epochs": 2, "per_replica_batch_size": 16}, steps_per_execution=3,
        export={"tflite": {"quantization": "int8", "io_type": "uint8", "calibration_examples": 64}})
    job = wait_for_job(api, api.post("/v1/jobs", json=spec).json()["id"], {"SUCCEEDED"}, timeout=AGENT_JOB_S)

    dataset = job["runtime"]["dataset"]
    assert (dataset["train_examples"], dataset["feature_shape"], dataset["class_names"]) == (142, [13], ["0", "1", "2"])
    assert job["runtime"]["steps_per_epoch"] == 142 // 16
    paths = JobPaths.for_job(job["id"])
    history = storage.read_json(paths.artifact(ARTIFACT_HISTORY))
    assert [(e["steps"], e["executions"]) for e in history] == [(8, 3), (8, 3)]  # calls of 3, 3 and 2 steps
    assert storage.read_json(paths.artifact("labels.json"))["label_mapping"] == {"0": "0", "1": "1", "2": "2"}
    final = storage.read_json(paths.final_metrics)
    assert final["tflite_io_type"] == "uint8" and final["tflite_accuracy"] is not None
