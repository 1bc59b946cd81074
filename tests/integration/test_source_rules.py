"""Issue 18, finding 4: the worker stages data with its own credentials and hands it to the job, so a
job may name only what its project owns in trainjobs' bucket, and other buckets only where the
operator lists them (TRAINJOBS_SOURCE_BUCKETS). Refused at submit (a 422 naming the field) and again
at staging (the rule of the day the job runs). Against the real API, PostgreSQL and the GCS emulator."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tenancy import job, project_id, refusal
from trainjobs import storage
from trainjobs.source_rules import SOURCE_BUCKETS_ENV
from trainjobs.spec import JobSpec
from worker.ports import DatasetError
from worker.staging_adapter import GcsStager

OPERATORS = "operators-private"
CSV = b"a,b,label\n1,2,0\n3,4,1\n5,6,0\n7,8,1\n"


def _spec(field: str, uri: str) -> dict:
    return job(source=uri) if field == "dataset.source" else job(module=uri)


@pytest.mark.parametrize("field", ["dataset.source", "model.module"])
def test_a_bucket_the_operator_did_not_list_is_refused_at_submit(api, bucket, monkeypatch, field):
    monkeypatch.setenv(SOURCE_BUCKETS_ENV, "some-other-bucket")

    answer = refusal(api.post("/v1/jobs", json=_spec(field, f"gs://{OPERATORS}/secrets/x.csv")))

    assert answer["field"] == field
    assert f"gs://{OPERATORS} only if the operator allows that bucket ({SOURCE_BUCKETS_ENV})" in answer["reason"]


@pytest.mark.parametrize("folder", ["shared", "operator", "agent", "_internal"])
def test_a_folder_of_our_bucket_that_is_not_a_projects_is_refused_at_submit(api, bucket, monkeypatch, folder):
    monkeypatch.setenv(SOURCE_BUCKETS_ENV, bucket)  # listing our own bucket opens none of its other folders

    answer = refusal(api.post("/v1/jobs", json=job(source=f"gs://{bucket}/{folder}/x.csv")))

    assert answer["field"] == "dataset.source" and "only its own project's uploads" in answer["reason"]


def test_a_bucket_the_operator_lists_is_accepted(api, bucket, monkeypatch):
    monkeypatch.setenv(SOURCE_BUCKETS_ENV, f"first, {OPERATORS}")

    assert api.post("/v1/jobs", json=job(source=f"gs://{OPERATORS}/shared/x.csv")).status_code == 201


def test_staging_refuses_a_bucket_the_operator_stopped_listing_after_submit(api, db, bucket, monkeypatch, tmp_path: Path):
    """The private object exists and the worker could read it: the rule, not a permission, stops it."""
    storage.ensure_bucket(OPERATORS)
    storage.blob(f"gs://{OPERATORS}/secrets/x.csv").upload_from_string(CSV)
    monkeypatch.setenv(SOURCE_BUCKETS_ENV, OPERATORS)
    submitted = api.post("/v1/jobs", json=job(source=f"gs://{OPERATORS}/secrets/x.csv"))
    assert submitted.status_code == 201
    monkeypatch.setenv(SOURCE_BUCKETS_ENV, "")

    with pytest.raises(DatasetError, match="only if the operator allows that bucket"):
        GcsStager(tmp_path)(JobSpec.model_validate(submitted.json()["spec"]), submitted.json()["id"],
                            project_id=project_id(db, "alpha"))
    assert storage.list_uris(f"gs://{bucket}/datasets/") == []


def test_staging_refuses_an_unknown_folder_of_our_bucket(db, bucket, tmp_path: Path):
    storage.blob(f"gs://{bucket}/operator/x.csv").upload_from_string(CSV)

    with pytest.raises(DatasetError, match="only its own project's uploads"):
        GcsStager(tmp_path)(JobSpec.model_validate(job(source=f"gs://{bucket}/operator/x.csv")), "j1",
                            project_id=project_id(db, "alpha"))
    assert storage.list_uris(f"gs://{bucket}/datasets/") == []
