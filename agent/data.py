"""The staged dataset: download its shards to local disk, then read them with tf.data.

Staging writes TFRecords of tf.train.Example with the feature flattened into one list; the
manifest says how to parse and reshape it. Shards are copied locally first because TensorFlow's
gs:// filesystem ignores STORAGE_EMULATOR_HOST (and local reads are steadier anyway).
"""

from __future__ import annotations

import itertools
import json
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainjobs import storage
from trainjobs.job_paths import dataset_file, dataset_manifest
from trainjobs.tfrecord import CorruptRecords, split_records
from agent.input_choice import InputChoice, choose_input, machine_memory_bytes, parsed_bytes

SHUFFLE_BUFFER = 16_384
INTERLEAVE_CYCLE = 8  # shards read at once (_records)
# A split held in memory (mode "memory") is fed without tf.data's autotuning: its batches are gathers
# from tensors, which a fixed few in parallel and a few batches ahead keep fed. With autotuning on,
# an iterator's destructor waits for the autotuner's thread to finish an optimization pass, and when
# fit ended during one, the job stalled there for 2.0-2.9 s (seen in 3 of 6 bench jobs; py-spy put the
# agent's main thread in RootDataset::Iterator::~Iterator, waiting on that thread). The one-pass reads
# of a split (read_arrays, read_columns) go without it too: export's read stalled the same way. A
# streamed split keeps autotuning, which sizes its parsing to the host.
MEMORY_PARALLEL_GATHERS = 2
MEMORY_PREFETCH_BATCHES = 8
# A split in memory is gathered up to this many batches, and this many bytes, at a time (train_dataset):
# tf.data's cost is per element, so the pipeline's work per batch (about 0.3 ms of CPU on the bench's
# host, shuffling indices one by one and a gather per batch) shrinks to a slice.
MEMORY_GATHER_BATCHES = 32
MEMORY_GATHER_BYTES = 16 << 20


class DataError(Exception):
    """The staged dataset is missing or not what its manifest says."""


@dataclass(frozen=True)
class Split:
    examples: int
    files: tuple[Path, ...]  # local copies


@dataclass(frozen=True)
class LocalDataset:
    num_classes: int
    class_names: tuple[str, ...]
    feature_key: str
    feature_shape: tuple[int, ...]
    feature_dtype: str
    label_key: str
    train: Split
    validation: Split | None  # staging may be asked for no validation split
    dropped_examples: int = 0  # source rows staging left out (a CSV's missing cells under na_policy drop)
    staging_notes: tuple[str, ...] = ()
    task: str = "classification"  # trainjobs/spec/task.py; manifests before tasks are classification
    target_names: tuple[str, ...] = ()  # regression: the targets, their training-split mean and std
    target_mean: tuple[float, ...] | None = None
    target_std: tuple[float, ...] | None = None
    train_class_counts: tuple[int, ...] | None = None  # examples of each class id in the training split
    # A CSV's feature columns when some are categorical or text (agent/columns.py); feature_shape then
    # counts the numeric ones, and `strings_key` holds the others' cells.
    columns: tuple[dict[str, Any], ...] | None = None
    strings_key: str = "xs"
    # training.distillation (agent/distillation.py): the training split's records also hold the teacher's
    # outputs for each example, `teacher_width` floats under TEACHER_KEY; 0 when there is no teacher.
    teacher_width: int = 0

    @property
    def input_shape(self) -> tuple[int, ...]:
        """What the model takes: the features, or the columns' encoding (agent/columns.py)."""
        if self.columns is None:
            return self.feature_shape
        from agent.columns import encoded_width

        return (encoded_width(self.columns),)

    @property
    def labels(self) -> list[str]:
        """Class id i's name; ids stand for themselves in a manifest without names."""
        return list(self.class_names) or [str(i) for i in range(self.num_classes)]

    @property
    def regression(self) -> bool:
        return self.task == "regression"

    @property
    def multilabel(self) -> bool:
        return self.task == "multilabel"

    def summary(self) -> dict[str, Any]:
        """What the job's record shows of its data."""
        out: dict[str, Any] = {"train_examples": self.train.examples,
                               "validation_examples": self.validation.examples if self.validation else 0,
                               "dropped_examples": self.dropped_examples, "feature_shape": list(self.input_shape),
                               "task": self.task}
        if self.columns is not None:
            out["columns"] = {c["name"]: c["type"] for c in self.columns}
        if self.regression:
            out.update(targets=list(self.target_names), target_mean=list(self.target_mean or ()),
                       target_std=list(self.target_std or ()))
        else:
            out.update(num_classes=self.num_classes, class_names=self.labels)
        return out


def download_dataset(dataset_uri: str, local_dir: Path) -> LocalDataset:
    manifest = storage.read_json(dataset_manifest(dataset_uri))
    if manifest is None:
        raise DataError(f"no manifest.json under {dataset_uri}")
    if manifest.get("format_version") != 1:
        raise DataError(f"unsupported dataset format_version {manifest.get('format_version')!r}")
    splits: dict[str, Split] = {}
    jobs: list[tuple[str, Path]] = []
    for name, split in manifest["splits"].items():
        files = []
        for i, shard in enumerate(split["shards"]):
            uri = shard if shard.startswith("gs://") else dataset_file(dataset_uri, shard)
            local = local_dir / name / f"{i:05d}-{Path(shard).name}"
            jobs.append((uri, local))
            files.append(local)
        splits[name] = Split(int(split["examples"]), tuple(files))
    if "train" not in splits or splits["train"].examples == 0:
        raise DataError(f"dataset {dataset_uri} has no training examples")
    _download_all(jobs)
    feature, label = manifest["feature"], manifest["label"]
    return LocalDataset(
        num_classes=int(manifest["num_classes"]),
        class_names=tuple(manifest.get("class_names") or ()),
        feature_key=feature["key"],
        feature_shape=tuple(int(d) for d in feature["shape"]),
        feature_dtype=feature.get("dtype", "float32"),
        label_key=label["key"],
        train=splits["train"],
        validation=splits["validation"] if splits.get("validation") and splits["validation"].examples else None,
        dropped_examples=int(manifest.get("dropped_examples", 0)),
        staging_notes=tuple(manifest.get("notes", ())),
        **_task_fields(manifest.get("task", "classification"), label),
        train_class_counts=tuple(int(c) for c in counts) if (counts := manifest["splits"]["train"].get("class_counts"))
        else None,
        **_column_fields(feature),
    )


def _column_fields(feature: dict[str, Any]) -> dict[str, Any]:
    if not feature.get("columns"):
        return {}
    return {"columns": tuple(feature["columns"]), "strings_key": feature.get("strings_key", "xs")}


def _task_fields(task: str, label: dict[str, Any]) -> dict[str, Any]:
    if task != "regression":
        return {"task": task}
    return {"task": task, "target_names": tuple(label.get("names") or ("target",)),
            "target_mean": tuple(float(v) for v in label["mean"]), "target_std": tuple(float(v) for v in label["std"])}


LOCAL_DATASET = "dataset.json"  # what the agent downloaded, for a program's runtime (agent/program.py)


def save_local(ds: LocalDataset, local_dir: Path) -> None:
    """Describe a downloaded dataset next to its shards, so a program's runtime reads it without storage."""
    doc = {"num_classes": ds.num_classes, "class_names": list(ds.class_names), "feature_key": ds.feature_key,
           "feature_shape": list(ds.feature_shape), "feature_dtype": ds.feature_dtype, "label_key": ds.label_key,
           "dropped_examples": ds.dropped_examples, "staging_notes": list(ds.staging_notes), "task": ds.task,
           "label": {"names": list(ds.target_names), "mean": list(ds.target_mean or ()), "std": list(ds.target_std or ())},
           "feature": {"columns": list(ds.columns or ()), "strings_key": ds.strings_key},
           "splits": {name: {"examples": split.examples, "files": [str(f.relative_to(local_dir)) for f in split.files]}
                      for name, split in (("train", ds.train), ("validation", ds.validation)) if split is not None}}
    (local_dir / LOCAL_DATASET).write_text(json.dumps(doc))


def load_local(local_dir: Path) -> LocalDataset:
    doc = json.loads((local_dir / LOCAL_DATASET).read_text())
    splits = {name: Split(int(s["examples"]), tuple(local_dir / f for f in s["files"]))
              for name, s in doc["splits"].items()}
    return LocalDataset(
        num_classes=int(doc["num_classes"]), class_names=tuple(doc["class_names"]), feature_key=doc["feature_key"],
        feature_shape=tuple(doc["feature_shape"]), feature_dtype=doc["feature_dtype"], label_key=doc["label_key"],
        train=splits["train"], validation=splits.get("validation"), dropped_examples=int(doc["dropped_examples"]),
        staging_notes=tuple(doc["staging_notes"]), **_task_fields(doc.get("task", "classification"), doc.get("label", {})),
        **_column_fields(doc.get("feature", {})),
    )


def _download_all(jobs: list[tuple[str, Path]]) -> None:
    def fetch(job: tuple[str, Path]) -> None:
        uri, local = job
        local.parent.mkdir(parents=True, exist_ok=True)
        storage.blob(uri).download_to_filename(str(local))

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(fetch, jobs))


TEACHER_KEY = "teacher"


def _parser(ds: LocalDataset, standardized: bool = False, encoded: bool = True, teacher: bool = False) -> Any:
    """Parses a batch of serialized examples at once: one vectorized op instead of one per example.
    `standardized`: a regression's targets as the managed trainer's model learns them (agent/tasks.py);
    otherwise as the data has them. A CSV's named columns are encoded with Keras' preprocessing layers
    (agent/columns.py), or, not `encoded`, given as {input name: [n] tensor}, as the served model takes them.
    `teacher`: the labels come with the teacher's outputs, as (labels, teacher outputs) (agent/distillation.py)."""
    import tensorflow as tf

    from agent import columns

    size = math.prod(ds.feature_shape)
    if ds.feature_dtype.startswith("float"):
        feature = tf.io.FixedLenFeature([size], tf.float32)
    elif ds.feature_dtype.startswith(("int", "uint")):
        feature = tf.io.FixedLenFeature([size], tf.int64)
    else:
        raise DataError(f"feature dtype {ds.feature_dtype!r} is not one the agent can parse")
    # Labels as each task's loss takes them: class ids, a 0/1 column, float targets.
    mean = tf.constant(ds.target_mean or (0.0,), tf.float32)
    std = tf.constant(ds.target_std or (1.0,), tf.float32)
    if ds.regression:
        label = tf.io.FixedLenFeature([len(ds.target_names)], tf.float32)
    elif ds.multilabel:
        label = tf.io.FixedLenFeature([ds.num_classes], tf.float32)  # 0/1, one per label
    else:
        label = tf.io.FixedLenFeature([], tf.int64)
    spec = {ds.feature_key: feature, ds.label_key: label}
    encode = None
    if ds.columns is not None:
        texts = sum(c["type"] != columns.NUMERIC for c in ds.columns)
        spec[ds.strings_key] = tf.io.FixedLenFeature([texts], tf.string)
        if not size:  # every feature column is categorical or text: the records' 'x' is empty
            del spec[ds.feature_key]
        encode = columns.encoder(ds.columns) if encoded else None

    if teacher:
        spec[TEACHER_KEY] = tf.io.FixedLenFeature([ds.teacher_width], tf.float32)

    def parse(serialized: Any) -> tuple[Any, Any]:
        parsed = tf.io.parse_example(serialized, spec)
        x, y = features_and_labels(parsed, serialized)
        return (x, (y, parsed[TEACHER_KEY])) if teacher else (x, y)

    def features_and_labels(parsed: Any, serialized: Any) -> tuple[Any, Any]:
        if ds.feature_key in parsed:
            x = tf.reshape(tf.cast(parsed[ds.feature_key], tf.float32), (-1, *ds.feature_shape))
        else:
            x = tf.zeros((tf.shape(serialized)[0], 0), tf.float32)
        if ds.columns is not None:
            x = columns.named_columns(ds.columns, x, parsed[ds.strings_key])
            x = encode(x) if encode is not None else x
        y = parsed[ds.label_key]
        if ds.task == "binary":
            return x, tf.cast(tf.reshape(y, (-1, 1)), tf.float32)
        if ds.regression:
            return x, (y - mean) / std if standardized else y
        if ds.multilabel:
            return x, y
        return x, tf.cast(y, tf.int32)

    return parse


def served_inputs(ds: LocalDataset) -> Any:
    """A batch of serialized records -> what the exported model serves: the features, or a CSV's raw
    columns by input name (a distillation's teacher is fed this way: agent/distillation.py)."""
    parse = _parser(ds, encoded=False)
    return lambda serialized: parse(serialized)[0]


def _options(autotune: bool = True) -> Any:
    import tensorflow as tf

    options = tf.data.Options()
    options.deterministic = True  # the same seed gives the same batches, on every attempt
    # DATA: every worker reads every shard and keeps its share of the elements, so any shard count
    # works with any worker count (FILE sharding would leave workers idle with few shards).
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    if not autotune:  # MEMORY_PARALLEL_GATHERS says why
        options.autotune.enabled = False
    return options


def input_choice(ds: LocalDataset, cache_dataset: bool | str) -> InputChoice:
    """agent/input_choice.py's rule for this dataset."""
    label_width = len(ds.target_names) if ds.regression else ds.num_classes if ds.multilabel else 1
    examples = ds.train.examples + (ds.validation.examples if ds.validation else 0)
    return choose_input(cache_dataset, ds.train.examples, parsed_bytes(examples, ds.feature_shape, label_width),
                        plain=ds.columns is None and not ds.teacher_width, memory=machine_memory_bytes())


def train_dataset(ds: LocalDataset, global_batch: int, seed: int, mode: str) -> Any:
    """Endless: the plan's steps_per_epoch decides where an epoch ends. With a teacher, each batch's labels
    come with its outputs (the parser's `teacher`). `mode`: input_choice's."""
    if mode == "memory":
        return memory_batches(*_parsed_split(ds, ds.train), global_batch, seed)
    records = _records(ds.train)
    if mode == "stream_cached":
        records = records.cache()
    records = records.shuffle(min(ds.train.examples, SHUFFLE_BUFFER), seed=seed, reshuffle_each_iteration=True)
    # drop_remainder keeps every batch the same shape, which a TPU needs and no one else minds.
    return _parsed(ds, records.repeat().batch(global_batch, drop_remainder=True), teacher=ds.teacher_width > 0)


def memory_batches(x: Any, y: Any, global_batch: int, seed: int) -> Any:
    """Endless training batches of a split held as two tensors (features, labels): memory_batch_indices'
    batches, the examples of up to MEMORY_GATHER_BATCHES of them (and MEMORY_GATHER_BYTES) gathered by
    one op, then handed on a batch at a time."""
    import tensorflow as tf

    example_bytes = sum(t.dtype.size * math.prod(int(d) for d in t.shape[1:]) for t in (x, y))
    per_gather = max(1, min(MEMORY_GATHER_BATCHES, MEMORY_GATHER_BYTES // max(1, global_batch * example_bytes)))
    rows = memory_batch_indices(int(x.shape[0]), global_batch, seed)
    return rows.batch(per_gather).map(lambda i: (tf.gather(x, i), tf.gather(y, i)),
                                      num_parallel_calls=MEMORY_PARALLEL_GATHERS).unbatch() \
        .prefetch(MEMORY_PREFETCH_BATCHES).with_options(_options(autotune=False))


def memory_batch_indices(n: int, global_batch: int, seed: int) -> Any:
    """Endless batches of indices into a split of n examples held in memory: each pass over the split
    is one permutation of it, the passes follow one another, and the batches are cut from that stream
    (a batch may hold the end of one pass and the start of the next, so every example is trained on as
    often as any other). A pass's permutation is one stateless shuffle keyed by the seed and the pass's
    number: the same seed gives the same batches on every attempt, and shuffling costs one op a pass
    instead of tf.data's work per example."""
    import tensorflow as tf

    key = tf.constant(seed, tf.int64)

    def one_pass(number: Any) -> Any:
        return tf.random.experimental.stateless_shuffle(tf.range(n, dtype=tf.int64), seed=tf.stack([key, number]))

    def cut(left: Any, order: Any) -> tuple[Any, Any]:
        joined = tf.concat([left, order], 0)
        whole = tf.shape(joined, out_type=tf.int64)[0] // global_batch * global_batch
        return joined[whole:], tf.reshape(joined[:whole], [-1, global_batch])

    return tf.data.Dataset.counter().map(one_pass).scan(tf.zeros([0], tf.int64), cut).unbatch()


def _records(split: Split) -> Any:
    """A split's serialized examples, its shards read in parallel and in a fixed order."""
    import tensorflow as tf

    files = tf.data.Dataset.from_tensor_slices([str(f) for f in split.files])
    return files.interleave(tf.data.TFRecordDataset, cycle_length=min(len(split.files), INTERLEAVE_CYCLE),
                            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def interleaved(per_file: list[list[bytes]]) -> list[bytes]:
    """_records' order for files that all fit in its cycle: one record of each file in turn, a file
    that has run out skipped (tf.data's deterministic interleave, block length 1)."""
    return [r for turn in itertools.zip_longest(*per_file) for r in turn if r is not None]


def _parsed(ds: LocalDataset, batches: Any, standardized: bool = True, teacher: bool = False) -> Any:
    """Batches of serialized examples as (features, labels), parsed in parallel and prefetched; a
    regression's targets standardised for the managed trainer (a program gets them as the data has them)."""
    import tensorflow as tf

    return batches.map(_parser(ds, standardized, teacher=teacher), num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE).with_options(
        _options())


def eval_dataset(ds: LocalDataset, global_batch: int, static_shapes: bool, mode: str) -> Any:
    import tensorflow as tf

    assert ds.validation is not None
    n = ds.validation.examples
    steps = n // global_batch if static_shapes else -(-n // global_batch)
    if mode == "memory":
        x, y = _parsed_split(ds, ds.validation)
        starts = tf.data.Dataset.range(0, steps * global_batch, global_batch)
        return starts.map(lambda i: (x[i:i + global_batch], y[i:i + global_batch])) \
            .prefetch(MEMORY_PREFETCH_BATCHES).with_options(_options(autotune=False))
    records = tf.data.TFRecordDataset([str(f) for f in ds.validation.files])
    if mode == "stream_cached":
        records = records.cache()
    batches = records.batch(global_batch, drop_remainder=static_shapes)
    # TFRecord files hide their length; telling tf.data lets Keras end each validation pass cleanly
    # instead of warning that the input "ran out of data".
    return _parsed(ds, batches.apply(tf.data.experimental.assert_cardinality(steps)))


def _parsed_split(ds: LocalDataset, split: Split) -> tuple[Any, Any]:
    """A whole split parsed as training takes it (a regression's targets standardised), as two tensors
    on the host."""
    import tensorflow as tf

    # The shards' bytes split into records here, then parsed in one call: handing 80,000 records over
    # through tf.data in batches of 4096 took 0.67-1.3 s on the bench's two cores, this about 0.2 s.
    # In _records' order, so a seed gives the batches it gave before; past its cycle of files that
    # order is tf.data's to keep, and tf.data reads them.
    if len(split.files) > INTERLEAVE_CYCLE:
        with tf.device("/cpu:0"):
            parts = list(_records(split).batch(4096).map(_parser(ds, standardized=True))
                         .with_options(_options(autotune=False)))
            return tf.concat([x for x, _ in parts], 0), tf.concat([y for _, y in parts], 0)
    per_file: list[list[bytes]] = []
    for path in split.files:
        try:
            per_file.append(split_records(path.read_bytes(), path.name))
        except CorruptRecords as exc:
            raise DataError(str(exc)) from None
    records = interleaved(per_file)
    if len(records) != split.examples:
        raise DataError(f"the split holds {len(records)} records where its manifest says {split.examples}")
    with tf.device("/cpu:0"):
        x, y = _parser(ds, standardized=True)(tf.constant(records, tf.string))
        return x, y


def read_arrays(ds: LocalDataset, split: Split, limit: int | None = None) -> tuple[Any, Any]:
    """The first `limit` examples of a split as numpy arrays (statistics, calibration, TFLite eval)."""
    import numpy as np
    import tensorflow as tf

    records = tf.data.TFRecordDataset([str(f) for f in split.files])
    if limit is not None:
        records = records.take(limit)
    xs, ys = [], []
    for x, y in records.batch(1024).map(_parser(ds)).with_options(_options(autotune=False)):
        xs.append(x.numpy())
        ys.append(y.numpy())
    if not xs:
        return np.zeros((0, *ds.input_shape), np.float32), np.zeros((0,), np.int32)
    return np.concatenate(xs), np.concatenate(ys)


def read_columns(ds: LocalDataset, split: Split, limit: int | None = None) -> tuple[dict[str, Any], Any]:
    """A CSV's first `limit` rows of a split as the served model takes them: {input name: numpy [n]}
    (agent/columns.py), with their labels as the data has them."""
    import numpy as np
    import tensorflow as tf

    records = tf.data.TFRecordDataset([str(f) for f in split.files])
    if limit is not None:
        records = records.take(limit)
    parts: dict[str, list[Any]] = {}
    ys = []
    for x, y in records.batch(1024).map(_parser(ds, encoded=False)).with_options(_options(autotune=False)):
        for name, value in x.items():
            parts.setdefault(name, []).append(value.numpy())
        ys.append(y.numpy())
    return {name: np.concatenate(v) for name, v in parts.items()}, (np.concatenate(ys) if ys else np.zeros((0,)))


def split_dataset(ds: LocalDataset, split: str, batch_size: int, *, shuffle: bool, seed: int,
                  drop_remainder: bool) -> Any:
    """One pass over a split as (features, labels) batches, for a program's own fit or loop
    (trainjobs/runtime): finite, so `fit(epochs=N)` ends its epochs by itself."""
    import tensorflow as tf

    chosen = {"train": ds.train, "validation": ds.validation}.get(split)
    if chosen is None:
        raise DataError(f"the dataset has no {split!r} split (it has: train"
                        f"{', validation' if ds.validation else ''})")
    records = _records(chosen)
    if shuffle:
        records = records.shuffle(min(chosen.examples, SHUFFLE_BUFFER), seed=seed, reshuffle_each_iteration=True)
    batches = records.batch(batch_size, drop_remainder=drop_remainder)
    steps = chosen.examples // batch_size if drop_remainder else -(-chosen.examples // batch_size)
    return _parsed(ds, batches.apply(tf.data.experimental.assert_cardinality(steps)), standardized=False)
