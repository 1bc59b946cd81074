"""TFRecords as TensorFlow itself writes them (tf.train.Example, tf.io.TFRecordWriter with and
without GZIP/ZLIB), staged without TensorFlow; and what a job hands back about its classes:
labels.json, a SavedModel signature that returns class names, an integer-only TFLite model
(issue 11). One TensorFlow process: this module's."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.staging import OPERATORS_BUCKET, PROJECT, operators_folder, read_split, stage
from tests.support.staging import operator_allows_test_files  # noqa: F401 - an autouse fixture
from trainjobs.spec import DatasetSpec, TfliteExport
from worker.staging import DatasetError, stage_dataset

pytestmark = pytest.mark.tf

CLASSES = ("circle", "square")


def _png(side: int, value: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (side, side + 2), (value, value, 255 - value)).save(out, format="PNG")
    return out.getvalue()


def write_records(path: Path, examples: list[dict[str, Any]], compression: str | None = None) -> Path:
    """Each example a dict of feature name -> list of floats, ints or bytes, written by TensorFlow."""
    import tensorflow as tf

    def feature(values: list[Any]) -> Any:
        if isinstance(values[0], bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
        if isinstance(values[0], float):
            return tf.train.Feature(float_list=tf.train.FloatList(value=values))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path), options=compression) as writer:
        for example in examples:
            features = tf.train.Features(feature={k: feature(v) for k, v in example.items()})
            writer.write(tf.train.Example(features=features).SerializeToString())
    return path


def test_tf_image_layout_keeps_its_image_shape_and_reads_gzip(bucket: str, tmp_path: Path) -> None:
    """image/encoded + image/class/label, as TF's own image tools write them, GZIP-compressed."""
    examples = [{"image/encoded": [_png(6, 10 * i)], "image/class/label": [i % 2], "image/format": [b"png"]}
                for i in range(20)]
    path = write_records(tmp_path / "images" / "train.tfrecord.gz", examples, "GZIP")
    staged = stage(path, bucket, format="tfrecord", options={"validation_split": 0.0})
    assert staged.manifest["feature"]["shape"] == [8, 6, 3]  # height, width, channels as decoded
    assert staged.manifest["notes"] == ["1 of 1 TFRecord files read as GZIP-compressed (detected)"]
    assert staged.manifest["class_names"] == ["0", "1"]
    resized = stage(path, bucket, format="tfrecord", options={"image_shape": [4, 4, 1], "validation_split": 0.0})
    assert resized.manifest["feature"]["shape"] == [4, 4, 1]


def test_tfrecords_in_gcs_in_another_layout_are_converted_not_used_in_place(bucket: str, tmp_path: Path) -> None:
    from trainjobs import storage

    examples = [{"image/encoded": [_png(6, 10 * i)], "image/class/label": [i % 2]} for i in range(10)]
    path = write_records(tmp_path / "train.tfrecord", examples)
    from trainjobs.source_rules import DataAccessRules

    raw = operators_folder()  # a bucket the operator allows data from (TRAINJOBS_SOURCE_BUCKETS)
    storage.blob(f"{raw}/images/train.tfrecord").upload_from_filename(str(path))
    staged = stage_dataset(DatasetSpec(source=f"{raw}/images/"), project_id=PROJECT, bucket=bucket,
                           work_dir=tmp_path / "work", rules=DataAccessRules(source_buckets=frozenset({OPERATORS_BUCKET})))
    assert staged.manifest["in_place"] is False and staged.manifest["feature"]["shape"] == [8, 6, 3]


def test_user_feature_names_float_lists_and_byte_string_labels_in_zlib(bucket: str, tmp_path: Path) -> None:
    examples = [{"petal": [float(i), float(i) / 2], "sepal": [1.0], "species": [CLASSES[i % 2].encode()]}
                for i in range(10)]
    path = write_records(tmp_path / "flowers.tfrecord", examples, "ZLIB")
    staged = stage(path, bucket, options={"features": ["sepal", "petal"], "y_key": "species", "validation_split": 0.0})
    m = staged.manifest
    assert m["feature"]["shape"] == [3] and m["class_names"] == list(CLASSES)
    x, y = read_split(staged, "train")
    assert sorted(x.tolist()) == sorted([[1.0, float(i), i / 2] for i in range(10)])


def test_an_int64_list_is_reshaped_to_image_shape(bucket: str, tmp_path: Path) -> None:
    examples = [{"pixels": list(range(i, i + 16)), "digit": [i % 3]} for i in range(12)]
    path = write_records(tmp_path / "d.tfrecord", examples)
    staged = stage(path, bucket, options={"x_key": "pixels", "y_key": "digit", "image_shape": [4, 4, 1]})
    assert staged.manifest["feature"]["shape"] == [4, 4, 1] and staged.manifest["num_classes"] == 3


@pytest.mark.parametrize(("compression", "options", "message"), [
    ("GZIP", {"compression": "none"}, "d.tfrecord looks GZIP-compressed; set dataset.options.compression to gzip"),
    ("ZLIB", {"compression": "none"}, "d.tfrecord looks ZLIB-compressed"),
    (None, {"compression": "gzip"}, "d.tfrecord cannot be decompressed"),
    (None, {"x_key": "nothing"}, "d.tfrecord record 0 has no feature 'nothing'"),
    (None, {"image_shape": [3, 3, 1]}, "2 values cannot be reshaped to image_shape [3, 3, 1]"),
])
def test_tfrecord_errors_say_what_to_set(bucket: str, tmp_path: Path, compression: str | None,
                                         options: dict[str, Any], message: str) -> None:
    path = write_records(tmp_path / "d.tfrecord", [{"x": [1.0, 2.0], "y": [i % 2]} for i in range(4)], compression)
    with pytest.raises(DatasetError, match=re.escape(message)):
        stage(path, bucket, options=options)


# --- what the user gets back ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A small trained classifier of three well separated clusters, exported as a job exports it."""
    import keras

    from agent import export

    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 300)
    x = (np.eye(3)[y] * 4 + rng.normal(0, 0.5, (300, 3))).astype(np.float32)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="sparse_categorical_crossentropy")
    model.fit(x, y, epochs=20, verbose=0)
    out = tmp_path_factory.mktemp("export")
    names = ["setosa", "versicolor", "virginica"]
    export.save_model(model, (3,), out / "saved_model", export.classes_doc(names))
    export.write_labels(out / export.LABELS_NAME, export.classes_doc(names))
    return {"dir": out, "x": x, "y": y, "names": names, "model": model}


def test_labels_json_maps_class_ids_to_names(exported: dict[str, Any]) -> None:
    for path in (exported["dir"] / "labels.json", exported["dir"] / "saved_model" / "assets" / "labels.json"):
        doc = json.loads(path.read_text())
        assert doc == {"task": "classification", "num_classes": 3, "class_names": exported["names"],
                       "label_mapping": {"0": "setosa", "1": "versicolor", "2": "virginica"}}


def test_saved_model_classify_signature_returns_class_names(exported: dict[str, Any]) -> None:
    import tensorflow as tf

    loaded = tf.saved_model.load(str(exported["dir"] / "saved_model"))
    x = exported["x"][:20]
    result = loaded.signatures["classify"](x=tf.constant(x))
    ids = result["class_id"].numpy()
    assert ids.tolist() == exported["model"](x).numpy().argmax(axis=-1).tolist()
    assert [n.decode() for n in result["class_name"].numpy()] == [exported["names"][i] for i in ids]
    assert loaded.serve(tf.constant(x)).shape == (20, 3)  # the plain serving endpoint is unchanged


@pytest.mark.parametrize("io_type", ["float32", "int8", "uint8"])
def test_int8_tflite_keeps_float_io_unless_asked_and_predicts_either_way(exported: dict[str, Any], io_type: str) -> None:
    from agent.export import interpreter_of, tflite_scores, to_tflite

    options = TfliteExport(quantization="int8", calibration_examples=100, io_type=io_type)  # type: ignore[arg-type]
    flatbuffer = to_tflite(exported["dir"] / "saved_model", options, exported["x"][:100])
    interpreter = interpreter_of(flatbuffer)
    expected = {"float32": np.float32, "int8": np.int8, "uint8": np.uint8}[io_type]
    assert interpreter.get_input_details()[0]["dtype"] == expected
    assert interpreter.get_output_details()[0]["dtype"] == expected
    accuracy = tflite_scores(flatbuffer, "classification", exported["x"], exported["y"])["tflite_accuracy"]
    assert accuracy is not None and accuracy > 0.9
