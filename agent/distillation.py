"""training.distillation (issue 23): the student (this job's model) learns from an earlier job's exported
SavedModel as well as from the labels.

Not Keras's own `keras.distillation.Distiller` (Keras >= 3.12), for four reasons:
- the teacher is a SavedModel, not a Keras model: the Distiller would run it (as a TFSMLayer) inside
  every training step, on every replica, under the strategy and the mixed-precision policy, and on a
  TPU inside the compiled step;
- the Distiller wraps the student in a model of its own, which our checkpoints, pruning masks and
  export (agent/run.py) would then have to look through;
- its LogitsDistillation takes logits, and our models end in a softmax or a sigmoid (agent/tasks.py);
- the machine images' Keras (3.4 and 3.6, mk/images.mk) has no keras.distillation.
So the teacher runs once, on the host, over the training split before training (`teach`): its outputs
for each example are appended to that example's record, the input pipeline hands them to the step with
the labels, and `install` makes the student's loss
    alpha x (the task's loss on the labels) + (1 - alpha) x T^2 x KL(teacher_T || student_T),
where _T is a distribution softened by the temperature T (Hinton et al. 2015; keras.io's "Knowledge
Distillation" example, whose alpha also weighs the labels). Probabilities are turned back into logits
for the softening: log p for a softmax (exact up to a constant, which a softmax ignores), log p - log(1 - p)
for a sigmoid (exact until float32 rounds p to 1, about logit 16.6). Validation scores the labels alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import keras
from keras import ops

from trainjobs import storage
from trainjobs.job_paths import ARTIFACT_MANIFEST, JobPaths
from agent.data import TEACHER_KEY, DataError, LocalDataset, Split, read_arrays, read_columns, served_inputs

log = logging.getLogger("trainjobs.agent")

BATCH = 256
EPS = 1e-30  # the smallest probability taken as is: float32 holds it, and log(1e-30)/T moves nothing


@dataclasses.dataclass(frozen=True)
class Teacher:
    job_id: str
    saved_model: Path
    labels: dict[str, Any]
    seconds: float  # downloading, loading and running it over the training split


def teach(paths: JobPaths, teacher_job: str, data: LocalDataset, local: Path) -> tuple[LocalDataset, Teacher]:
    """The training split with the teacher's outputs in each record, and the teacher."""
    import tensorflow as tf

    began = time.monotonic()
    teacher_dir = download(paths.beside(teacher_job), local / "model")
    labels = json.loads((teacher_dir / "labels.json").read_text())
    _check_classes(teacher_job, labels, data)
    served = tf.saved_model.load(str(teacher_dir / "saved_model"))
    inputs = served_inputs(data)  # what the teacher serves: a CSV's raw rows too
    files, width = [], 0
    for i, shard in enumerate(data.train.files):
        out = local / "train" / f"{i:05d}-{shard.name}"
        out.parent.mkdir(parents=True, exist_ok=True)
        with tf.io.TFRecordWriter(str(out)) as writer:
            for serialized in tf.data.TFRecordDataset(str(shard)).batch(BATCH):
                try:
                    outputs = served.serve(inputs(serialized)).numpy().reshape(len(serialized), -1)
                except (tf.errors.InvalidArgumentError, ValueError, TypeError) as exc:
                    raise DataError(f"training.distillation.teacher_job: job {teacher_job}'s model does not take "
                                    f"this job's examples (shape {list(data.input_shape)}): {str(exc)[:300]}") from None
                width = outputs.shape[1]
                for record, row in zip(serialized.numpy(), outputs, strict=True):
                    writer.write(record + _teacher_feature(row))
        files.append(out)
    student_width = data.num_classes if data.task != "binary" else 1
    if width != student_width:
        raise DataError(f"training.distillation.teacher_job: job {teacher_job}'s model answers {width} outputs per "
                        f"example, this job's model {student_width}")
    taught = dataclasses.replace(data, train=Split(data.train.examples, tuple(files)), teacher_width=width)
    seconds = time.monotonic() - began
    log.info("teacher %s: its outputs for %d training examples in %.1f s", teacher_job, data.train.examples, seconds)
    return taught, Teacher(teacher_job, teacher_dir / "saved_model", labels, seconds)


def _teacher_feature(row: Any) -> bytes:
    """A serialized tf.train.Example holding only the teacher's outputs. Protocol buffers merge two
    messages when their encodings are concatenated, and a map field (Features.feature) merges by key, so
    a record followed by these bytes is that record with one more feature, without parsing it."""
    import tensorflow as tf

    feature = tf.train.Feature(float_list=tf.train.FloatList(value=[float(v) for v in row]))
    encoded: bytes = tf.train.Example(features=tf.train.Features(feature={TEACHER_KEY: feature})).SerializeToString()
    return encoded


def download(teacher: JobPaths, local: Path) -> Path:
    """The teacher's SavedModel and labels.json, each file checked against the sha256 its artifact
    manifest gives (the student's boundary lets it read the teacher's artifacts/ and nothing else)."""
    manifest = storage.read_json(teacher.artifact_manifest)
    if not isinstance(manifest, list):
        raise DataError(f"training.distillation.teacher_job: {teacher.artifacts} has no artifact manifest")
    wanted = [e for e in manifest if isinstance(e, dict) and _wanted(str(e.get("path", "")))]
    if not any(e["path"] == "labels.json" for e in wanted) or not any(e["path"].startswith("saved_model/") for e in wanted):
        raise DataError(f"training.distillation.teacher_job: {teacher.artifacts} holds no SavedModel with its labels.json")
    for entry in wanted:
        path = local / entry["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        storage.blob(teacher.artifact(entry["path"])).download_to_filename(str(path))
        if hashlib.sha256(path.read_bytes()).hexdigest() != entry.get("sha256"):
            raise DataError(f"training.distillation.teacher_job: {entry['path']} of {teacher.artifacts} is not the "
                            "file its manifest lists (sha256 differs)")
    return local


def _wanted(rel: str) -> bool:
    parts = rel.split("/")
    safe = bool(rel) and not rel.startswith("/") and all(p not in ("", ".", "..") for p in parts)
    return safe and (rel == "labels.json" or parts[0] == "saved_model")


def _check_classes(teacher_job: str, labels: dict[str, Any], data: LocalDataset) -> None:
    """The worker checked the teacher's recorded classes at staging; its labels.json is what its outputs
    mean, so it must say the same."""
    theirs = labels.get("task", "classification"), list(labels.get("class_names") or [])
    ours = data.task, data.labels
    if theirs != ours:
        raise DataError(f"training.distillation.teacher_job: job {teacher_job}'s model answers task {theirs[0]} "
                        f"over {theirs[1][:8]}, this job's data is task {ours[0]} over {ours[1][:8]}")


def install(model: Any, task: str, temperature: float, alpha: float) -> None:
    """Make the compiled `model` learn from (labels, teacher outputs) where a batch brings both (training),
    and from the labels alone where it brings only them (validation). On the model itself, not on a
    wrapping model as Keras's Distiller does: the student stays what is checkpointed, pruned and exported.
    Keras looks compute_loss and compute_metrics up on the model for every step it traces."""
    plain_loss, plain_metrics = model.compute_loss, model.compute_metrics
    softened = SoftenedDivergence(task, temperature)

    def compute_loss(x: Any = None, y: Any = None, y_pred: Any = None, sample_weight: Any = None,
                     training: bool = True) -> Any:
        if not isinstance(y, tuple):
            return plain_loss(x, y, y_pred, sample_weight, training=training)
        labels, teacher = y
        hard = plain_loss(x, labels, y_pred, sample_weight, training=training)
        return alpha * hard + (1.0 - alpha) * softened(teacher, y_pred, sample_weight)

    def compute_metrics(x: Any, y: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        return plain_metrics(x, y[0] if isinstance(y, tuple) else y, y_pred, sample_weight)

    model.compute_loss, model.compute_metrics = compute_loss, compute_metrics


class SoftenedDivergence(keras.losses.Loss):
    """T^2 x KL(teacher_T || student_T) per example, from the two models' probabilities. A Keras Loss, so
    it is reduced and scaled over the replicas exactly as the task's loss is."""

    def __init__(self, task: str, temperature: float):
        super().__init__(name="distillation", reduction="sum_over_batch_size")
        self.sigmoid, self.temperature = task != "classification", float(temperature)

    def call(self, teacher: Any, student: Any) -> Any:
        t, s = ops.cast(teacher, "float32"), ops.cast(student, "float32")
        temp = self.temperature
        if not self.sigmoid:
            soft = ops.softmax(ops.log(ops.maximum(t, EPS)) / temp, axis=-1)
            log_student = ops.log_softmax(ops.log(ops.maximum(s, EPS)) / temp, axis=-1)
            kl = ops.sum(soft * (ops.log(ops.maximum(soft, EPS)) - log_student), axis=-1)
            return kl * temp * temp
        t_logit, s_logit = _logit(t) / temp, _logit(s) / temp
        p = ops.sigmoid(t_logit)
        # Each label's two-way KL, p log(p/q) + (1-p) log((1-p)/(1-q)), with q's logs from its logit.
        kl = (p * (ops.log_sigmoid(t_logit) - ops.log_sigmoid(s_logit))
              + (1 - p) * (ops.log_sigmoid(-t_logit) - ops.log_sigmoid(-s_logit)))
        return ops.mean(kl, axis=-1) * temp * temp


def _logit(p: Any) -> Any:
    p = ops.clip(p, EPS, 1.0)
    return ops.log(p) - ops.log(ops.maximum(1.0 - p, EPS))


def teacher_scores(teacher: Teacher, data: LocalDataset, limit: int) -> dict[str, Any]:
    """The teacher scored on the student's held-out examples, as the student's export is (agent/export.py)."""
    from agent.export import saved_model_scores

    held_out = data.validation or data.train
    x, y = read_arrays(data, held_out, limit)
    if data.columns is not None:
        x = read_columns(data, held_out, limit)[0]
    return {k.replace("saved_model_", "teacher_"): v for k, v in saved_model_scores(teacher.saved_model, data.task, x, y).items()}
