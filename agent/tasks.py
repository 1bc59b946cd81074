"""What each task (trainjobs/spec/task.py) trains and exports with, in one place: the output layer, the
loss, the metrics, the per-epoch names, what the served model answers, and how its answers are scored
from the exported model (SavedModel and TFLite alike, with numpy).

training.loss and training.metrics choose among each task's (trainjobs/spec/task.py: LOSSES,
METRIC_CHOICES); the defaults:
- classification: softmax over the classes; sparse categorical cross-entropy; accuracy.
- binary: one sigmoid (the positive label's probability); binary cross-entropy; accuracy, AUC,
  precision, recall.
- multilabel: a sigmoid per label; binary cross-entropy; micro and macro F1, AUC.
- regression: a linear output trained on the target standardised with the training split's mean and
  standard deviation (so the loss is near 1 whatever the units, which float16 needs); mean squared
  error; MAE, RMSE and R² in the data's units. The exported model ends in a fixed affine layer that
  puts its answers back in the data's units. Outputs stay float32 under mixed precision.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainjobs.spec.task import LOSSES, METRICS as METRICS, epoch_names as epoch_names, task_metrics  # the core's tables

# The score of an exported model on held-out examples, by task: saved_model_<name>, tflite_<name>.
SCORES: dict[str, tuple[str, ...]] = {
    "classification": ("accuracy",),
    "binary": ("accuracy", "auc"),
    "multilabel": ("f1_micro", "f1_macro"),
    "regression": ("r2", "mae"),
}


def num_outputs(task: str, num_classes: int, targets: int) -> int:
    return {"classification": num_classes, "binary": 1, "multilabel": num_classes, "regression": targets}[task]


def head(x: Any, task: str, outputs: int) -> Any:
    """The output layer(s) on features x, in float32 whatever the precision policy."""
    import keras

    if task == "classification":
        return keras.layers.Dense(outputs, activation="softmax", dtype="float32", name="probabilities")(x)
    if task == "binary":
        return keras.layers.Dense(1, activation="sigmoid", dtype="float32", name="probability")(x)
    if task == "multilabel":
        return keras.layers.Dense(outputs, activation="sigmoid", dtype="float32", name="probabilities")(x)
    # The standardised target: what training compares with (agent/data.py standardises the labels).
    return keras.layers.Dense(outputs, dtype="float32", name="standardized_prediction")(x)


def serving_model(model: Any, task: str, target_mean: tuple[float, ...] | None,
                  target_std: tuple[float, ...] | None) -> Any:
    """The model as exported: a regression's answers in the data's units, anything else as trained."""
    import keras

    if task != "regression":
        return model
    return keras.Model(model.inputs, in_target_units(model.outputs[0], target_mean, target_std), name=model.name)


def in_target_units(y: Any, target_mean: tuple[float, ...] | None, target_std: tuple[float, ...] | None) -> Any:
    """A regression's standardised output in the data's units (identity without statistics)."""
    import keras

    if target_mean is None or target_std is None:
        return y
    scale = np.asarray(target_std, dtype="float32")
    offset = np.asarray(target_mean, dtype="float32")
    return keras.layers.Rescaling(scale=scale, offset=offset, dtype="float32", name="target_units")(y)


def loss(task: str, name: str | None = None) -> Any:
    """training.loss (one of LOSSES[task], checked at submit), default the task's first. A regression's
    loss (mse, mae or huber alike) compares standardised targets: huber's delta of 1 is one standard
    deviation of the training targets."""
    import keras

    return {"sparse_categorical_crossentropy": keras.losses.SparseCategoricalCrossentropy,
            "sparse_categorical_focal_crossentropy": _sparse_focal,
            "binary_crossentropy": keras.losses.BinaryCrossentropy,
            "binary_focal_crossentropy": keras.losses.BinaryFocalCrossentropy,
            "mse": keras.losses.MeanSquaredError, "mae": keras.losses.MeanAbsoluteError,
            "huber": keras.losses.Huber}[name or LOSSES[task][0]]()


def _sparse_focal() -> Any:
    """Focal cross-entropy on class ids: Keras has it for one-hot labels only (CategoricalFocalCrossentropy)."""
    import keras

    focal = keras.losses.CategoricalFocalCrossentropy(reduction=None)  # per example: Keras reduces

    def sparse_categorical_focal_crossentropy(y_true: Any, y_pred: Any) -> Any:
        ids = keras.ops.cast(keras.ops.reshape(y_true, (-1,)), "int32")
        return focal(keras.ops.one_hot(ids, keras.ops.shape(y_pred)[-1]), y_pred)

    return sparse_categorical_focal_crossentropy


def metrics(task: str, target_mean: tuple[float, ...] | None = None,
            target_std: tuple[float, ...] | None = None, chosen: list[str] | None = None) -> list[Any]:
    """The Keras metrics a job reports (training.metrics, else the task's; trainjobs/spec/task.py), each
    named as its history records it. A regression's are in the data's units: the model and its labels
    are standardised, the metrics put both back first."""
    import keras

    mean = np.asarray(target_mean if target_mean is not None else (0.0,), dtype="float32")
    std = np.asarray(target_std if target_std is not None else (1.0,), dtype="float32")
    multilabel = task == "multilabel"
    build = {
        "accuracy": lambda: "accuracy" if task == "classification" else keras.metrics.BinaryAccuracy(name="accuracy"),
        "top_5_accuracy": lambda: keras.metrics.SparseTopKCategoricalAccuracy(k=5, name="top_5_accuracy"),
        "auc": lambda: keras.metrics.AUC(multi_label=multilabel, name="auc"),
        "pr_auc": lambda: keras.metrics.AUC(curve="PR", multi_label=multilabel, name="pr_auc"),
        "precision": lambda: keras.metrics.Precision(name="precision"),
        "recall": lambda: keras.metrics.Recall(name="recall"),
        "f1_micro": lambda: keras.metrics.F1Score(average="micro", threshold=0.5, name="f1_micro"),
        "f1_macro": lambda: keras.metrics.F1Score(average="macro", threshold=0.5, name="f1_macro"),
        "mae": lambda: _in_units(keras.metrics.MeanAbsoluteError, "mae", mean, std),
        "rmse": lambda: _in_units(keras.metrics.RootMeanSquaredError, "rmse", mean, std),
        "r2": lambda: _in_units(keras.metrics.R2Score, "r2", mean, std),
        "mape": lambda: _in_units(keras.metrics.MeanAbsolutePercentageError, "mape", mean, std),
    }
    return [build[name]() for name in task_metrics(task, chosen)]


def _in_units(metric: Any, name: str, mean: np.ndarray, std: np.ndarray) -> Any:
    class InUnits(metric):
        def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
            return super().update_state(y_true * std + mean, y_pred * std + mean, sample_weight)

    InUnits.__name__ = metric.__name__
    return InUnits(name=name)


def score(task: str, predictions: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """An exported model's answers on held-out examples, scored as SCORES says."""
    if task == "classification":
        return {"accuracy": float(np.mean(predictions.argmax(axis=-1) == y))}
    if task == "binary":
        p, truth = predictions.reshape(-1), y.reshape(-1)
        return {"accuracy": float(np.mean((p > 0.5) == (truth > 0.5))), "auc": auc(p, truth)}
    if task == "multilabel":
        return f1_scores(predictions > 0.5, y > 0.5)
    predicted = predictions.reshape(len(y), -1).astype(np.float64)
    target = y.reshape(len(y), -1).astype(np.float64)
    residual = float(np.sum((target - predicted) ** 2))
    total = float(np.sum((target - target.mean(axis=0)) ** 2))
    return {"r2": 1.0 - residual / total if total > 0 else 0.0, "mae": float(np.mean(np.abs(target - predicted)))}


def auc(scores: np.ndarray, truth: np.ndarray) -> float:
    """The area under the ROC curve: the chance a positive outscores a negative (ties count half)."""
    positive = truth > 0.5
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if not n_pos or not n_neg:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), dtype=np.float64)
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):  # average ranks over ties
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def class_weights(asked: str | dict[str, float] | None, names: list[str],
                  counts: tuple[int, ...] | None) -> dict[int, float] | None:
    """training.class_weight as Keras takes it, by class id: 'balanced' is n / (classes x count) over the
    training split (a class without examples there weighs 1); names map to ids through labels.json's."""
    if asked is None:
        return None
    if asked == "balanced":
        if not counts:
            raise ValueError("class_weight balanced needs the training split's class counts, which this "
                             "dataset's manifest lacks (staged before they were counted): stage it again")
        total, present = sum(counts), sum(1 for c in counts if c)
        return {i: (total / (present * c) if c else 1.0) for i, c in enumerate(counts)}
    assert isinstance(asked, dict)
    return {names.index(name): float(w) for name, w in asked.items()}


def f1_scores(predicted: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """Micro F1 (over every label decision) and macro F1 (the mean of each label's), as
    keras.metrics.F1Score computes them (a label with no positives, predicted or true, scores 0)."""
    tp = (predicted & truth).sum(axis=0).astype(np.float64)
    fp = (predicted & ~truth).sum(axis=0).astype(np.float64)
    fn = (~predicted & truth).sum(axis=0).astype(np.float64)

    def f1(t: Any, p: Any, n: Any) -> Any:
        denominator = 2 * t + p + n
        return np.where(denominator > 0, 2 * t / np.maximum(denominator, 1e-12), 0.0)

    return {"f1_micro": float(f1(tp.sum(), fp.sum(), fn.sum())), "f1_macro": float(np.mean(f1(tp, fp, fn)))}
