"""Data as people already have it (issue 11): CSVs with their own layout (scikit-learn's own files
among them), missing cells, numeric labels that keep their ids, options that belong to another
format, and plans the staged data cannot carry, which fail at STAGING before any machine.

TFRecords written by TensorFlow itself are in tests/e2e/test_user_tfrecords.py (one TF process there)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from service.db import jobs as jobdata
from service.db.jobstate import JobStatus
from service.db.models import JobEvent
from service.db.projects import ensure_project
from service.db.session import get_engine, transaction
from tests.support.staging import stage
from tests.support.worker import wait_for
from trainjobs.source_rules import HOST_DATA_DIRS_ENV
from trainjobs.spec import JobSpec, describe_errors
from worker.staging import DatasetError
from worker.staging.preflight import plan_problems

PROJECT = "6d1f4a52-5d0e-4c3a-9a53-2a4f4f0f1b12"


@pytest.fixture(autouse=True)
def operator_allows_test_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOST_DATA_DIRS_ENV, str(tmp_path))


def write(tmp: Path, name: str, text: str) -> Path:
    (tmp / name).write_text(text)
    return tmp / name


def sklearn_csv(name: str, tmp: Path) -> Path:
    """One of the CSV files inside the installed scikit-learn, copied byte for byte."""
    import sklearn

    shutil.copy(Path(sklearn.__file__).parent / "datasets" / "data" / name, tmp / name)
    return tmp / name


# --- scikit-learn's own CSV files, read with options alone -----------------------------------------

# Their first line is `n_samples,n_features,class names...`; then rows of features and a class id.
SKLEARN_OPTIONS = {"skip_rows": 1, "header": "none", "label_column": -1}


@pytest.mark.parametrize(("name", "examples", "features", "classes"), [
    ("wine_data.csv", 178, 13, 3), ("breast_cancer.csv", 569, 30, 2), ("iris.csv", 150, 4, 3),
])
def test_sklearn_csv_files_stage_with_options_alone(bucket: str, tmp_path: Path, name: str, examples: int,
                                                    features: int, classes: int) -> None:
    from sklearn import datasets

    staged = stage(sklearn_csv(name, tmp_path), bucket, options=SKLEARN_OPTIONS)
    m = staged.manifest
    assert m["feature"]["shape"] == [features] and m["class_names"] == [str(i) for i in range(classes)]
    counts = np.add(m["splits"]["train"]["class_counts"], m["splits"]["validation"]["class_counts"])
    loader = {"wine_data.csv": datasets.load_wine, "breast_cancer.csv": datasets.load_breast_cancer,
              "iris.csv": datasets.load_iris}[name]
    # The same examples of each class as scikit-learn's own loader reads from the file.
    assert counts.tolist() == np.bincount(loader().target).tolist() and counts.sum() == examples


# --- labels: numeric ids kept, a missing one named or dropped ------------------------------------


def test_numeric_labels_keep_their_ids_past_nine(bucket: str, tmp_path: Path) -> None:
    rows = "".join(f"{i % 12 + 0.5},{i % 12}\n" for i in range(120))
    staged = stage(write(tmp_path, "d.csv", "f,label\n" + rows), bucket, options={"validation_split": 0.0})
    assert staged.manifest["class_names"] == [str(i) for i in range(12)]
    assert staged.manifest["splits"]["train"]["class_counts"] == [10] * 12  # "10" is id 10, "2" id 2


def test_a_blank_label_is_an_error_naming_its_line(bucket: str, tmp_path: Path) -> None:
    path = write(tmp_path, "d.csv", "f,label\n1,0\n2,1\n3,\n4,2\n")
    with pytest.raises(DatasetError, match=r"d.csv line 4, column 2: the label is missing"):
        stage(path, bucket)


def test_rows_with_missing_cells_are_dropped_when_asked_and_counted(bucket: str, tmp_path: Path) -> None:
    rows = [f"{i},{i % 3}" for i in range(30)]
    rows[4], rows[17] = "5,", "NA,1"
    path = write(tmp_path, "d.csv", "f,label\n" + "\n".join(rows) + "\n")
    staged = stage(path, bucket, options={"na_values": ["", "NA"], "na_policy": "drop"})
    m = staged.manifest
    assert m["class_names"] == ["0", "1", "2"]  # no '' class, nothing renumbered
    assert m["dropped_examples"] == 2 and "2 of 30 rows of d.csv left out" in m["notes"][0]
    assert m["splits"]["train"]["examples"] + m["splits"]["validation"]["examples"] == 28


def test_missing_features_are_filled_when_asked(bucket: str, tmp_path: Path) -> None:
    path = write(tmp_path, "d.csv", "a;b;label\n1;?;x\n2;3;y\n?;4;x\n5;6;y\n")
    staged = stage(path, bucket, options={"delimiter": ";", "na_values": ["?"], "na_policy": "fill",
                                          "na_fill": -1.0, "validation_split": 0.0})
    m = staged.manifest
    assert m["class_names"] == ["x", "y"] and m["dropped_examples"] == 0
    assert m["notes"] == ["2 missing feature cells of d.csv set to -1 (na_policy fill)"]
    from tests.support.staging import read_split

    x, _ = read_split(staged, "train")
    assert sorted(map(tuple, x.tolist())) == [(-1.0, 4.0), (1.0, -1.0), (2.0, 3.0), (5.0, 6.0)]


@pytest.mark.parametrize(("text", "options", "message"), [
    ("f,label\n1,0\n,1\n", {}, "d.csv line 3, column 1: a missing feature"),
    ("# exported\nf,g,label\n1,x,0\n", {"skip_rows": 1, "columns": {"g": "numeric"}},
     "d.csv line 3, column 2: a feature that is not a number"),
    ("f,label\n1,0\n2,1\n", {"label_column": 5}, "label_column 5 is outside the 2 columns"),
    ("f,label\n1,0\n2,1\n", {"label_column": "kind"}, "has no label column 'kind'"),
    ("f;label\n1;0\n2;1;3\n", {"delimiter": ";"}, "line 3 has 3 fields, the header 2"),
    ("f,label\n,\n", {"na_policy": "drop"}, "every row has a missing cell"),
])
def test_csv_errors_name_the_line_and_column(bucket: str, tmp_path: Path, text: str, options: dict[str, Any],
                                             message: str) -> None:
    with pytest.raises(DatasetError, match=message):
        stage(write(tmp_path, "d.csv", text), bucket, options=options)


def test_header_row_and_label_by_name_or_negative_position(bucket: str, tmp_path: Path) -> None:
    text = "exported by a tool\nkind,a,b\ncat,1,2\ndog,3,4\ncat,5,6\ndog,7,8\n"
    path = write(tmp_path, "d.csv", text)
    by_name = stage(path, bucket, options={"header": 1, "label_column": "kind", "validation_split": 0.0})
    by_position = stage(path, bucket, options={"header": 1, "label_column": -3, "validation_split": 0.0})
    assert by_name.manifest["class_names"] == by_position.manifest["class_names"] == ["cat", "dog"]
    assert by_name.manifest["feature"]["shape"] == [2]


# --- options that belong to another format -------------------------------------------------------


def _refusal(dataset: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ValidationError) as err:
        JobSpec.model_validate({"dataset": dataset, "model": {"name": "mlp"}})
    [error] = describe_errors([dict(e) for e in err.value.errors()])
    return error


@pytest.mark.parametrize(("dataset", "field", "reason"), [
    ({"source": "d.npz", "options": {"header": "none"}}, "dataset.options.header", "applies to csv data, not npz"),
    ({"source": "d.csv", "options": {"x_key": "pixels"}}, "dataset.options.x_key", "not csv"),
    ({"source": "gs://bucket/train.tfrecord-00000-of-00002", "options": {"label_column": 0}},
     "dataset.options.label_column", "not tfrecord"),
    ({"source": "imgs", "format": "image_folder", "options": {"compression": "gzip"}},
     "dataset.options.compression", "not image_folder"),
    ({"source": "sklearn:iris", "options": {"delimiter": ";"}}, "dataset.options", "does not apply to sklearn"),
    ({"source": "dataset:" + "a" * 64, "options": {"label_column": "y", "features": ["a"]}}, "dataset.options",
     "no format reads them all"),
    ({"source": "d.csv", "options": {"na_fill": 0}}, "dataset.options.na_fill", "under na_policy fill"),
    ({"source": "d.csv", "options": {"header": "none", "label_column": "kind"}}, "dataset.options.label_column",
     "give label_column as a position"),
    ({"source": "d.csv", "options": {"label_column": True}}, "dataset.options.label_column",
     "a column's name (1 to 256 characters) or its position"),
    ({"source": "d.csv", "options": {"header": -1}}, "dataset.options.header", "0 to 1000 (after skip_rows), or 'none'"),
    ({"source": "d.tfrecord", "options": {"x_key": "a", "features": ["b"]}},
     "dataset.options.features", "give x_key (one feature) or features (several), not both"),
])
def test_options_for_another_format_are_refused_at_submit(dataset: dict[str, Any], field: str, reason: str) -> None:
    error = _refusal(dataset)
    assert error["field"] == field and reason in error["reason"], error


def test_the_api_answers_a_foreign_option_with_422(api: Any) -> None:
    from tests.support.jobs import digits_spec

    r = api.post("/v1/jobs", json=digits_spec(dataset={"source": "d.npz", "options": {"delimiter": ";"}}))
    assert r.status_code == 422
    assert {"field": "dataset.options.delimiter", "reason": "delimiter applies to csv data, not npz (the format "
            "of the source's name)"} in r.json()["error"]["details"]


def test_an_option_for_another_format_is_refused_once_staging_detects_the_format(bucket: str, tmp_path: Path) -> None:
    """A folder's name says nothing at submit; staging detects the format before reading a byte of it."""
    (tmp_path / "data").mkdir()
    write(tmp_path / "data", "d.csv", "f,label\n1,0\n2,1\n")
    with pytest.raises(DatasetError, match=r"dataset.options.x_key: x_key applies to npz and tfrecord data, not csv "
                                           r"\(the source was detected as csv\)"):
        stage(tmp_path / "data", bucket, options={"x_key": "pixels"})


# --- the plan against the staged data, before any machine -----------------------------------------


def _manifest(train: int, shape: list[int], train_counts: list[int], val_counts: list[int]) -> dict[str, Any]:
    return {"feature": {"shape": shape}, "splits": {
        "train": {"examples": train, "class_counts": train_counts},
        "validation": {"examples": sum(val_counts), "class_counts": val_counts}}}


def _spec(**overrides: Any) -> JobSpec:
    return JobSpec.model_validate({"dataset": {"source": "sklearn:iris"}, "model": {"name": "mlp"}, **overrides})


FITS = _manifest(120, [4], [40, 40, 40], [10, 10, 10])


@pytest.mark.parametrize(("spec", "manifest", "problem"), [
    (_spec(training={"global_batch_size": 128}), FITS, "global batch of 128 is larger than the training split (120"),
    (_spec(model={"name": "cnn"}), FITS, "model cnn needs image features (height, width[, channels]), the data's are [4]"),
    (_spec(model={"name": "resnet"}), FITS, "model resnet needs image features"),
    (_spec(model={"name": "MobileNetV2"}), _manifest(120, [8, 8], [40, 40, 40], [10, 10, 10]),
     "keras.applications.MobileNetV2 needs image features (height, width, channels)"),
    (_spec(export={"tflite": {"quantization": "int8", "calibration_examples": 500}}), FITS,
     "int8 calibration asks for 500 examples, the training split has 120"),
    (_spec(export={"tflite": {"quantization": "int8"}}, training={"global_batch_size": 4}),
     _manifest(12, [4], [4, 4, 4], [1, 1, 1]), "int8 calibration needs at least 16 training examples"),
    (_spec(export={"variants": ["tflite_int8"]}, training={"global_batch_size": 4}),  # the variant calibrates too
     _manifest(12, [4], [4, 4, 4], [1, 1, 1]), "int8 calibration needs at least 16 training examples"),
    (_spec(), _manifest(120, [4], [40, 40, 40], [15, 15, 0]), "the validation split leaves out class ids 2 (of 3)"),
    (_spec(), _manifest(120, [4], [60, 60, 0], [10, 10, 10]), "class ids 2 have no example in the training split"),
])
def test_plan_problems_name_what_does_not_fit(spec: JobSpec, manifest: dict[str, Any], problem: str) -> None:
    problems = plan_problems(spec, manifest)
    assert len(problems) == 1 and problem in problems[0], problems


@pytest.mark.parametrize("spec", [
    _spec(), _spec(training={"global_batch_size": 120}),
    _spec(export={"tflite": {"quantization": "int8"}}),  # the default 200 calibrates on the 120 there are
    _spec(export={"tflite": {"quantization": "dynamic"}, "variants": ["tflite_int8", "saved_model_int8"]}),
])
def test_a_plan_that_fits_has_no_problems(spec: JobSpec) -> None:
    assert plan_problems(spec, FITS) == []
    assert plan_problems(_spec(model={"name": "cnn"}), _manifest(120, [8, 8], [60, 60], [10, 10])) == []
    # Unused ids (1-based labels leave id 0 empty) are no class to leave out; old manifests are not counted.
    assert plan_problems(spec, _manifest(120, [4], [0, 60, 60], [0, 10, 10])) == []
    assert plan_problems(spec, {"feature": {"shape": [4]}, "splits": {"train": {"examples": 120}}}) == []


def test_a_plan_the_data_cannot_carry_fails_at_staging_without_a_machine(
        db: Any, database_url: str, bucket: str, tmp_path: Path) -> None:
    from sqlalchemy import select

    from worker.driver import DriverConfig
    from worker.loop import Worker, WorkerConfig
    from worker.memory_cloud import MemoryCloud
    from worker.staging_adapter import GcsStager

    spec = _spec(training={"global_batch_size": 256}).model_dump(mode="json")  # iris trains on 120
    with transaction(db) as s:
        job_id = jobdata.create_job(s, ensure_project(s, "p"), spec, idempotency_key=None, request_hash=b"")[0].id
    cloud = MemoryCloud()
    worker = Worker(get_engine(database_url), cloud, cloud, GcsStager(tmp_path / "staging"),
                    WorkerConfig(concurrency=1, name="w", lease_s=5, heartbeat_s=0.5, poll_s=0.1,
                                 driver=DriverConfig(poll_s=0.1)))
    worker.start()
    try:
        job = wait_for(db, job_id, {JobStatus.FAILED}, timeout=60)
    finally:
        worker.shutdown(timeout=5)
    assert job.error is not None and "the global batch of 256 is larger than the training split (120 examples)" in job.error
    with transaction(db) as s:
        path = [e.to_status.value for e in s.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id))]
    assert path == ["QUEUED", "STAGING", "FAILED"] and cloud.created == []


# --- paths from the CLI ----------------------------------------------------------------------------


def _cli_submit(spec_file: Path, api: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    from click.testing import CliRunner

    from stack.cli import main

    monkeypatch.setenv("TRAINJOBS_API_URL", str(api.base_url))
    monkeypatch.setenv("TRAINJOBS_API_KEY", api.headers["authorization"].split()[1])
    return CliRunner().invoke(main, ["submit", str(spec_file)])


def test_submit_uploads_a_relative_folder_like_a_file(api: Any, bucket: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.staging import save_png

    for cls in ("cat", "dog"):
        for i in range(3):
            save_png(tmp_path / "project" / "pets" / cls / f"{i}.png", (40 * i, 0, 0))
    spec_file = write(tmp_path / "project", "job.yaml", "dataset: {source: pets}\nmodel: {name: cnn}\n")
    result = _cli_submit(spec_file, api, monkeypatch)
    assert result.exit_code == 0, result.output
    [job] = api.get("/v1/jobs").json()["jobs"]
    assert job["spec"]["dataset"]["source"].startswith("dataset:")


def test_a_relative_path_that_is_not_there_says_where_it_was_looked_for(
        api: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "project").mkdir()
    spec_file = write(tmp_path / "project", "job.yaml", "dataset: {source: data/pets}\nmodel: {name: cnn}\n")
    result = _cli_submit(spec_file, api, monkeypatch)
    assert result.exit_code != 0
    assert (f"dataset.source 'data/pets' is a relative path, so it was looked for next to the spec file, at "
            f"{(tmp_path / 'project' / 'data' / 'pets').resolve()}, and nothing is there") in result.output
    assert api.get("/v1/jobs").json()["jobs"] == []


@pytest.mark.parametrize("value", ["sklearn:digits", "gs://bucket/data/", "dataset:" + "a" * 64, "/srv/data/on/the/worker"])
def test_sources_that_are_not_local_paths_are_sent_as_they_are(tmp_path: Path, value: str) -> None:
    from trainjobs.client.local_paths import local_upload

    assert local_upload(value, tmp_path, "dataset.source") is None
