"""Stand-ins for what one project has and another must not reach: a job that already succeeded with
known artifacts, model code of another project's, the guard's attacks as a job's module; and the
helpers the tenancy tests judge by."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx

from tests.support import guard_attacks
from trainjobs import storage
from trainjobs.job_paths import JobPaths

# A job, another job, and two projects, by id.
JOB = "0b7f3f7e-5f0c-4d7e-9f51-0c2a52d4c001"
OTHER_JOB = "6a1e9d42-1111-4c1e-8d7a-3b1c2d3e4f50"
PROJECT_A, PROJECT_B = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"
# Another project's model code, as uploaded.
ORIGINAL = b"def build_model(shape, classes, params): ...\n"
# tests/support/guard_attacks.py, uploaded as a job's model module.
ATTACKS = Path(guard_attacks.__file__).read_bytes()


def stored(bucket: str, key: str) -> bytes | None:
    blob = storage.bucket(bucket).blob(key)
    return bytes(blob.download_as_bytes()) if blob.exists() else None


def succeeded_job(db: Any, api: httpx.Client, bucket: str, files: dict[str, bytes]) -> str:
    """A SUCCEEDED job of project alpha whose artifacts are `files`, with the manifest the worker
    copied into its row."""
    from sqlalchemy import text

    from service.db.session import transaction

    job_id = api.post("/v1/jobs", json={"dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp"}}).json()["id"]
    manifest = [{"path": p, "size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for p, b in files.items()]
    for path, content in files.items():
        storage.blob(JobPaths.for_job(job_id, bucket).artifact(path)).upload_from_string(content)
    storage.write_json(JobPaths.for_job(job_id, bucket).artifact_manifest, manifest)
    with transaction(db) as session:
        session.execute(text("UPDATE jobs SET status = 'SUCCEEDED', artifacts = CAST(:a AS jsonb) WHERE id = :id"),
                        {"a": json.dumps(manifest), "id": job_id})
    return str(job_id)


def project_id(db, name: str) -> str:
    from service.db.projects import ensure_project
    from service.db.session import transaction

    with transaction(db) as session:
        return str(ensure_project(session, name))


def job(source: str = "sklearn:digits", module: str | None = None) -> dict[str, Any]:
    model = {"module": module} if module else {"name": "mlp"}
    return {"dataset": {"source": source}, "model": model}


def refusal(response: httpx.Response) -> dict[str, str]:
    """The one field a 422 names, and why."""
    assert response.status_code == 422, response.text
    [detail] = response.json()["error"]["details"]
    return detail
