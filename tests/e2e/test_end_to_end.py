"""A real job through the whole product: HTTP -> PostgreSQL -> worker -> dataset in GCS (emulator) ->
local provisioner -> the TensorFlow agent -> metrics, logs and artifacts -> download."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest

from tests.support.jobs import digits_spec
from tests.support.jobs import wait_for_job
from tests.support.local import AGENT_JOB_S
from trainjobs import storage
from trainjobs.job_paths import ARTIFACT_HISTORY, ARTIFACT_METRICS, DATASETS, JobPaths, dataset_file, dataset_manifest
from trainjobs.spec import JobSpec
from trainjobs.vm_metadata import LABEL_MANAGED
from worker.ports import MachineRequest

pytestmark = pytest.mark.tf
def test_digits_job_trains_and_its_saved_model_predicts_as_reported(api, local_stack, tmp_path):
    import tensorflow as tf

    spec = digits_spec(precision="mixed_bfloat16", training={"epochs": 6, "per_replica_batch_size": 32,
                                                              "learning_rate": 0.003},
                       export={"tflite": {"quantization": "int8", "calibration_examples": 64}})
    job = api.post("/v1/jobs", json=spec).json()
    job = wait_for_job(api, job["id"], {"SUCCEEDED"}, timeout=AGENT_JOB_S)
    assert local_stack.forked_agents == 1  # from the zygote, which had imported TensorFlow already
    assert job["metrics"]["val_accuracy"] >= 0.9
    assert job["runtime"]["strategy"] == "mirrored" and job["runtime"]["replicas"] == 2
    events = [e["to_status"] for e in api.get(f"/v1/jobs/{job['id']}/events").json()["events"]]
    assert events == ["QUEUED", "STAGING", "PROVISIONING", "RUNNING", "SUCCEEDED"]

    listing = api.get(f"/v1/jobs/{job['id']}/artifacts").json()
    paths = {a["path"] for a in listing["artifacts"]}
    assert {"model.tflite", ARTIFACT_METRICS, ARTIFACT_HISTORY} <= paths
    assert any(p.startswith("saved_model/") for p in paths)
    # Download as `trainjobs artifacts --download` does (API links: the emulator's credentials cannot sign).
    from trainjobs.client.api import Client

    out = tmp_path / "download"
    client = Client(api_url=str(api.base_url), api_key=api.headers["authorization"].split()[1])
    files = client.download_artifacts(job["id"], out)
    assert sorted(str(f.relative_to(out)) for f in files) == sorted(paths)
    for a in listing["artifacts"]:
        assert (out / a["path"]).stat().st_size == a["size"]

    # Predict the staged validation split with the downloaded SavedModel.
    uri = _dataset_uri(job["id"])
    x, y = _read_split(uri, storage.read_json(dataset_manifest(uri)), "validation", tmp_path / "val")
    model = tf.saved_model.load(str(out / "saved_model"))
    probs = model.serve(tf.constant(x)).numpy()
    accuracy = float(np.mean(probs.argmax(-1) == y))
    assert abs(accuracy - job["metrics"]["val_accuracy"]) < 0.01

    logs = api.get(f"/v1/jobs/{job['id']}/logs").json()["text"]
    assert "epoch" in logs.lower()
    assert local_stack.list({LABEL_MANAGED: "true"}) == []


def _dataset_uri(job_id: str) -> str:
    return storage.read_json(JobPaths.for_job(job_id).spec)["dataset_uri"]


def _read_split(uri: str, manifest: dict, split: str, local: Path):
    import tensorflow as tf

    files = []
    for shard in manifest["splits"][split]["shards"]:
        src = shard if shard.startswith("gs://") else dataset_file(uri, shard)
        dst = local / Path(shard).name
        dst.parent.mkdir(parents=True, exist_ok=True)
        storage.blob(src).download_to_filename(str(dst))
        files.append(str(dst))
    feat = manifest["feature"]
    spec = {feat["key"]: tf.io.FixedLenFeature([int(np.prod(feat["shape"]))], tf.float32),
            manifest["label"]["key"]: tf.io.FixedLenFeature([], tf.int64)}
    xs, ys = [], []
    for rec in tf.data.TFRecordDataset(files):
        ex = tf.io.parse_single_example(rec, spec)
        xs.append(ex[feat["key"]].numpy().reshape(feat["shape"]))
        ys.append(int(ex[manifest["label"]["key"]]))
    return np.stack(xs).astype("float32"), np.array(ys)


def test_bad_data_fails_with_reason_and_no_machine(api, local_stack, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINJOBS_HOST_DATA_DIRS", str(tmp_path))  # host paths are off unless allowed
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n3,4\n")
    job = api.post("/v1/jobs", json=digits_spec(dataset={"source": str(bad)})).json()
    job = wait_for_job(api, job["id"], {"FAILED"}, timeout=60)
    assert "label" in job["error"] and job["provisioning_at"] is None
    assert local_stack.list({}) == []


def test_cancel_running_job_stops_agent_and_empties_inventory(api, local_stack):
    job = api.post("/v1/jobs", json=digits_spec(training={"epochs": 500})).json()
    wait_for_job(api, job["id"], {"RUNNING"}, timeout=AGENT_JOB_S)
    [machine] = local_stack.list({LABEL_MANAGED: "true"})
    assert api.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202
    job = wait_for_job(api, job["id"], {"CANCELLED"}, timeout=60)
    assert local_stack.list({}) == []
    request = MachineRequest(job["id"], 1, JobSpec.model_validate(job["spec"]), "")
    assert request.name == machine.name and local_stack.get(request) is None


def test_artifact_paths_cannot_leave_the_job(api, local_stack):
    job = api.post("/v1/jobs", json=digits_spec()).json()
    # Encoded dots reach the server as '..' (clients would otherwise normalise them away).
    for path in ("%2e%2e/%2e%2e/spec.json", "saved_model/%2e%2e/%2e%2e/status.json", "%2fetc%2fpasswd"):
        r = api.get(f"/v1/jobs/{job['id']}/artifacts/{path}")
        assert r.status_code == 400, (path, r.status_code)
        assert r.json()["error"]["error"] == "bad_path"
    api.post(f"/v1/jobs/{job['id']}/cancel")


def test_unknown_job_artifacts_are_404(api):
    assert api.get(f"/v1/jobs/{uuid.uuid4()}/artifacts").status_code == 404


def test_scikit_learns_gzipped_digits_csv_uploaded_as_it_ships_trains_serves_and_is_staged_once(
        api, local_stack, bucket, tmp_path):
    """Issue 21: digits.csv.gz (headerless, label last, gzipped) uploaded as is; the downloaded
    SavedModel is scored here on the staged validation split. A second job on the same data stages
    nothing again."""
    import sklearn.datasets
    import tensorflow as tf

    from trainjobs.client.api import Client

    shipped = Path(sklearn.datasets.__file__).parent / "data" / "digits.csv.gz"
    with shipped.open("rb") as f:
        r = api.post("/v1/datasets", files={"file": ("digits.csv.gz", f)})
    assert r.status_code == 201, r.text
    spec = {"dataset": {"source": f"dataset:{r.json()['sha256']}", "options": {"header": "none"}},
            "model": {"name": "mlp"}, "accelerator": {"type": "cpu"}, "strategy": "default",
            "training": {"epochs": 12, "learning_rate": 0.003}}
    job = wait_for_job(api, api.post("/v1/jobs", json=spec).json()["id"], {"SUCCEEDED", "FAILED"}, timeout=AGENT_JOB_S)
    assert job["status"] == "SUCCEEDED", job["error"]
    client = Client(api_url=str(api.base_url), api_key=api.headers["authorization"].split()[1])
    client.download_artifacts(job["id"], tmp_path / "download")
    uri = _dataset_uri(job["id"])
    x, y = _read_split(uri, storage.read_json(dataset_manifest(uri)), "validation", tmp_path / "val")
    assert len(y) == 359
    served = tf.saved_model.load(str(tmp_path / "download" / "saved_model"))
    assert float(np.mean(served.serve(tf.constant(x)).numpy().argmax(-1) == y)) >= 0.95

    datasets_before = {b.name: b.generation for b in storage.client().list_blobs(bucket, prefix=f"{DATASETS}/")}
    second = api.post("/v1/jobs", json={**spec, "training": {"epochs": 1}}).json()
    wait_for_job(api, second["id"], {"SUCCEEDED"}, timeout=AGENT_JOB_S)
    datasets_after = {b.name: b.generation for b in storage.client().list_blobs(bucket, prefix=f"{DATASETS}/")}
    assert datasets_after == datasets_before  # same objects, same generations: nothing re-uploaded
    assert _dataset_uri(job["id"]) == _dataset_uri(second["id"])
