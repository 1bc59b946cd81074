"""An agent run as the worker and staging would set it up, without them: a staged dataset, a job
directory, and `python -m agent` in its own process with TRAINJOBS_LOCAL_DEVICES=2, exactly as the local
provisioner starts it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tests.support import eventually, scaled
from trainjobs import storage
from trainjobs.job_paths import DATASET_SHARDS, JobPaths, dataset_file, dataset_manifest, dataset_uri
from trainjobs.spec import JobSpec

REPO = Path(__file__).resolve().parents[2]
AGENT_S = 240  # how long one agent run may take, before scaling
AGENT_TIMEOUT_S = scaled(AGENT_S)


def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    # Shuffled: sklearn orders digits by writer, and the last writers are unlike the first.
    order = np.random.default_rng(0).permutation(len(d.target))
    return d.data[order].reshape(-1, 8, 8, 1).astype(np.float32), d.target[order].astype(np.int64)


def write_dataset(bucket: str, tmp: Path, x: np.ndarray, y: np.ndarray, num_classes: int, val: int, shards: int = 2,
                  task: str = "classification", strings: np.ndarray | None = None,
                  columns: list[dict[str, Any]] | None = None) -> str:
    """Write manifest + TFRecord shards the way staging does; return the dataset URI. A regression's y
    are float targets (num_classes is ignored), with the training split's mean and std. `strings` [n, k]
    and `columns` (the manifest's feature.columns, vocabularies included) make it a CSV's named columns."""
    import tensorflow as tf

    sha = uuid.uuid4().hex * 2
    uri = dataset_uri(sha, bucket)
    splits = {"train": (x[:-val], y[:-val], np.arange(len(y))[:-val]),
              "validation": (x[-val:], y[-val:], np.arange(len(y))[-val:])}
    regression = task == "regression"
    label: dict[str, Any] = {"key": "y", "dtype": "int64"}
    if regression:
        label = {"key": "y", "dtype": "float32", "shape": [1], "names": ["target"],
                 "mean": [float(np.mean(y[:-val]))], "std": [float(np.std(y[:-val]))]}
    manifest: dict[str, Any] = {
        "format_version": 1, "sha256": sha, "task": task, "num_classes": 0 if regression else num_classes,
        "class_names": [] if regression else [str(i) for i in range(num_classes)],
        "feature": {"key": "x", "shape": list(x.shape[1:]), "dtype": "float32",
                    **({"strings_key": "xs", "columns": columns} if columns else {})},
        "label": label, "splits": {},
    }
    for name, (xs, ys, at) in splits.items():
        n = shards if name == "train" else 1
        paths = [f"{DATASET_SHARDS}/{name}-{i:05d}-of-{n:05d}.tfrecord" for i in range(n)]
        for i, rel in enumerate(paths):
            local = tmp / rel
            local.parent.mkdir(parents=True, exist_ok=True)
            with tf.io.TFRecordWriter(str(local)) as w:
                for xi, yi, row in zip(xs[i::n], ys[i::n], at[i::n]):
                    feature = {
                        "x": tf.train.Feature(float_list=tf.train.FloatList(value=xi.ravel())),
                        "y": (tf.train.Feature(float_list=tf.train.FloatList(value=[float(yi)])) if regression
                              else tf.train.Feature(int64_list=tf.train.Int64List(value=[int(yi)]))),
                    }
                    if strings is not None:
                        feature["xs"] = tf.train.Feature(bytes_list=tf.train.BytesList(
                            value=[str(v).encode() for v in strings[row]]))
                    w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
            storage.blob(dataset_file(uri, rel)).upload_from_filename(str(local))
        manifest["splits"][name] = {"examples": len(ys), "shards": paths}
    storage.write_json(dataset_manifest(uri), manifest)
    return uri


def make_job(bucket: str, spec: dict[str, Any], dataset_uri: str, attempt: int = 1, job_id: str | None = None) -> str:
    job_id = job_id or str(uuid.uuid4())
    paths = JobPaths.for_job(job_id, bucket)
    validated = JobSpec.model_validate(spec)
    storage.write_json(paths.spec, {"job_id": job_id, "attempt": attempt, "spec": validated.model_dump(mode="json"),
                                    "dataset_uri": dataset_uri})
    return paths.root


def agent_env() -> dict[str, str]:
    return {**os.environ, "TRAINJOBS_LOCAL_DEVICES": "2", "TRAINJOBS_HEARTBEAT_S": "1", "PYTHONPATH": str(REPO)}


def start_agent(job_dir: str, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "agent", "--job-dir", job_dir], cwd=REPO,
                            env={**agent_env(), **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def run_agent(job_dir: str) -> tuple[int, str]:
    proc = start_agent(job_dir)
    out, _ = proc.communicate(timeout=AGENT_TIMEOUT_S)
    return proc.returncode, out.decode(errors="replace")


def read(uri: str) -> Any:
    """A JSON object the agent wrote (None if it has not): `uri` is one of its job's JobPaths."""
    return storage.read_json(uri)


def wait_for(predicate: Callable[[], Any], proc: subprocess.Popen[bytes], timeout: float = AGENT_S) -> None:
    """Until `predicate()` holds, the agent process still running."""

    def seen() -> Any:
        assert proc.poll() is None, f"agent exited ({proc.returncode}) before the awaited moment"
        return predicate()

    eventually(seen, timeout, "the awaited moment of the agent", every=0.1)


def spec(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "digits",
        "accelerator": {"type": "cpu", "replicas": 2},
        "dataset": {"source": "sklearn:digits"},
        "model": {"name": "mlp"},
        "training": {"epochs": 2, "per_replica_batch_size": 32, "learning_rate": 0.003},
    }
    return {**base, **overrides}


def train_on_two_workers(job_dir: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two agents of one job, one CPU device each, under TF_CONFIG as a multi-worker machine starts them;
    their last statuses (chief, the other) once both have exited 0."""
    from trainjobs.loopback import free_port

    cluster = {"worker": [f"localhost:{free_port()}", f"localhost:{free_port()}"]}
    procs = [start_agent(job_dir, TRAINJOBS_LOCAL_DEVICES="1",
                         TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}))
             for i in range(2)]
    outs = [p.communicate(timeout=AGENT_TIMEOUT_S)[0].decode(errors="replace") for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    return read(JobPaths(job_dir).status), read(JobPaths(job_dir).status_of(1))
