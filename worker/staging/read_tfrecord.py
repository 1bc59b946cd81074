"""TFRecord files of tf.train.Example in the layouts people write -> Examples.

    our schema            x: float_list (flattened), y: int64_list                 (example_proto.py)
    TF's image layout     image/encoded: bytes_list (PNG/JPEG/...), image/class/label: int64_list
                          (what TF's own image tools and many TFDS exports write)
    your names            dataset.options x_key (one float/int64 list or encoded image) or features
                          (several float/int64 lists, concatenated in order), y_key (int64 class ids,
                          or byte-string class names)

With no names given, a file in our schema is read as such, else the image layout. Encoded images
are decoded with Pillow and scaled to [0, 1] like an image folder; they keep their decoded
[height, width, channels] unless image_shape resizes them. A flat list is reshaped to image_shape
when it is given. Files may be GZIP or ZLIB compressed (compression, detected under auto).
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np

from worker.staging.budget import StagingBudget
from worker.staging.errors import DatasetError, short
from worker.staging.example_proto import BYTES_LIST, FLOAT_LIST, INT64_LIST, feature_map, feature_values
from worker.staging.examples import Examples, make_examples
from worker.staging.options import TfrecordOptions
from worker.staging.tfrecord import iter_records, open_records

IMAGE_LAYOUT = ("image/encoded", "image/class/label")
_MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}
_CHANNELS = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4}
_STOP_EVERY = 4096


def read_tfrecord_files(paths: list[Path], root: Path, o: TfrecordOptions, budget: StagingBudget) -> Examples:
    xs: list[np.ndarray] = []
    labels: list[int | str] = []
    keys: tuple[list[str], str] | None = None
    compressed: dict[str, int] = {}
    for path in paths:
        budget.check_stop()
        name = str(path.relative_to(root)) if path != root else path.name
        with open_records(path, o.compression) as (stream, compression):
            if compression != "none":
                compressed[compression] = compressed.get(compression, 0) + 1
            for i, record in enumerate(iter_records(stream, name)):
                if i % _STOP_EVERY == _STOP_EVERY - 1:
                    budget.check_stop()
                where = f"{name} record {i}"
                features = feature_map(record, where)
                if keys is None:
                    keys = _keys(features, o, where)
                x, y = _example(features, keys, o, where)
                if xs and x.shape != xs[0].shape:
                    raise DatasetError(f"{where}: a feature of shape {list(x.shape)} where earlier records have "
                                       f"{list(xs[0].shape)}" + ("; set dataset.options.image_shape to resize images"
                                                                  if x.ndim == 3 else ""))
                xs.append(x)
                labels.append(y)
    if not xs:
        raise DatasetError(f"{root.name} holds no examples")
    if any(isinstance(v, str) for v in labels) and not all(isinstance(v, str) for v in labels):
        raise DatasetError("the TFRecord labels mix class ids and class names")
    notes = [f"{n} of {len(paths)} TFRecord files read as {kind.upper()}-compressed"
             + (" (detected)" if o.compression == "auto" else "") for kind, n in sorted(compressed.items())]
    # Class names as Python strings: a fixed-width array would size every label by the longest.
    label_array = np.asarray(labels, dtype=object) if isinstance(labels[0], str) else np.asarray(labels)
    return make_examples(np.stack(xs), label_array, root.name, notes=notes)


def _keys(features: dict[str, tuple[int, bytes]], o: TfrecordOptions, where: str) -> tuple[list[str], str]:
    """(the features that make x, the label feature), from the options or the record's layout."""
    if o.features is not None:
        x_keys = list(o.features)
    elif o.x_key is not None:
        x_keys = [o.x_key]
    elif "x" in features:
        x_keys = ["x"]
    elif IMAGE_LAYOUT[0] in features:
        x_keys = [IMAGE_LAYOUT[0]]
    else:
        # The record's feature names are the file's bytes: count them, never quote them.
        raise DatasetError(f"{where} is not in our TFRecord schema (feature 'x') nor TF's image layout "
                           f"({IMAGE_LAYOUT[0]!r}); it has {len(features)} other features: name yours with "
                           "dataset.options.x_key or features")
    if o.y_key is not None:
        y_key = o.y_key
    else:
        y_key = next((k for k in ("y", IMAGE_LAYOUT[1], "label") if k in features), "")
        if not y_key:
            raise DatasetError(f"{where} has no label feature 'y', {IMAGE_LAYOUT[1]!r} or 'label'; name yours with "
                               "dataset.options.y_key")
    return x_keys, y_key


def _example(features: dict[str, tuple[int, bytes]], keys: tuple[list[str], str], o: TfrecordOptions,
             where: str) -> tuple[np.ndarray, int | str]:
    x_keys, y_key = keys
    parts = []
    for key in x_keys:
        if key not in features:
            raise DatasetError(f"{where} has no feature {short(key)} (dataset.options)")
        kind, payload = features[key]
        if kind == BYTES_LIST:
            if len(x_keys) > 1:
                raise DatasetError(f"{where}: feature {short(key)} holds bytes; only float and int64 lists concatenate")
            return _image(feature_values(kind, payload), o, where), _label(features, y_key, where)
        parts.append(np.asarray(feature_values(kind, payload), dtype=np.float32))
    x = np.concatenate(parts) if len(parts) > 1 else parts[0]
    if o.image_shape is not None:
        if x.size != math.prod(o.image_shape):
            raise DatasetError(f"{where}: {x.size} values cannot be reshaped to image_shape {list(o.image_shape)}")
        x = x.reshape(o.image_shape)
    return x, _label(features, y_key, where)


def _label(features: dict[str, tuple[int, bytes]], key: str, where: str) -> int | str:
    if key not in features:
        raise DatasetError(f"{where} has no label feature {short(key)}")
    kind, payload = features[key]
    values = feature_values(kind, payload)
    if len(values) != 1:
        raise DatasetError(f"{where}: the label feature {short(key)} must hold one value, it holds {len(values)}")
    if kind == INT64_LIST:
        return int(values[0])
    if kind == FLOAT_LIST:
        value = float(values[0])
        if not value.is_integer():
            raise DatasetError(f"{where}: the label {short(key)} is a number that is not a whole class id")
        return int(value)
    raw = values[0]
    assert isinstance(raw, bytes)
    return raw.decode("utf-8", "replace")


def _image(values: np.ndarray | list[bytes], o: TfrecordOptions, where: str) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError  # lazy: only image records need Pillow

    if len(values) != 1:
        raise DatasetError(f"{where}: an encoded image feature must hold one image, it holds {len(values)}")
    raw = values[0]
    assert isinstance(raw, bytes)
    try:
        with Image.open(io.BytesIO(raw)) as opened:
            image: Image.Image = opened
            if o.image_shape is not None:
                height, width, channels = o.image_shape
                image = image.convert(_MODES[channels]).resize((width, height), Image.Resampling.BILINEAR)
            elif image.mode not in _CHANNELS:
                image = image.convert("RGB")
            pixels = np.asarray(image, dtype=np.float32)
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise DatasetError(f"{where}: the encoded image is not readable ({type(exc).__name__})") from None
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    return pixels / np.float32(255.0)
