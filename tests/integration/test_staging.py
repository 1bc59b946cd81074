"""Dataset staging: every source and format ends as TFRecord shards plus a manifest in GCS."""

from __future__ import annotations

import functools
import io
import threading
import zipfile
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.staging import PROJECT, operators_folder, read_split, save_png, stage
from tests.support.staging import operator_allows_test_files  # noqa: F401 - an autouse fixture
from trainjobs import storage
from trainjobs.job_paths import dataset_manifest, dataset_uri
from trainjobs.tfrecord import frame
from trainjobs.uploads import store_upload, upload_prefix
from worker.staging import DatasetError
from worker.staging.tfrecord import write_examples

def objects(bucket: str) -> list[str]:
    return sorted(storage.list_uris(f"gs://{bucket}/"))


# --- sources that stage ----------------------------------------------------------------------------


def test_sklearn_digits_stages_with_the_right_counts_and_shape(bucket: str, tmp_path: Path) -> None:
    staged = stage("sklearn:digits", bucket, tmp_path)

    m = staged.manifest
    assert staged.uri == dataset_uri(staged.sha256, bucket)
    assert m["format_version"] == 1 and m["sha256"] == staged.sha256 and m["source"] == "sklearn:digits"
    assert m["num_classes"] == 10 and m["class_names"] == [str(i) for i in range(10)]
    assert m["feature"] == {"key": "x", "shape": [8, 8, 1], "dtype": "float32"}
    assert m["label"] == {"key": "y", "dtype": "int64"}
    assert m["splits"]["train"] | {"class_counts": None} == {"examples": 1438, "class_counts": None,
                                                              "shards": ["shards/train-00000-of-00001.tfrecord"]}
    assert m["splits"]["validation"] | {"class_counts": None} == {
        "examples": 359, "class_counts": None, "shards": ["shards/validation-00000-of-00001.tfrecord"]}
    for split in ("train", "validation"):  # every example counted under its class
        assert sum(m["splits"][split]["class_counts"]) == m["splits"][split]["examples"]
    assert (m["dropped_examples"], m["notes"]) == (0, [])
    x, y = read_split(staged, "train")
    assert x.shape == (1438, 64) and x.min() >= 0.0 and x.max() <= 1.0 and set(y) == set(range(10))
    assert storage.read_json(dataset_manifest(staged.uri)) == m
    assert staged.uploaded_objects == 3


def test_staging_the_same_dataset_twice_uploads_nothing(bucket: str, tmp_path: Path) -> None:
    first = stage("sklearn:iris", bucket, tmp_path)
    before = objects(bucket)

    second = stage("sklearn:iris", bucket, tmp_path)

    assert second.uploaded_objects == 0
    assert (second.uri, second.manifest) == (first.uri, first.manifest)
    assert objects(bucket) == before


def test_changed_options_stage_a_different_dataset(bucket: str, tmp_path: Path) -> None:
    default = stage("sklearn:iris", bucket, tmp_path)
    no_validation = stage("sklearn:iris", bucket, tmp_path, options={"validation_split": 0.0})

    assert no_validation.sha256 != default.sha256
    assert no_validation.manifest["splits"]["validation"] == {"examples": 0, "shards": [], "class_counts": [0, 0, 0]}


def test_shards_hold_at_most_shard_examples(bucket: str, tmp_path: Path) -> None:
    staged = stage("sklearn:digits", bucket, tmp_path, options={"shard_examples": 500})

    train = staged.manifest["splits"]["train"]
    assert train["shards"] == [f"shards/train-0000{i}-of-00003.tfrecord" for i in range(3)]
    assert len(read_split(staged, "train")[1]) == train["examples"] == 1438


def _npz(tmp: Path) -> str:
    rng = np.random.default_rng(1)
    np.savez(tmp / "data.npz", features=rng.normal(size=(50, 4, 3)), target=np.arange(50) % 5)
    return str(tmp / "data.npz")


def _csv_with_string_labels(tmp: Path) -> str:
    rows = [f"{i * 0.5},{i % 3},{['cat', 'dog', 'bird'][i % 3]}" for i in range(30)]
    (tmp / "pets.csv").write_text("weight,age,kind\n" + "\n".join(rows) + "\n")
    return f"file://{tmp / 'pets.csv'}"


def _image_folder(tmp: Path) -> str:
    for i in range(6):
        save_png(tmp / "shapes" / "red" / f"{i}.png", (255, 0, 0))
        save_png(tmp / "shapes" / "blue" / f"{i}.png", (0, 0, 255))
    return str(tmp / "shapes")


def _tfrecord_dir(tmp: Path) -> str:
    (tmp / "records").mkdir()
    x = np.arange(40 * 6, dtype=np.float32).reshape(40, 6)
    write_examples(tmp / "records" / "a.tfrecord", x[:25], np.arange(25) % 4)
    write_examples(tmp / "records" / "b.tfrecord", x[25:], np.arange(15) % 4)
    return str(tmp / "records")


def _zipped_image_folder(tmp: Path) -> str:
    _image_folder(tmp)
    with zipfile.ZipFile(tmp / "shapes.zip", "w") as z:
        for p in sorted((tmp / "shapes").rglob("*.png")):
            z.write(p, p.relative_to(tmp))
    return str(tmp / "shapes.zip")


def _npz_in_a_tarball(tmp: Path) -> str:
    import tarfile

    _npz(tmp)
    with tarfile.open(tmp / "data.tar.gz", "w:gz") as tar:
        tar.add(tmp / "data.npz", arcname="release/data.npz")
    return str(tmp / "data.tar.gz")


def _gzipped_csv_in_a_zip(tmp: Path) -> str:
    import gzip

    _csv_with_string_labels(tmp)
    csv_path = next(tmp.glob("*.csv"))
    with zipfile.ZipFile(tmp / "bundle.zip", "w") as z:
        z.writestr("bundle/animals.csv.gz", gzip.compress(csv_path.read_bytes()))
    return str(tmp / "bundle.zip")


@pytest.mark.parametrize(
    ("make_source", "spec", "examples", "class_names", "shape"),
    [
        pytest.param(_npz, {"options": {"x_key": "features", "y_key": "target"}}, 50, ["0", "1", "2", "3", "4"], [4, 3], id="npz"),
        pytest.param(
            _csv_with_string_labels, {"options": {"label_column": "kind"}}, 30, ["bird", "cat", "dog"], [2], id="csv-string-labels"
        ),
        pytest.param(_image_folder, {"options": {"image_size": (16, 8)}}, 12, ["blue", "red"], [16, 8, 3], id="image-folder"),
        pytest.param(_tfrecord_dir, {}, 40, ["0", "1", "2", "3"], [6], id="tfrecord"),
        pytest.param(_zipped_image_folder, {}, 12, ["blue", "red"], [32, 32, 3], id="zipped-image-folder"),
        pytest.param(_npz_in_a_tarball, {"options": {"x_key": "features", "y_key": "target"}}, 50,
                     ["0", "1", "2", "3", "4"], [4, 3], id="npz-in-a-tarball"),
        pytest.param(_gzipped_csv_in_a_zip, {"options": {"label_column": "kind"}}, 30, ["bird", "cat", "dog"], [2],
                     id="gzipped-csv-in-a-zip"),
    ],
)
def test_local_format_stages(
    bucket: str, tmp_path: Path, make_source: Callable[[Path], str], spec: dict[str, Any],
    examples: int, class_names: list[str], shape: list[int],
) -> None:
    staged = stage(make_source(tmp_path), bucket, tmp_path / "work", **spec)

    m = staged.manifest
    assert m["class_names"] == class_names and m["num_classes"] == len(class_names)
    assert m["feature"]["shape"] == shape
    assert m["splits"]["train"]["examples"] + m["splits"]["validation"]["examples"] == examples
    x, y = read_split(staged, "train")
    assert x.shape == (m["splits"]["train"]["examples"], int(np.prod(shape)))
    assert set(y) <= set(range(len(class_names)))


def test_image_folder_pixels_are_rgb_scaled_to_unit_range(bucket: str, tmp_path: Path) -> None:
    staged = stage(_image_folder(tmp_path), bucket, tmp_path / "work", options={"validation_split": 0.0})

    x, y = read_split(staged, "train")
    pixels = x.reshape(-1, 32, 32, 3)
    red = staged.manifest["class_names"].index("red")
    assert np.array_equal(pixels[y == red][0, 0, 0], [1.0, 0.0, 0.0])
    assert np.array_equal(pixels[y != red][0, 0, 0], [0.0, 0.0, 1.0])


def test_gcs_tfrecord_prefix_is_used_in_place_without_copying(bucket: str, tmp_path: Path) -> None:
    x = np.arange(30 * 5, dtype=np.float32).reshape(30, 5)
    raw = operators_folder()
    for name, rows in (("train-0.tfrecord", slice(0, 20)), ("validation-0.tfrecord", slice(20, 30))):
        write_examples(tmp_path / name, x[rows], np.arange(30)[rows] % 3)
        storage.blob(f"{raw}/{name}").upload_from_filename(str(tmp_path / name))
    before = objects(bucket)

    staged = stage(f"{raw}/", bucket, tmp_path / "work")

    m = staged.manifest
    assert m["in_place"] is True and m["feature"]["shape"] == [5] and m["num_classes"] == 3
    assert m["splits"]["train"] == {"examples": 20, "shards": [f"{raw}/train-0.tfrecord"],
                                    "class_counts": [7, 7, 6]}
    assert m["splits"]["validation"] == {"examples": 10, "shards": [f"{raw}/validation-0.tfrecord"],
                                         "class_counts": [3, 3, 4]}
    assert objects(bucket) == sorted(before + [dataset_manifest(staged.uri)])
    assert staged.uploaded_objects == 1


def test_gcs_object_that_is_not_tfrecord_is_downloaded_and_converted(bucket: str, tmp_path: Path) -> None:
    raw = operators_folder()
    storage.blob(f"{raw}/pets.csv").upload_from_filename(_csv_with_string_labels(tmp_path).removeprefix("file://"))

    staged = stage(f"{raw}/pets.csv", bucket, tmp_path / "work", options={"label_column": "kind"})

    assert staged.manifest["in_place"] is False and staged.manifest["source_format"] == "csv"
    assert staged.manifest["splits"]["train"]["shards"] == ["shards/train-00000-of-00001.tfrecord"]
    assert f"{staged.uri}/shards/train-00000-of-00001.tfrecord" in objects(bucket)


def test_uploaded_file_stages_as_dataset_sha(bucket: str, tmp_path: Path) -> None:
    _csv_with_string_labels(tmp_path)
    with (tmp_path / "pets.csv").open("rb") as f:
        sha, size = store_upload(f, "pets.csv", project_id=PROJECT, bucket=bucket)

    staged = stage(f"dataset:{sha}", bucket, tmp_path / "work", options={"label_column": "kind"})

    assert size == (tmp_path / "pets.csv").stat().st_size
    assert f"gs://{bucket}/{upload_prefix(PROJECT, sha)}pets.csv" in objects(bucket)
    assert staged.manifest["class_names"] == ["bird", "cat", "dog"]
    local = stage(str(tmp_path / "pets.csv"), bucket, tmp_path / "work", options={"label_column": "kind"})
    assert local.sha256 == staged.sha256 and local.uploaded_objects == 0


def test_an_empty_upload_is_not_stored(bucket: str) -> None:
    assert store_upload(io.BytesIO(b""), "empty.csv", project_id=PROJECT, bucket=bucket)[1] == 0
    assert objects(bucket) == []


def test_storing_the_same_upload_twice_keeps_one_object(bucket: str) -> None:
    first = store_upload(io.BytesIO(b"a,label\n1,0\n2,1\n"), "one.csv", project_id=PROJECT, bucket=bucket)
    second = store_upload(io.BytesIO(b"a,label\n1,0\n2,1\n"), "two.csv", project_id=PROJECT, bucket=bucket)

    assert first == second
    assert objects(bucket) == [f"gs://{bucket}/{upload_prefix(PROJECT, first[0])}one.csv"]


@pytest.fixture
def http_root(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A local HTTP server for tmp_path/www: (base URL, folder it serves)."""
    root = tmp_path / "www"
    root.mkdir()

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()
    server.server_close()


def test_http_url_is_downloaded_and_staged(bucket: str, tmp_path: Path, http_root: tuple[str, Path]) -> None:
    base, root = http_root
    np.savez(root / "data.npz", x=np.random.default_rng(0).normal(size=(20, 3)), y=np.arange(20) % 2)

    staged = stage(f"{base}/data.npz", bucket, tmp_path / "work")

    assert staged.manifest["splits"]["train"]["examples"] == 16 and staged.manifest["feature"]["shape"] == [3]


def test_http_url_that_fails_names_the_status(bucket: str, tmp_path: Path, http_root: tuple[str, Path]) -> None:
    base, _ = http_root
    with pytest.raises(DatasetError, match=r"downloading .*/missing\.npz failed: HTTP 404"):
        stage(f"{base}/missing.npz", bucket, tmp_path / "work")


# --- bad data --------------------------------------------------------------------------------------


def _write(name: str, content: bytes | str) -> Callable[[Path], str]:
    def make(tmp: Path) -> str:
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        return str(path)
    return make


def _npz_of(**arrays: Any) -> Callable[[Path], str]:
    def make(tmp: Path) -> str:
        np.savez(tmp / "data.npz", **arrays)
        return str(tmp / "data.npz")
    return make


def _images(layout: dict[str, int], corrupt: str | None = None) -> Callable[[Path], str]:
    def make(tmp: Path) -> str:
        for cls, count in layout.items():
            (tmp / "imgs" / cls).mkdir(parents=True)
            for i in range(count):
                save_png(tmp / "imgs" / cls / f"{i}.png", (i, i, i))
        if corrupt:
            (tmp / "imgs" / corrupt).write_bytes(b"\x89PNG\r\n\x1a\nnot really")
        return str(tmp / "imgs")
    return make


def _npy_folder(with_subfolder: bool) -> Callable[[Path], str]:
    """SageMaker's mnist example's channel as people upload it: four .npy arrays (and, from a Mac, a
    stray folder beside them)."""
    def make(tmp: Path) -> str:
        root = tmp / "mnist"
        root.mkdir()
        for name in ("train_data", "train_labels", "eval_data", "eval_labels"):
            np.save(root / f"{name}.npy", np.zeros((4, 3), dtype=np.float32))
        if with_subfolder:
            (root / "__MACOSX").mkdir()
        return str(root)
    return make


# Example{features{feature{"a": Feature{int64_list{1}}}}}: a valid Example, not in our schema.
_FOREIGN_EXAMPLE = b"\x0a\x0c\x0a\x0a\x0a\x01a\x12\x05\x1a\x03\x0a\x01\x01"

BAD_DATA = [
    ("corrupt-npz", _write("d.npz", b"PK\x03\x04 garbage"), {}, "d.npz is not a readable .npz file"),
    ("npz-missing-key", _npz_of(x=np.zeros((4, 2)), labels=np.arange(4)), {}, "has no array 'y' (it holds 2)"),
    ("npz-length-mismatch", _npz_of(x=np.zeros((10, 2)), y=np.arange(9) % 2), {}, "10 examples of features but 9 labels"),
    ("npz-one-class", _npz_of(x=np.zeros((5, 2)), y=np.zeros(5)), {}, "needs at least 2 classes, found only 1"),
    ("npz-nan-feature", _npz_of(x=np.array([[1.0], [np.nan]]), y=np.arange(2)), {}, "example 1 has a NaN or infinite feature"),
    ("npz-string-features", _npz_of(x=np.array([["a"], ["b"]]), y=np.arange(2)), {}, "features are not numeric"),
    ("csv-missing-label", _write("t.csv", "a,b\n1,2\n"), {}, "t.csv has no label column 'label' in its header (2 columns)"),
    ("csv-non-numeric", _write("t.csv", "a,b,label\n" + "1,2,0\n" * 9 + "3,x,1\n" + "1,2,1\n" * 9), {},
     "t.csv line 11, column 2: a feature that is not a number in a column of numbers"),
    ("csv-numeric-named", _write("t.csv", "a,b,label\n1,2,0\n3,x,1\n"), {"options": {"columns": {"b": "numeric"}}},
     "t.csv line 3, column 2: a feature that is not a number"),
    ("csv-column-not-there", _write("t.csv", "a,b,label\n1,2,0\n3,x,1\n"), {"options": {"columns": {"c": "text"}}},
     "dataset.options.columns names 'c', which is not a column of t.csv's header (3 columns)"),
    ("csv-label-typed", _write("t.csv", "a,b,label\n1,2,0\n3,x,1\n"), {"options": {"label_column": 2, "columns": {
        "label": "text"}}}, "dataset.options.columns names 'label', a label column of t.csv"),
    ("csv-text-without-words", _write("t.csv", "a,b,label\n" + "1,...,0\n1,!?,1\n" * 5), {"options": {"columns": {
        "b": "text"}}}, "t.csv: feature column 2 (text) has no word in any training row"),
    ("csv-no-rows", _write("t.csv", "a,label\n"), {}, "t.csv holds no examples"),
    ("csv-empty-file", _write("t.csv", ""), {}, "t.csv is empty"),
    ("csv-ragged", _write("t.csv", "a,b,label\n1,2,0\n3,1\n"), {}, "t.csv is not a well-formed CSV file"),
    ("csv-binary", _write("t.csv", b"\xff\xfe\x00\x01"), {}, "not a UTF-8 text CSV file"),
    ("csv-gz-not-gzip", _write("t.csv.gz", b"a,label\n1,0\n"), {}, "t.csv.gz is not a readable gzip file"),
    ("images-empty-class", _images({"cat": 2, "dog": 0}), {}, "class folder 'dog' has no images"),
    ("images-one-class", _images({"cat": 3}), {}, "needs at least 2 class folders (one per class), found only 'cat'"),
    ("images-corrupt", _images({"cat": 2, "dog": 2}, corrupt="dog/broken.png"), {}, "dog/broken.png is not a readable image"),
    ("tfrecord-corrupt", _write("r.tfrecord", b"\x00" * 30), {}, "r.tfrecord is not a TFRecord file or is corrupt"),
    ("tfrecord-truncated", _write("r.tfrecord", frame(b"x" * 40)[:30]), {}, "r.tfrecord is truncated"),
    ("tfrecord-other-schema", _write("r.tfrecord", frame(_FOREIGN_EXAMPLE)), {},
     "r.tfrecord record 0 is not in our TFRecord schema (feature 'x') nor TF's image layout ('image/encoded'); "
     "it has 1 other features"),
    ("tfrecord-empty", _write("r.tfrecord", b""), {}, "r.tfrecord holds no examples"),
    ("unknown-extension", _write("data.bin", b"123"), {}, "cannot tell the format of 'data.bin'"),
    ("npy-file", _write("x.npy", b"\x93NUMPY"), {}, "x.npy' from its name; set dataset.format (npz, csv, tfrecord, image_folder); "
     ".npy arrays are not a dataset of their own: save features and labels in one .npz"),
    ("npy-folder", _npy_folder(with_subfolder=False), {},
     "cannot tell the format of folder 'mnist' (4 file(s): eval_data.npy, eval_labels.npy, train_data.npy, "
     "train_labels.npy)"),
    ("npy-folder-beside-a-folder", _npy_folder(with_subfolder=True), {}, "give the folder as a channel (program.channels"),
    ("missing-path", lambda tmp: str(tmp / "nope.csv"), {}, "no file or folder at"),
    ("unknown-upload", lambda tmp: "dataset:" + "0" * 64, {}, "no dataset 0000"),
    ("empty-gcs-prefix", lambda tmp: f"{operators_folder()}/nothing/", {}, "no objects at gs://"),
]


@pytest.mark.parametrize(("make_source", "spec", "message"), [pytest.param(*case[1:], id=case[0]) for case in BAD_DATA])
def test_bad_data_fails_with_a_clear_message(
    bucket: str, tmp_path: Path, make_source: Callable[[Path], str], spec: dict[str, Any], message: str,
) -> None:
    with pytest.raises(DatasetError) as err:
        stage(make_source(tmp_path), bucket, tmp_path / "work", **spec)
    assert message in str(err.value)
    assert objects(bucket) == [], "a failed staging must leave no dataset behind"


# --- gzipped files, as public tabular data ships -----------------------------------------------------


def test_scikit_learns_gzipped_digits_csv_stages_as_it_ships(bucket: str, tmp_path: Path) -> None:
    """digits.csv.gz: headerless, the label last, gzipped (issue 21): uploaded and staged as is."""
    import sklearn.datasets

    shipped = Path(sklearn.datasets.__file__).parent / "data" / "digits.csv.gz"
    with shipped.open("rb") as f:
        sha, _ = store_upload(f, "digits.csv.gz", project_id=PROJECT, bucket=bucket)
    staged = stage(f"dataset:{sha}", bucket, tmp_path / "work", options={"header": "none"})

    m = staged.manifest
    assert m["source_format"] == "csv" and m["feature"]["shape"] == [64] and m["num_classes"] == 10
    assert m["splits"]["train"]["examples"] + m["splits"]["validation"]["examples"] == 1797
    x, y = read_split(staged, "train")
    assert x.max() == 16.0 and set(y) == set(range(10))


def test_a_gzip_bomb_fails_at_the_staging_byte_limit_before_filling_the_disk(bucket: str, tmp_path: Path) -> None:
    import gzip

    from worker.staging.budget import StagingLimits

    bomb = tmp_path / "rows.csv.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as f:
        f.write(b"a,label\n")
        for _ in range(64):
            f.write(b"1,0\n" * (1 << 18))  # 64 MiB of rows from about 70 KiB
    assert bomb.stat().st_size < 1 << 20
    with pytest.raises(DatasetError, match="rows.csv.gz holds more than 16777216 bytes"):
        stage(str(bomb), bucket, tmp_path / "work", limits=StagingLimits(max_bytes=16 << 20))
    assert not any(p.stat().st_size > 17 << 20 for p in (tmp_path / "work").rglob("*") if p.is_file())
    assert objects(bucket) == []


# --- tasks: what the labels are (issue 21) -----------------------------------------------------------


def _rows(labels: list[str]) -> Callable[[Path], str]:
    return _write("t.csv", "a,b,label\n" + "".join(f"{i},{i % 5},{v}\n" for i, v in enumerate(labels)))


TASK_REFUSALS = [
    ("regression-text", _rows(["low", "high"] * 10), "regression", {}, "task regression needs numeric labels"),
    ("regression-nan", _npz_of(x=np.zeros((4, 2)), y=np.array([1.0, np.nan, 2.0, 3.0])), "regression", {},
     "example 1's target is NaN or infinite"),
    ("regression-images", _images({"cat": 2, "dog": 2}), "regression", {}, "labels are named classes"),
    ("binary-three-values", _rows(["a", "b", "c"] * 10), "binary", {"options": {"positive_label": "a"}},
     "task binary needs exactly 2 label values, found 3"),
    ("binary-text-unnamed", _rows(["yes", "no"] * 10), "binary", {}, "name the positive one with dataset.options"),
    ("binary-positive-not-there", _rows(["yes", "no"] * 10), "binary", {"options": {"positive_label": "Yes"}},
     "positive_label is not one of the 2 label values"),
    ("classes-not-whole", _rows([f"{v / 7:.3f}" for v in range(30)]), "classification", {},
     "looks continuous (numbers that are not whole): a measurement to predict, not classes; did you mean task: regression?"),
    ("classes-one-per-row", _rows([str(25 + 3 * v) for v in range(30)]), "classification", {},
     "looks continuous (30 distinct whole numbers in 30 rows)"),
]


@pytest.mark.parametrize(("make_source", "task", "spec", "message"), [pytest.param(*c[1:], id=c[0]) for c in TASK_REFUSALS])
def test_labels_that_do_not_fit_the_task_fail_staging_with_the_reason(
        bucket: str, tmp_path: Path, make_source: Callable[[Path], str], task: str, spec: dict[str, Any],
        message: str) -> None:
    with pytest.raises(DatasetError) as err:
        stage(make_source(tmp_path), bucket, tmp_path / "work", task=task, **spec)
    assert message in str(err.value)
    assert objects(bucket) == []


def test_a_regression_stages_float_targets_with_the_training_splits_statistics(bucket: str, tmp_path: Path) -> None:
    targets = [25.5 + 3.25 * i for i in range(40)]
    staged = stage(_rows([str(t) for t in targets])(tmp_path), bucket, tmp_path / "work", task="regression")
    m = staged.manifest
    assert (m["task"], m["num_classes"], m["class_names"]) == ("regression", 0, [])
    assert m["label"]["dtype"] == "float32" and m["label"]["shape"] == [1] and m["label"]["names"] == ["target"]
    assert m["splits"]["train"]["class_counts"] is None
    _, y = read_split(staged, "train")
    assert y.dtype == np.float32 and y.shape == (32, 1) and set(y[:, 0].tolist()) <= set(targets)
    assert m["label"]["mean"] == [pytest.approx(float(y.mean()))] and m["label"]["std"] == [pytest.approx(float(y.std()))]
    # The same file as classes is another dataset: the task is part of what is staged.
    with pytest.raises(DatasetError, match="did you mean task: regression"):
        stage(_rows([str(t) for t in targets])(tmp_path / "again"), bucket, tmp_path / "work2")


def test_binary_text_labels_become_the_negative_and_the_named_positive(bucket: str, tmp_path: Path) -> None:
    staged = stage(_rows(["malignant", "benign", "benign"] * 10)(tmp_path), bucket, tmp_path / "work", task="binary",
                   options={"positive_label": "malignant"})
    assert staged.manifest["class_names"] == ["benign", "malignant"]
    assert staged.manifest["splits"]["train"]["class_counts"][1] + staged.manifest["splits"]["validation"]["class_counts"][1] == 10


def test_a_rare_class_is_in_both_splits(bucket: str, tmp_path: Path) -> None:
    """The validation split is drawn class by class: 3 examples of a class among 100 put 1 in
    validation and 2 in training, for every seed of the shuffle (a plain shuffle of 20 from 100 left
    all 3 out of validation for about half of the orders, and the job failed at staging for it)."""
    y = np.array([0] * 60 + [1] * 37 + [2] * 3)
    staged = stage(_npz_of(x=np.arange(100, dtype=np.float32)[:, None], y=y)(tmp_path), bucket, tmp_path / "work")
    splits = staged.manifest["splits"]
    assert splits["validation"]["class_counts"] == [12, 7, 1] and splits["train"]["class_counts"] == [48, 30, 2]
    assert sorted(np.concatenate([read_split(staged, "train")[0][:, 0], read_split(staged, "validation")[0][:, 0]])) \
        == list(range(100))  # every example in exactly one split


def test_many_whole_number_classes_with_enough_rows_stay_classes(bucket: str, tmp_path: Path) -> None:
    staged = stage(_rows([str(v % 12) for v in range(240)])(tmp_path), bucket, tmp_path / "work")
    assert staged.manifest["num_classes"] == 12


# --- a CSV's categorical and text columns (issue 21) -------------------------------------------------


def test_categorical_and_text_columns_stage_their_cells_and_the_training_splits_vocabularies(
        bucket: str, tmp_path: Path) -> None:
    """Types detected (numbers, a few values, sentences) or named; every vocabulary from the training
    split only, most frequent first; the cells themselves in each record's 'xs', missing ones empty."""
    from worker.staging.example_proto import BYTES_LIST, feature_map, feature_values
    from worker.staging.tfrecord import iter_records

    lines = ["age,city,zip,review,label"]
    for i in range(40):
        city = ["Paris", "Lyon", "Lyon", "Nice"][i % 4] if i != 7 else ""
        review = ["Great food, GREAT staff!", "slow service and cold food", "great view"][i % 3]
        lines.append(f"{20 + i},{city},{75000 + i % 3},\"{review}\",{i % 2}")
    path = tmp_path / "people.csv"
    path.write_text("\n".join(lines) + "\n")
    staged = stage(path, bucket, tmp_path / "work", options={"na_policy": "fill", "columns": {"zip": "categorical"}})
    m = staged.manifest
    assert m["feature"]["shape"] == [1] and m["feature"]["strings_key"] == "xs"
    columns = {c["name"]: c for c in m["feature"]["columns"]}
    assert [(c["name"], c["type"], c["index"]) for c in m["feature"]["columns"]] == [
        ("age", "numeric", 0), ("city", "categorical", 0), ("zip", "categorical", 1), ("review", "text", 2)]
    assert "feature columns of people.csv: 1 numeric, 2 categorical, 1 text" in " ".join(m["notes"])

    rows: list[tuple[float, list[str]]] = []
    for split in ("train", "validation"):
        for shard in m["splits"][split]["shards"]:
            data = storage.blob(f"{staged.uri}/{shard}").download_as_bytes()
            for i, record in enumerate(iter_records(io.BytesIO(data), shard)):
                features = feature_map(record, f"record {i}")
                assert features["xs"][0] == BYTES_LIST
                cells = [v.decode() for v in feature_values(*features["xs"])]
                rows.append((float(feature_values(*features["x"])[0]), cells))
        if split == "train":
            train = [cells for _, cells in rows]
    by_age = dict(rows)
    assert by_age[20.0] == ["Paris", "75000", "Great food, GREAT staff!"] and by_age[27.0][0] == ""  # missing: empty
    assert len(rows) == 40
    cities = [c[0] for c in train if c[0]]
    expected = sorted(set(cities), key=lambda v: (-cities.count(v), v))
    assert columns["city"]["vocabulary"] == expected and expected[0] == "Lyon"
    assert columns["zip"]["vocabulary"] == sorted({c[1] for c in train}, key=lambda v: (-[d[1] for d in train].count(v), v))
    words = columns["review"]["vocabulary"]
    assert words[0] == "great" and set(words) <= {"great", "food", "staff", "slow", "service", "and", "cold", "view"}
    assert "GREAT" not in words and "food," not in words  # lower case, punctuation removed, as TextVectorization


# --- the contract with TensorFlow ------------------------------------------------------------------


