"""spec.task: what the labels are (issue 21). One rule for the API, staging and the agent:

- `classification` (default): one class per example; softmax over the classes, sparse categorical
  cross-entropy, accuracy. A label column that looks continuous fails at staging with "did you mean
  task: regression?".
- `binary`: two label values; one sigmoid output (the probability of the positive label), binary
  cross-entropy, accuracy, AUC, precision and recall. Numbers: the larger is positive; text labels name
  the positive one with `dataset.options.positive_label`.
- `multilabel`: any number of labels per example, as several 0/1 columns (label_column a list) or one
  column of names joined by `dataset.options.label_separator`; one sigmoid per label, binary
  cross-entropy, micro and macro F1 and AUC.
- `regression`: a numeric target (or several: label_column a list), trained standardised with the
  training split's mean and standard deviation (agent/tasks.py), mean squared error, MAE, RMSE and R²
  in the data's units; the exported model answers in them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from trainjobs.spec.job import JobSpec

Task = Literal["classification", "binary", "multilabel", "regression"]
TASKS: tuple[str, ...] = ("classification", "binary", "multilabel", "regression")

# The metrics each task's epochs report, besides the loss (and each as val_<name> on the validation split).
METRICS: dict[str, tuple[str, ...]] = {
    "classification": ("accuracy",),
    "binary": ("accuracy", "auc", "precision", "recall"),
    "multilabel": ("f1_micro", "f1_macro", "auc"),
    "regression": ("mae", "rmse", "r2"),
}
# training.metrics: what each task may report instead (agent/tasks.py builds them), its defaults among them.
METRIC_CHOICES: dict[str, tuple[str, ...]] = {
    "classification": ("accuracy", "top_5_accuracy"),
    "binary": ("accuracy", "auc", "precision", "recall", "pr_auc"),
    "multilabel": ("f1_micro", "f1_macro", "auc", "precision", "recall", "pr_auc"),
    "regression": ("mae", "rmse", "r2", "mape"),
}
HIGHER_IS_BETTER = frozenset({"accuracy", "top_5_accuracy", "auc", "pr_auc", "precision", "recall", "r2", "f1_micro",
                              "f1_macro"})
# training.loss: the Keras losses each task may train with, its default first.
LOSSES: dict[str, tuple[str, ...]] = {
    "classification": ("sparse_categorical_crossentropy", "sparse_categorical_focal_crossentropy"),
    "binary": ("binary_crossentropy", "binary_focal_crossentropy"),
    "multilabel": ("binary_crossentropy", "binary_focal_crossentropy"),
    "regression": ("mse", "mae", "huber"),
}


def task_metrics(task: str, chosen: list[str] | tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The metrics a job reports: training.metrics, else the task's."""
    return tuple(chosen) if chosen else METRICS[task]


def epoch_names(task: str, chosen: list[str] | tuple[str, ...] | None = None) -> tuple[str, ...]:
    """What each epoch's history entry records from Keras' logs (`chosen`: training.metrics)."""
    names = task_metrics(task, chosen)
    return ("loss", *names, "val_loss", *(f"val_{n}" for n in names))


def task_problem(spec: JobSpec) -> tuple[str, str] | None:
    """(field, reason) for a task the rest of the spec contradicts, else None."""
    options = spec.dataset.options if spec.dataset is not None else None
    if options is not None and options.positive_label is not None and spec.task != "binary":
        return ("dataset.options.positive_label",
                f"positive_label names the positive label of task binary; this job's task is {spec.task}")
    if spec.task in ("regression", "multilabel") and spec.dataset is not None and spec.dataset.format == "image_folder":
        return "task", f"an image folder's labels are its class folders: task {spec.task} needs label columns"
    if options is not None and isinstance(options.label_column, list) and spec.task not in ("regression", "multilabel"):
        return ("dataset.options.label_column", f"several label columns are a regression's targets or a multilabel "
                f"task's 0/1 columns; task {spec.task} has one label column")
    if options is not None and options.label_separator is not None:
        if spec.task != "multilabel":
            return ("dataset.options.label_separator", f"label_separator splits a multilabel task's label names; this "
                    f"job's task is {spec.task}")
        if isinstance(options.label_column, list):
            return "dataset.options.label_separator", "label_separator splits one label column, not a list of them"
    chosen = spec.training.metrics
    if chosen is not None and spec.program is not None:
        return "training.metrics", "a program compiles its own metrics: training.metrics is the managed trainer's"
    for i, name in enumerate(chosen or ()):
        if name not in METRIC_CHOICES[spec.task]:
            return (f"training.metrics.{i}", f"task {spec.task} reports {', '.join(METRIC_CHOICES[spec.task])}, "
                    f"not {name!r}")
    stopping = spec.training.early_stopping
    if stopping == "auto":  # the agent's choice for the data (agent/small_tables.py), nothing to check here
        stopping = None
    if stopping is not None and spec.model is not None:
        names = epoch_names(spec.task, chosen)
        if stopping.monitor not in names:
            return ("training.early_stopping.monitor", f"{stopping.monitor!r} is not a metric this job reports: "
                    f"one of {', '.join(names)} (training.metrics chooses them)")
        if stopping.monitor.startswith("val_") and options is not None and options.validation_split == 0:
            return ("training.early_stopping.monitor", f"{stopping.monitor} needs a validation split: "
                    "dataset.options.validation_split is 0 (monitor loss, or hold some data out)")
    if stopping is not None and spec.program is not None:
        return "training.early_stopping", "a program stops its own training: early_stopping is the managed trainer's"
    loss = spec.training.loss
    if loss is not None and loss not in LOSSES[spec.task]:
        return "training.loss", f"task {spec.task} trains with {' or '.join(LOSSES[spec.task])}, not {loss!r}"
    if loss is not None and spec.program is not None:
        return "training.loss", "a program chooses its own loss: training.loss is the managed trainer's"
    weights = spec.training.class_weight
    if weights is not None and spec.task in ("regression", "multilabel"):
        return ("training.class_weight", f"class_weight weighs one class per example: task {spec.task} has "
                                         f"{'none' if spec.task == 'regression' else 'several'}")
    if weights is not None and spec.program is not None:
        return "training.class_weight", "a program weighs its own loss: class_weight is the managed trainer's"
    if isinstance(weights, dict) and len(weights) > 10_000:
        return "training.class_weight", f"{len(weights)} weights, over the limit of 10000"
    if spec.task == "regression" and spec.export.tflite is not None and spec.export.tflite.io_type != "float32":
        return ("export.tflite.io_type", "a regression model's integer output would round its answers: keep "
                                         "io_type float32 with task regression")
    return None
