"""A distillation's teacher job (issue 23): which job may teach which, refused at submit as a 422 naming
training.distillation.teacher_job and again at staging, before any machine; and the student's storage
boundary, which grows by the teacher's artifacts/ and nothing else of it. The student learning from its
teacher, and the attacks from the student's own code: tests/e2e/test_distillation.py and
tests/e2e/test_code_tenancy.py."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from service.db.jobstate import JobStatus
from service.db.session import transaction
from tests.support.jobs import make_key
from tests.support.tenancy import refusal, succeeded_job
from tests.support.worker import make_worker, path, submit, wait_for
from trainjobs import storage
from trainjobs.job_paths import JobPaths, dataset_manifest, dataset_uri
from trainjobs.spec import JobSpec
from worker.boundary.access import Scope, job_boundary
from worker.memory_cloud import MemoryCloud
from worker.teacher_check import teacher_refusal

FIELD = "training.distillation.teacher_job"
TEACHER_FILES = {"saved_model/saved_model.pb": b"graph", "labels.json": b"{}"}
DIGITS = [str(i) for i in range(10)]


def _student(teacher: str, **overrides: Any) -> dict[str, Any]:
    return {"dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp"},
            "training": {"distillation": {"teacher_job": teacher}}, **overrides}


def _set(db: Any, job_id: str, **columns: Any) -> None:
    sets = ", ".join(f"{k} = CAST(:{k} AS jsonb)" if k in ("runtime", "spec") else f"{k} = :{k}" for k in columns)
    values = {k: json.dumps(v) if k in ("runtime", "spec") else v for k, v in columns.items()}
    with transaction(db) as session:
        session.execute(text(f"UPDATE jobs SET {sets} WHERE id = :id"), {**values, "id": job_id})


@pytest.fixture
def teacher(db: Any, api: httpx.Client, bucket: str) -> str:
    """A SUCCEEDED digits job of project alpha with a SavedModel among its artifacts."""
    job_id = succeeded_job(db, api, bucket, TEACHER_FILES)
    _set(db, job_id, runtime={"dataset": {"task": "classification", "class_names": DIGITS}})
    return job_id


def test_a_finished_job_of_the_project_is_a_teacher(api: httpx.Client, teacher: str) -> None:
    r = api.post("/v1/jobs", json=_student(teacher))
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["training"]["distillation"] == {"teacher_job": teacher, "temperature": 3.0, "alpha": 0.5}


def test_another_projects_finished_job_reads_as_no_job_at_all(db: Any, api_url: str, teacher: str) -> None:
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {make_key(db, 'beta')}"}) as beta:
        theirs = refusal(beta.post("/v1/jobs", json=_student(teacher)))
        missing = refusal(beta.post("/v1/jobs", json=_student(str(uuid.uuid4()))))
    assert theirs["field"] == missing["field"] == FIELD
    assert theirs["reason"] == f"no job {teacher} in this project"
    assert missing["reason"].startswith("no job ") and missing["reason"].endswith(" in this project")


@pytest.mark.parametrize("change, words", [
    ({"status": "RUNNING"}, "is RUNNING: a teacher is a job that SUCCEEDED"),
    ({"spec": {"program": {"source": "gs://b/uploads/p/x/train.py"}}}, "ran a program"),
    ({"spec": {"task": "binary", "dataset": {"source": "sklearn:breast_cancer"}, "model": {"name": "mlp"}}},
     "learned task binary, this job's task is classification"),
    ({"artifacts": "[]"}, "has no exported SavedModel"),
])
def test_a_job_that_cannot_teach_is_a_422_naming_the_teacher(db: Any, api: httpx.Client, teacher: str,
                                                              change: dict[str, Any], words: str) -> None:
    if "spec" in change:
        change = {"spec": JobSpec.model_validate(change["spec"]).model_dump(mode="json")}
    if "artifacts" in change:
        with transaction(db) as session:
            session.execute(text("UPDATE jobs SET artifacts = '[]'::jsonb WHERE id = :id"), {"id": teacher})
    else:
        _set(db, teacher, **change)
    detail = refusal(api.post("/v1/jobs", json=_student(teacher)))
    assert detail["field"] == FIELD and words in detail["reason"], detail


def test_a_sweep_cannot_vary_the_teacher(api: httpx.Client, teacher: str) -> None:
    sweep = {"name": "s", "job": _student(teacher), "objective": {"metric": "val_accuracy"}, "parameters": {
        FIELD: {"type": "categorical", "choices": [teacher, str(uuid.uuid4())]}}}
    detail = refusal(api.post("/v1/sweeps", json=sweep))
    assert detail["field"] == f"parameters.{FIELD}" and "teacher" in detail["reason"]


def test_staging_fails_a_student_whose_teacher_stopped_being_one(db: Any, database_url: str,
                                                                  running_workers: list[Any]) -> None:
    """Submitted against a finished teacher, queued, and then the teacher's row says otherwise: the worker
    fails the student at staging, and no machine is asked for."""
    [teacher_id] = submit(db)
    _set(db, str(teacher_id), status="FAILED")
    [student] = submit(db, training={"distillation": {"teacher_job": str(teacher_id)}})
    cloud = MemoryCloud()
    w = make_worker(database_url, cloud, "w1")
    running_workers.append(w)
    w.start()
    job = wait_for(db, student, {JobStatus.FAILED})
    assert path(db, student) == ["QUEUED", "STAGING", "FAILED"]
    assert job.error == f"{FIELD}: job {teacher_id} is FAILED: a teacher is a job that SUCCEEDED"
    assert cloud.created == []


def test_a_student_whose_teacher_is_still_one_at_staging_runs(db: Any, database_url: str,
                                                               running_workers: list[Any]) -> None:
    [teacher_id] = submit(db)
    _set(db, str(teacher_id), status="SUCCEEDED")
    with transaction(db) as session:
        session.execute(text("UPDATE jobs SET artifacts = CAST(:a AS jsonb) WHERE id = :id"),
                        {"a": json.dumps([{"path": "saved_model/saved_model.pb"}]), "id": teacher_id})
    [student] = submit(db, training={"distillation": {"teacher_job": str(teacher_id)}})
    w = make_worker(database_url, MemoryCloud(), "w1")
    running_workers.append(w)
    w.start()
    wait_for(db, student, {JobStatus.SUCCEEDED})
    assert path(db, student) == ["QUEUED", "STAGING", "PROVISIONING", "RUNNING", "SUCCEEDED"]


def test_staging_compares_the_teachers_classes_with_the_staged_data(db: Any, api: httpx.Client, bucket: str,
                                                                     teacher: str) -> None:
    """The classes the teacher's agent recorded against the manifest staging wrote for the student."""
    from service.db.models import Job

    student_id = api.post("/v1/jobs", json=_student(teacher)).json()["id"]
    uri = dataset_uri("c" * 64, bucket)
    with transaction(db) as session:
        student = session.get(Job, uuid.UUID(student_id))
        assert student is not None
        spec = JobSpec.model_validate(student.spec)
    storage.write_json(dataset_manifest(uri), {"class_names": DIGITS})
    assert teacher_refusal(db, student, spec, uri) is None
    storage.write_json(dataset_manifest(uri), {"class_names": ["zero", "one"]})
    refused = teacher_refusal(db, student, spec, uri)
    assert refused is not None and refused.startswith(f"{FIELD}: job {teacher} learned other classes: 10 classes")
    assert "this job's data has 2 classes ('zero', 'one')" in refused


def test_the_students_boundary_reads_the_teachers_artifacts_and_nothing_else_of_it(bucket: str) -> None:
    teacher, student = str(uuid.uuid4()), str(uuid.uuid4())
    spec = JobSpec.model_validate(_student(teacher))
    job_dir = JobPaths.for_job(student, bucket).root
    boundary = job_boundary(student, spec, None, job_dir)
    assert Scope(bucket, f"jobs/{teacher}/artifacts/") in boundary.read
    assert boundary.can_read(bucket, f"jobs/{teacher}/artifacts/saved_model/saved_model.pb")
    assert boundary.can_list(bucket, f"jobs/{teacher}/artifacts/")
    for elsewhere in (f"jobs/{teacher}/spec.json", f"jobs/{teacher}/checkpoints/ckpt-1.index",
                      f"jobs/{teacher}/artifactsX/labels.json", f"jobs/{uuid.uuid4()}/artifacts/labels.json"):
        assert not boundary.can_read(bucket, elsewhere), elsewhere
    assert not boundary.can_write(bucket, f"jobs/{teacher}/artifacts/labels.json")
    assert not boundary.can_list(bucket, f"jobs/{teacher}/")
    # Without distillation the boundary is what it was: no job's artifacts but its own.
    plain = job_boundary(student, JobSpec.model_validate({"dataset": {"source": "sklearn:digits"},
                                                          "model": {"name": "mlp"}}), None, job_dir)
    assert not plain.can_read(bucket, f"jobs/{teacher}/artifacts/labels.json")
