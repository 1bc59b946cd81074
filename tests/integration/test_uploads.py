"""Uploads through the API: datasets and model code land in GCS by content."""

from __future__ import annotations

import io
import uuid
from datetime import datetime, timedelta, timezone

import numpy as np

from tests.support import eventually, scaled
from trainjobs import storage


def project_id(db) -> str:
    """The id of project 'alpha', whose key the `api` client sends: its uploads are stored under it."""
    from service.db.projects import ensure_project
    from service.db.session import transaction

    with transaction(db) as session:
        return str(ensure_project(session, "alpha"))


def test_dataset_upload_returns_a_source_jobs_can_name(api, bucket):
    buf = io.BytesIO()
    np.savez(buf, x=np.random.rand(20, 4).astype("float32"), y=np.arange(20) % 2)
    r = api.post("/v1/datasets", files={"file": ("toy.npz", buf.getvalue())})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["dataset"] == f"dataset:{body['sha256']}" and body["size"] == len(buf.getvalue())
    job = api.post("/v1/jobs", json={"dataset": {"source": body["dataset"]}, "model": {"name": "mlp"}})
    assert job.status_code == 201


def test_same_dataset_twice_is_one_object(api, bucket, db):
    payload = b"label,a\n0,1\n1,2\n"
    first = api.post("/v1/datasets", files={"file": ("a.csv", payload)}).json()
    second = api.post("/v1/datasets", files={"file": ("b.csv", payload)}).json()
    assert first["sha256"] == second["sha256"]
    stored = [b.name for b in storage.client().list_blobs(bucket, prefix="uploads/") if ".incoming" not in b.name]
    assert stored == [f"uploads/{project_id(db)}/{first['sha256']}/a.csv"]


def test_module_upload_returns_gs_uri_with_the_code(api, bucket, db):
    code = b"def build_model(input_shape, num_classes, params):\n    raise NotImplementedError\n"
    r = api.post("/v1/modules", files={"file": ("my_model.py", code)})
    assert r.status_code == 201, r.text
    uri = r.json()["module"]
    assert uri.startswith(f"gs://{bucket}/uploads/{project_id(db)}/") and uri.endswith("/my_model.py")
    assert storage.blob(uri).download_as_bytes() == code


def test_uploads_refuse_bad_names_and_empty_files(api, bucket):
    assert api.post("/v1/modules", files={"file": ("model.exe", b"x")}).status_code == 422
    assert api.post("/v1/datasets", files={"file": ("../../etc.csv", b"x")}).status_code == 422
    assert api.post("/v1/datasets", files={"file": ("empty.csv", b"")}).status_code == 422
    assert api.post("/v1/modules", files={"file": ("m.py", b"")}).status_code == 422


def _leave_a_temporary(bucket: str) -> str:
    """What a killed API leaves: an upload temporary whose rewrite and delete never ran."""
    from trainjobs.uploads import INCOMING

    name = f"{INCOMING}{uuid.uuid4().hex}"
    storage.client().bucket(bucket).blob(name).upload_from_string(b"half of someone's upload")
    return name


def _names(bucket: str) -> set[str]:
    return {b.name for b in storage.client().list_blobs(bucket)}


def test_upload_temporaries_are_swept_once_older_than_the_safe_age(api, bucket, db):
    from trainjobs.uploads import DEFAULT_INCOMING_MAX_AGE_S, sweep_incoming

    stored = api.post("/v1/datasets", files={"file": ("a.csv", b"label,a\n0,1\n")}).json()
    orphan = _leave_a_temporary(bucket)
    assert sweep_incoming() == 0 and orphan in _names(bucket)  # young: it may be a live upload's
    later = datetime.now(timezone.utc) + timedelta(seconds=DEFAULT_INCOMING_MAX_AGE_S + 1)
    assert sweep_incoming(now=later) == 1
    assert _names(bucket) == {f"uploads/{project_id(db)}/{stored['sha256']}/a.csv"}  # uploads themselves stay


def test_a_running_worker_sweeps_upload_temporaries(bucket, db, database_url, monkeypatch):
    from service.db.session import get_engine
    from worker.loop import Worker, WorkerConfig
    from worker.memory_cloud import MemoryCloud, memory_stager

    orphan = _leave_a_temporary(bucket)
    monkeypatch.setenv("TRAINJOBS_INCOMING_MAX_AGE_S", "0")  # every temporary counts as old
    cloud = MemoryCloud()
    worker = Worker(get_engine(database_url), cloud, cloud, memory_stager,
                    WorkerConfig(concurrency=1, name=f"sweeper-{uuid.uuid4().hex[:6]}", sweep_uploads_every_s=0.05))
    worker.start()
    try:
        eventually(lambda: orphan not in _names(bucket), 10, f"the sweep removed {orphan}")
    finally:
        worker.shutdown(timeout=scaled(10))
