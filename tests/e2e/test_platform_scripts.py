"""Scripts written for SageMaker and Vertex AI run unchanged (issue 37), through the whole product (API,
worker, staging, the local provisioner's machines, the agent) and judged from what comes back through the
API: the downloaded model scored here on rows its job never trained on.

- AWS's custom-loop TensorFlow example (tests/programs/aws_custom_loop_train.py, verbatim) reads MNIST's
  IDX files from its two channels, SM_CHANNEL_TRAINING and SM_CHANNEL_TESTING, its hyperparameters as
  `--name value` arguments, SM_HOSTS and SM_CURRENT_HOST; written for TensorFlow 2.3 (Keras 2). Its files
  are scikit-learn's digits written in MNIST's format, each channel a local folder sent as `trainjobs
  submit` sends one.
- AWS's script-mode example (tests/programs/mnist-2.py, verbatim) reads its four .npy files from
  SM_CHANNEL_TRAINING, SM_HOSTS and SM_CURRENT_HOST, and saves with `model.save(dir)`, which only Keras 2
  makes a SavedModel (`program.keras: 2`). Its files are the same digits as MNIST's arrays were in its
  notebook's data: 784 float32 pixels in [0, 1] a row, int32 labels.
- Google's own Vertex AI custom-training test script (tests/programs/california_housing_training_script.py,
  verbatim) reads CSV splits from AIP_TRAINING_DATA_URI, AIP_VALIDATION_DATA_URI and AIP_TEST_DATA_URI as
  wildcard paths and saves a SavedModel to AIP_MODEL_DIR; written for TensorFlow 2.2 (tf.feature_column,
  Keras 2), with pandas. The three splits come from the three kinds of channel source: a folder of a bucket
  the operator lists, an upload, a host path.
- A probe of our own reads every name on two workers, for the shapes a script depends on.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import math
import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support.jobs import ModuleJobs, finished, module_jobs, submit_all
from tests.support.local import local_stack_running
from trainjobs.client.local_paths import pack_channel

pytestmark = pytest.mark.tf

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
SOURCE_BUCKET = "vertex-user-data"  # the user's own bucket, which the operator lists
HELD_OUT = 300  # of the 1,797 digits, the testing channel

# Reads what a SageMaker or Vertex AI script reads and writes it where the job's artifacts come from.
PROBE = '''
import hashlib
import json
import os
import sys
from pathlib import Path

names = {k: v for k, v in os.environ.items() if k.startswith(("SM_", "AIP_", "CLOUD_ML_")) or k in (
    "CLUSTER_SPEC", "TF_CONFIG")}
channels = {}
for name in json.loads(os.environ["SM_CHANNELS"]):
    folder = Path(os.environ["SM_CHANNEL_" + name.upper()])
    channels[name] = {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                      for p in sorted(folder.rglob("*")) if p.is_file()}
config = {p.name: json.loads(p.read_text()) for p in Path(os.environ["SM_INPUT_CONFIG_DIR"]).glob("*.json")}
seen = {"argv": sys.argv[1:], "names": names, "channels": channels, "config": config}
Path(os.environ["SM_OUTPUT_DATA_DIR"], "seen-by-" + os.environ["SM_CURRENT_HOST"] + ".json").write_text(json.dumps(seen))
if os.environ["SM_CURRENT_HOST"] == "algo-1":
    Path(os.environ["SM_MODEL_DIR"], "seen.json").write_text(json.dumps(seen))
'''


def _upload(client: httpx.Client, name: str, data: bytes) -> str:
    r = client.post("/v1/modules", files={"file": (name, data)})
    assert r.status_code == 201, r.text
    return str(r.json()["module"])


def _upload_channel(client: httpx.Client, folder: Path) -> str:
    """As `trainjobs submit` sends a local folder named as a channel's source."""
    packed = pack_channel(folder, folder.parent / f"{folder.name}.tar.gz")
    r = client.post("/v1/datasets", files={"file": ("channel.tar.gz", packed.read_bytes())})
    assert r.status_code == 201, r.text
    return str(r.json()["dataset"])


def _digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as MNIST's 28x28 bytes: each 8x8 pixel a 3x3 block, a 2-pixel border."""
    from sklearn.datasets import load_digits

    d = load_digits()
    order = np.random.default_rng(0).permutation(len(d.target))
    images = np.pad(np.kron(d.images[order], np.ones((3, 3))), ((0, 0), (2, 2), (2, 2)))
    return np.round(images * 255 / 16).astype(np.uint8), d.target[order].astype(np.uint8)


def _idx(folder: Path, prefix: str, images: np.ndarray, labels: np.ndarray) -> None:
    """MNIST's files (yann.lecun.com/exdb/mnist: big-endian magic 2051/2049, counts, then the bytes)."""
    folder.mkdir(parents=True)
    with gzip.open(folder / f"{prefix}-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">IIII", 2051, len(images), 28, 28) + images.tobytes())
    with gzip.open(folder / f"{prefix}-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">II", 2049, len(labels)) + labels.tobytes())


def _mnist_2_arrays(folder: Path) -> None:
    """The four files mnist-2.py loads, as its notebook's MNIST data has them; eval_* are the held-out digits."""
    images, labels = _digits()
    x, y = (images.reshape(len(images), 784) / 255).astype(np.float32), labels.astype(np.int32)
    folder.mkdir(parents=True)
    for name, array in (("train_data", x[:-HELD_OUT]), ("train_labels", y[:-HELD_OUT]),
                        ("eval_data", x[-HELD_OUT:]), ("eval_labels", y[-HELD_OUT:])):
        np.save(folder / f"{name}.npy", array)


def _diabetes_splits() -> dict[str, list[list[float]]]:
    """scikit-learn's diabetes table (California housing is a download) under the column the Vertex AI
    script predicts, split 80/10/10 as Vertex AI splits a managed dataset by default."""
    from sklearn.datasets import load_diabetes

    d = load_diabetes(scaled=False)
    rows = np.column_stack([d.data, d.target])[np.random.default_rng(0).permutation(len(d.target))].tolist()
    return {"training": rows[:354], "validation": rows[354:398], "test": rows[398:]}


def _csv(rows: list[list[float]]) -> bytes:
    from sklearn.datasets import load_diabetes

    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow([*load_diabetes().feature_names, "median_house_value"])
    writer.writerows(rows)
    return out.getvalue().encode()


def _specs(client: httpx.Client, bucket: str, scratch: Path) -> dict[str, dict[str, Any]]:
    from trainjobs import storage

    images, labels = _digits()
    _idx(scratch / "mnist" / "training", "train", images[:-HELD_OUT], labels[:-HELD_OUT])
    _idx(scratch / "mnist" / "testing", "t10k", images[-HELD_OUT:], labels[-HELD_OUT:])
    _mnist_2_arrays(scratch / "mnist-2")
    splits = _diabetes_splits()
    storage.ensure_bucket(SOURCE_BUCKET)
    half = len(splits["training"]) // 2  # two shards: AIP_TRAINING_DATA_URI is a wildcard over them
    for i, part in enumerate((splits["training"][:half], splits["training"][half:])):
        storage.blob(f"gs://{SOURCE_BUCKET}/diabetes/training/training-{i:05d}-of-00002.csv").upload_from_string(
            _csv(part))
    validation = client.post("/v1/datasets", files={"file": ("validation-00000.csv", _csv(splits["validation"]))})
    assert validation.status_code == 201, validation.text
    (scratch / "host" / "test").mkdir(parents=True)
    (scratch / "host" / "test" / "test-00000.csv").write_bytes(_csv(splits["test"]))
    probe_files = scratch / "probe"
    (probe_files / "nested").mkdir(parents=True)
    (probe_files / "a.npy").write_bytes(b"\x93NUMPY as it is")
    (probe_files / "nested" / "b.bin").write_bytes(bytes(range(256)))
    return {
        # As its notebook (frameworks/tensorflow/get_started_mnist_train.ipynb) runs it: its hyperparameters,
        # batches of 32 and five epochs for 1,497 digits instead of 512 and one for MNIST's 60,000.
        "aws": {"accelerator": {"type": "cpu"}, "program": {
            "source": _upload(client, "train.py", (PROGRAMS / "aws_custom_loop_train.py").read_bytes()), "keras": 2,
            "hyperparameters": {"batch-size": 32, "epochs": 5, "learning-rate": 1e-3, "beta_1": 0.9, "beta_2": 0.999},
            "channels": {"training": _upload_channel(client, scratch / "mnist" / "training"),
                         "testing": _upload_channel(client, scratch / "mnist" / "testing")}}},
        # As its notebook (sagemaker-python-sdk/tensorflow_script_mode_training_and_serving) runs it: no
        # hyperparameters, one epoch.
        "mnist_2": {"accelerator": {"type": "cpu"}, "program": {
            "source": _upload(client, "mnist-2.py", (PROGRAMS / "mnist-2.py").read_bytes()), "keras": 2,
            "channels": {"training": _upload_channel(client, scratch / "mnist-2")}}},
        "vertex": {"accelerator": {"type": "cpu"}, "program": {
            "source": _upload(client, "task.py", (PROGRAMS / "california_housing_training_script.py").read_bytes()),
            "keras": 2, "requirements": ["pandas"],
            "channels": {"training": f"gs://{SOURCE_BUCKET}/diabetes/training/",
                         "validation": str(validation.json()["dataset"]),
                         "test": str(scratch / "host" / "test")}}},
        "probe": {"accelerator": {"type": "cpu"}, "workers": 2, "dataset": {"source": "sklearn:iris"},
                  "program": {"source": _upload(client, "probe.py", PROBE.encode()), "args": ["--verbose", "--lr", "9"],
                              "hyperparameters": {"lr": 0.5, "epochs": 3, "shuffle": True, "optimizer": "adam"},
                              "channels": {"train": _upload_channel(client, probe_files),
                                           "eval": str(probe_files / "a.npy")}}},
    }


@pytest.fixture(scope="module")
def jobs(database_url: str, api_url: str, gcs_emulator: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleJobs]:
    with module_jobs(database_url, api_url, "platform-scripts") as (client, _factory, monkey):
        monkey.setenv("TRAINJOBS_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        scratch = tmp_path_factory.mktemp("platform")
        monkey.setenv("TRAINJOBS_SOURCE_BUCKETS", SOURCE_BUCKET)
        monkey.setenv("TRAINJOBS_HOST_DATA_DIRS", os.pathsep.join([str(scratch / "host"), str(scratch / "probe")]))
        ids = submit_all(client, _specs(client, os.environ["TRAINJOBS_BUCKET"], scratch))
        with local_stack_running(database_url, tmp_path_factory.mktemp("stack")):
            yield client, ids


def _download(jobs: ModuleJobs, name: str, to: Path, keep: Any = lambda path: True) -> dict[str, Path]:
    """The job's artifacts that `keep` names, downloaded under `to`."""
    client, ids = jobs
    listed = [a["path"] for a in client.get(f"/v1/jobs/{ids[name]}/artifacts").json()["artifacts"]]
    got = {}
    for path in filter(keep, listed):
        r = client.get(f"/v1/jobs/{ids[name]}/artifacts/{path}")
        assert r.status_code == 200, r.text
        (to / path).parent.mkdir(parents=True, exist_ok=True)
        (to / path).write_bytes(r.content)
        got[path] = to / path
    return got


def _log(jobs: ModuleJobs, name: str) -> str:
    client, ids = jobs
    return str(client.get(f"/v1/jobs/{ids[name]}/logs").json()["text"])


def test_aws_custom_loop_example_trains_on_its_two_channels_and_its_saved_model_classifies_held_out_digits(
        jobs: ModuleJobs, tmp_path: Path) -> None:
    import tensorflow as tf

    job = finished(jobs, "aws")
    assert job["status"] == "SUCCEEDED", job.get("error")
    # Its hyperparameters reached argparse as --name value: five epochs, each tested on the testing channel.
    log = _log(jobs, "aws")
    assert "Epoch 5, Loss:" in log and "Epoch 6," not in log and "Test Accuracy:" in log, log[-2000:]
    files = _download(jobs, "aws", tmp_path, lambda p: p.startswith("00000000/"))
    assert "00000000/saved_model.pb" in files  # model.save(dir) under Keras 2: a SavedModel, version folder and all
    serve = tf.saved_model.load(str(tmp_path / "00000000")).signatures["serving_default"]
    images, labels = _digits()
    x = images[-HELD_OUT:].astype(np.float32)
    x = (x - x.mean(axis=(1, 2), keepdims=True)) / (x.std(axis=(1, 2), keepdims=True) + np.finfo(float).eps)
    [logits] = serve(tf.constant(x[..., None].astype(np.float32))).values()
    accuracy = float(np.mean(logits.numpy().argmax(axis=-1) == labels[-HELD_OUT:]))
    assert accuracy >= 0.95, accuracy


def test_aws_script_mode_example_runs_with_keras_2_and_its_saved_model_classifies_held_out_digits(
        jobs: ModuleJobs, tmp_path: Path) -> None:
    import tensorflow as tf

    job = finished(jobs, "mnist_2")
    assert job["status"] == "SUCCEEDED", job.get("error")
    files = _download(jobs, "mnist_2", tmp_path, lambda p: p.startswith("000000001/"))
    # model.save(dir) under tf_keras: a SavedModel in the version folder the script names, Keras 2's metadata with it.
    assert {"000000001/saved_model.pb", "000000001/keras_metadata.pb"} <= set(files), sorted(files)
    serve = tf.saved_model.load(str(tmp_path / "000000001")).signatures["serving_default"]
    images, labels = _digits()
    [probabilities] = serve(tf.constant((images[-HELD_OUT:].reshape(HELD_OUT, 784) / 255).astype(np.float32))).values()
    accuracy = float(np.mean(probabilities.numpy().argmax(axis=-1) == labels[-HELD_OUT:]))
    assert accuracy >= 0.9, accuracy  # one epoch over 1,497 digits, as its notebook trains it


def test_googles_vertex_ai_script_reads_its_three_splits_and_its_saved_model_scores_what_it_reported(
        jobs: ModuleJobs, tmp_path: Path) -> None:
    import tensorflow as tf

    job = finished(jobs, "vertex")
    assert job["status"] == "SUCCEEDED", job.get("error")
    _download(jobs, "vertex", tmp_path, lambda p: p == "saved_model.pb" or p.startswith("variables/"))
    serve = tf.saved_model.load(str(tmp_path)).signatures["serving_default"]
    test = np.array(_diabetes_splits()["test"], dtype=np.float32)
    from sklearn.datasets import load_diabetes

    inputs = {name: tf.constant(test[:, i]) for i, name in enumerate(load_diabetes().feature_names)}
    [predicted] = serve(**inputs).values()
    mse = float(np.mean((predicted.numpy()[:, 0] - test[:, -1]) ** 2))
    # The script printed model.evaluate on AIP_TEST_DATA_URI's rows: the same rows, the same model.
    reported = [float(m[1]) for m in re.finditer(r"trainjobs\.program: ([-+0-9.eE]+)$", _log(jobs, "vertex"), re.M)]
    assert reported and math.isclose(reported[-1], mse, rel_tol=1e-3), (reported, mse)
    assert mse < 0.5 * float(np.mean(test[:, -1] ** 2))  # it learned the target's scale (from 0, 10 epochs)


def test_a_probe_on_two_workers_sees_sagemakers_and_vertex_ais_names_in_their_shapes(
        jobs: ModuleJobs, tmp_path: Path) -> None:
    job = finished(jobs, "probe")
    assert job["status"] == "SUCCEEDED", job.get("error")
    client, ids = jobs
    files = _download(jobs, "probe", tmp_path)
    seen = json.loads(files["seen.json"].read_text())
    assert "output/data/seen-by-algo-1.json" in files  # SM_OUTPUT_DATA_DIR is kept with the artifacts
    names = seen["names"]
    # Hyperparameters after the arguments, sorted, as SageMaker passes them; SM_HPS holds both, theirs last.
    assert seen["argv"] == ["--verbose", "--lr", "9", "--epochs", "3", "--lr", "0.5", "--optimizer", "adam",
                            "--shuffle", "True"]
    assert json.loads(names["SM_HPS"]) == {"lr": 0.5, "epochs": 3, "shuffle": True, "optimizer": "adam"}
    assert (names["SM_HP_LR"], names["SM_HP_SHUFFLE"]) == ("0.5", "true")
    assert (names["SM_HOSTS"], names["SM_CURRENT_HOST"]) == ('["algo-1","algo-2"]', "algo-1")
    # The channels' files as they were sent; the staged dataset is SageMaker's default "training" channel.
    assert names["SM_CHANNELS"] == '["eval","train","training"]'
    sha = hashlib.sha256
    assert seen["channels"]["train"] == {"a.npy": sha(b"\x93NUMPY as it is").hexdigest(),
                                         "nested/b.bin": sha(bytes(range(256))).hexdigest()}
    assert seen["channels"]["eval"] == {"a.npy": sha(b"\x93NUMPY as it is").hexdigest()}
    assert "dataset.json" in seen["channels"]["training"]  # the staged dataset, as TRAINJOBS_DATA_DIR holds it
    training_env = json.loads(names["SM_TRAINING_ENV"])
    assert training_env["is_master"] is True and training_env["job_name"] == ids["probe"]
    assert seen["config"]["resourceconfig.json"]["hosts"] == ["algo-1", "algo-2"]
    # Vertex AI's: the job, and the cluster its two workers train in, as TF_CONFIG has it.
    assert names["CLOUD_ML_JOB_ID"] == ids["probe"]
    workers = json.loads(names["TF_CONFIG"])["cluster"]["worker"]
    assert json.loads(names["CLUSTER_SPEC"]) == {"cluster": {"workerpool0": workers[:1], "workerpool1": workers[1:]},
                                                 "environment": "cloud", "task": {"type": "workerpool0", "index": 0}}
    assert names["AIP_MODEL_DIR"] == names["SM_MODEL_DIR"]
