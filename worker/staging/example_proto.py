"""tf.train.Example in the protobuf wire format, written and read without TensorFlow.

Our record schema (the contract with the training agent):

    Example{features: Features{feature: {
        "x": Feature{float_list: FloatList{value: [...]}},   # the example's features, flattened, float32
        "y": Feature{int64_list: Int64List{value: [label]}},  # exactly one class id, 0..num_classes-1
    }}}

Wire layout (example.proto / feature.proto): Example.features = 1; Features.feature = 1 is a
map<string, Feature>, i.e. repeated entries {key = 1, value = 2}; Feature.float_list = 2,
Feature.int64_list = 3; FloatList.value = 1 and Int64List.value = 1 are packed. Within a batch
every record has the same layout except the label's varint, so `encode_examples` builds whole
batches as numpy byte matrices, one per varint length.
"""

from __future__ import annotations

import numpy as np

from worker.staging.errors import DatasetError

SCHEMA = ("feature 'x' = float_list (flattened float32 features), feature 'y' = int64_list holding one class id "
          "(or a float_list of regression targets)")


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _len_field(field: int, payload_len: int) -> bytes:
    """Tag and length of a length-delimited field (wire type 2); the payload follows."""
    return bytes([field << 3 | 2]) + varint(payload_len)


def _label_varint_lengths(y: np.ndarray) -> np.ndarray:
    u = y.astype(np.uint64)  # negative ids would be 10-byte varints; we only write 0..K-1
    length = np.ones(len(u), dtype=np.int64)
    for k in range(1, 10):
        length += u >= np.uint64(1 << (7 * k))
    return length


def _float_entry(name: bytes, values: np.ndarray) -> np.ndarray:
    """Each row's Features.feature map entry {name: float_list(values[i])}, as a uint8 matrix [n, width]
    (every row the same width: packed floats have a fixed size)."""
    n, dim = values.shape
    floats = np.ascontiguousarray(values, dtype="<f4").view(np.uint8).reshape(n, 4 * dim)
    float_list = _len_field(1, 4 * dim)
    feature = _len_field(2, len(float_list) + 4 * dim) + float_list
    tail = len(feature) + 4 * dim
    entry = b"\x0a" + varint(len(name)) + name + _len_field(2, tail)
    head = _len_field(1, len(entry) + tail) + entry + feature
    out = np.empty((n, len(head) + 4 * dim), dtype=np.uint8)
    out[:, : len(head)] = np.frombuffer(head, np.uint8)
    out[:, len(head):] = floats
    return out


def encode_float_label_examples(x: np.ndarray, y: np.ndarray) -> list[bytes]:
    """Serialized Examples for float32 features x [n, D] and float32 targets y [n, K] (a regression's:
    feature 'y' is a float_list), in order."""
    entries = np.concatenate([_float_entry(b"x", x), _float_entry(b"y", y)], axis=1)
    prefix = np.frombuffer(_len_field(1, entries.shape[1]), np.uint8)
    rows = np.concatenate([np.broadcast_to(prefix, (len(entries), len(prefix))), entries], axis=1)
    return [row.tobytes() for row in rows]


def encode_examples(x: np.ndarray, y: np.ndarray) -> list[bytes]:
    """Serialized Examples for float32 features x [n, D] and int64 labels y [n], in order; float
    targets y [n, K] go to encode_float_label_examples."""
    if y.dtype.kind == "f":
        return encode_float_label_examples(x, y)
    n, dim = x.shape
    floats = np.ascontiguousarray(x, dtype="<f4").view(np.uint8).reshape(n, 4 * dim)
    float_list = _len_field(1, 4 * dim)  # FloatList.value, packed; the floats follow
    feature_x = _len_field(2, len(float_list) + 4 * dim) + float_list
    entry_x_tail = len(feature_x) + 4 * dim
    entry_x = b"\x0a\x01x" + _len_field(2, entry_x_tail)
    x_head = _len_field(1, len(entry_x) + entry_x_tail) + entry_x + feature_x
    x_len = len(x_head) + 4 * dim

    out: list[bytes] = [b""] * n
    lengths = _label_varint_lengths(y)
    for vlen in np.unique(lengths).tolist():
        rows = np.flatnonzero(lengths == vlen)
        int64_list = _len_field(1, vlen)  # Int64List.value, packed; the varint follows
        feature_y = _len_field(3, len(int64_list) + vlen) + int64_list
        entry_y = b"\x0a\x01y" + _len_field(2, len(feature_y) + vlen) + feature_y
        y_head = _len_field(1, len(entry_y) + vlen) + entry_y
        prefix = _len_field(1, x_len + len(y_head) + vlen) + x_head
        width = len(prefix) + 4 * dim + len(y_head) + vlen
        body = np.empty((len(rows), width), dtype=np.uint8)
        body[:, : len(prefix)] = np.frombuffer(prefix, np.uint8)
        at = len(prefix) + 4 * dim
        body[:, len(prefix) : at] = floats[rows]
        body[:, at : at + len(y_head)] = np.frombuffer(y_head, np.uint8)
        labels = y[rows].astype(np.uint64)
        for k in range(vlen):
            byte = (labels >> np.uint64(7 * k)) & np.uint64(0x7F)
            body[:, at + len(y_head) + k] = byte | np.uint64(0x80 if k < vlen - 1 else 0)
        for i, row in zip(rows.tolist(), body, strict=True):
            out[i] = row.tobytes()
    return out


def _bytes_entry(name: bytes, values: list[bytes]) -> bytes:
    """A Features.feature map entry {name: bytes_list(values)}."""
    bytes_list = b"".join(_len_field(1, len(v)) + v for v in values)  # BytesList.value, repeated
    feature = _len_field(BYTES_LIST, len(bytes_list)) + bytes_list
    entry = b"\x0a" + varint(len(name)) + name + _len_field(2, len(feature)) + feature
    return _len_field(1, len(entry)) + entry


def with_strings(records: list[bytes], strings: np.ndarray, key: bytes = b"xs") -> list[bytes]:
    """Each serialized Example with one more feature, `key`: a bytes_list of its row of `strings` [n, k]
    (a CSV's categorical and text cells, UTF-8)."""
    out = []
    for record, row in zip(records, strings.tolist(), strict=True):
        features, at = _read_varint(record, 1)  # record = 0x0a, varint(len(Features)), Features
        body = record[at:at + features] + _bytes_entry(key, [str(v).encode("utf-8") for v in row])
        out.append(_len_field(1, len(body)) + body)
    return out


# --- reading -------------------------------------------------------------------------------------


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, int, bytes | int]]:
    """(field number, wire type, payload) for each field of one message; groups are refused."""
    out: list[tuple[int, int, bytes | int]] = []
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
            out.append((field, wire, value))
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            out.append((field, wire, buf[pos : pos + size]))
            pos += size
        elif wire == 2:
            size, pos = _read_varint(buf, pos)
            out.append((field, wire, buf[pos : pos + size]))
            pos += size
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > len(buf):
            raise ValueError("field runs past the end of the message")
    return out


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _float_values(buf: bytes) -> np.ndarray:
    chunks = [p for f, w, p in _fields(buf) if f == 1 and isinstance(p, bytes) and w in (2, 5)]
    return np.frombuffer(b"".join(chunks), dtype="<f4")  # packed and unpacked floats are both raw 4-byte LE


def _int64_values(buf: bytes) -> list[int]:
    values: list[int] = []
    for field, wire, payload in _fields(buf):
        if field != 1:
            continue
        if wire == 0 and isinstance(payload, int):
            values.append(_signed(payload))
        elif wire == 2 and isinstance(payload, bytes):
            pos = 0
            while pos < len(payload):
                v, pos = _read_varint(payload, pos)
                values.append(_signed(v))
    return values


class NotOurSchema(DatasetError):
    """A record that is a tf.train.Example, but not in our schema: converting it may still work."""


FLOAT_LIST, INT64_LIST, BYTES_LIST = 2, 3, 1  # Feature's oneof field numbers (feature.proto)


def feature_map(record: bytes, where: str) -> dict[str, tuple[int, bytes]]:
    """{name: (Feature kind, list payload)} for one serialized Example; a DatasetError naming `where`
    for bytes that are not one."""
    try:
        return _feature_map(record)
    except ValueError as exc:
        raise DatasetError(f"{where} is not a valid tf.train.Example ({exc})") from None


def feature_values(kind: int, payload: bytes) -> np.ndarray | list[bytes]:
    """A feature's values: float32 for a float_list, int64 for an int64_list, byte strings for a bytes_list."""
    if kind == FLOAT_LIST:
        return _float_values(payload)
    if kind == INT64_LIST:
        return np.asarray(_int64_values(payload), dtype=np.int64)
    return [p for f, w, p in _fields(payload) if f == 1 and isinstance(p, bytes)]


def _feature_map(record: bytes) -> dict[str, tuple[int, bytes]]:
    """{name: (Feature oneof field number, list payload)} for one serialized Example."""
    features: dict[str, tuple[int, bytes]] = {}
    for field, _, features_msg in _fields(record):
        if field != 1 or not isinstance(features_msg, bytes):
            continue
        for f, _, entry in _fields(features_msg):
            if f != 1 or not isinstance(entry, bytes):
                continue
            parts = {ef: p for ef, _, p in _fields(entry) if isinstance(p, bytes)}
            kinds = [(kf, p) for kf, _, p in _fields(parts.get(2, b"")) if isinstance(p, bytes)]
            if kinds:
                features[parts.get(1, b"").decode("utf-8", "replace")] = kinds[-1]
    return features


def decode_example(record: bytes, where: str) -> tuple[np.ndarray, int | np.ndarray]:
    """(x, y) from one serialized Example in our schema; anything else is a DatasetError naming `where`.
    y is the class id, or a regression's float32 targets when 'y' is a float_list."""
    try:
        features = _feature_map(record)
        x_kind, y_kind = features.get("x"), features.get("y")
        if x_kind is not None and y_kind is not None and x_kind[0] == 2 and y_kind[0] == 2:
            return _float_values(x_kind[1]), _float_values(y_kind[1])
        if x_kind is None or y_kind is None or x_kind[0] != 2 or y_kind[0] != 3:
            # The feature names are the file's bytes: count them, never quote them.
            raise NotOurSchema(f"{where} is not in our TFRecord schema ({SCHEMA}); it has {len(features)} other or "
                               "differently typed features: name yours with dataset.options x_key, y_key or features")
        labels = _int64_values(y_kind[1])
        if len(labels) != 1:
            raise DatasetError(f"{where}: feature 'y' must hold exactly one class id, it holds {len(labels)}")
        return _float_values(x_kind[1]), labels[0]
    except ValueError as exc:
        raise DatasetError(f"{where} is not a valid tf.train.Example ({exc})") from None
