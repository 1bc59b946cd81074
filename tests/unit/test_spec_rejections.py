"""The rejection table: every contradiction we can see in a spec is refused naming the field, and
consistent specs pass. Judged on the spec's own validation (trainjobs.spec: JobSpec and the errors as
the API and the CLI render them); that the API answers each such refusal as a 422 naming the field,
storing nothing, is tests/integration/test_spec_rejections.py's."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tests.support.jobs import digits_spec
from trainjobs.spec import JobSpec, describe_errors

TPU = {"type": "tpu", "tpu_type": "v4-8"}
GPU2 = {"type": "gpu", "gpu_type": "nvidia-l4", "count": 2}
TEACHER = "0f6d1e52-7c1a-4a53-9a49-2d3b1c7e8f90"

REJECTED = [
    # (case id, spec overrides, field named in the error, words in the reason)
    ("unknown field", {"colour": "blue"}, "colour", "Extra inputs"),
    ("unknown nested field", {"training": {"epochs": 1, "epoch": 2}}, "training.epoch", "Extra inputs"),
    ("tpu strategy without tpu", {"strategy": "tpu"}, "strategy", "needs a TPU"),
    ("mixed_float16 on tpu", {"accelerator": TPU, "strategy": "auto", "precision": "mixed_float16"}, "precision", "bfloat16"),
    ("mirrored on tpu", {"accelerator": TPU, "strategy": "mirrored"}, "strategy", "TPU trains under"),
    ("unknown tpu type", {"accelerator": {"type": "tpu", "tpu_type": "v9-8"}, "strategy": "auto"}, "accelerator.tpu_type", "unknown TPU type"),
    ("tpu size not sold", {"accelerator": {"type": "tpu", "tpu_type": "v4-6"}, "strategy": "auto"}, "accelerator.tpu_type", "powers of two"),
    ("tpu image without tensorflow", {"accelerator": {**TPU, "runtime_version": "tpu-ubuntu2204-base"}, "strategy": "auto"},
     "accelerator.runtime_version", "not a TensorFlow TPU VM image"),
    ("tpu image too old", {"accelerator": {**TPU, "runtime_version": "tpu-vm-tf-2.15.0-pjrt"}, "strategy": "auto"},
     "accelerator.runtime_version", "needs 2.16 or newer"),
    ("single-host image on a pod slice", {"accelerator": {"type": "tpu", "tpu_type": "v4-32",
                                                          "runtime_version": "tpu-vm-tf-2.18.0-pjrt"}, "strategy": "auto"},
     "accelerator.runtime_version", "need a pod image"),
    ("bad topology", {"accelerator": {**TPU, "topology": "2by2"}, "strategy": "auto"}, "accelerator.topology", "pattern"),
    ("multi worker with one worker", {"strategy": "multi_worker_mirrored", "workers": 1}, "workers", "workers >= 2"),
    ("workers without multi-worker", {"strategy": "mirrored", "workers": 2}, "strategy", "multi_worker_mirrored"),
    ("tpu with workers", {"accelerator": TPU, "strategy": "tpu", "workers": 2}, "workers", "bigger tpu_type"),
    ("global batch not divisible", {"training": {"global_batch_size": 33}}, "training.global_batch_size", "divide evenly over 2"),
    ("both batch sizes", {"training": {"global_batch_size": 32, "per_replica_batch_size": 16}}, "training.global_batch_size", "not both"),
    ("negative batch", {"training": {"per_replica_batch_size": -1}}, "training.per_replica_batch_size", "greater than or equal to 1"),
    ("absurd batch", {"training": {"per_replica_batch_size": 65536}, "accelerator": {"type": "cpu", "replicas": 64}},
     "training.per_replica_batch_size", "absurd"),
    ("zero epochs", {"training": {"epochs": 0}}, "training.epochs", "greater than or equal to 1"),
    ("zero checkpoint steps", {"training": {"checkpoint_every_steps": 0}}, "training.checkpoint_every_steps",
     "greater than or equal to 1"),
    ("negative learning rate", {"training": {"learning_rate": -0.1}}, "training.learning_rate", "greater than 0"),
    ("warmup longer than training", {"training": {"epochs": 2, "warmup_epochs": 5}}, "training.warmup_epochs", "longer than training"),
    ("int8 without calibration data", {"export": {"tflite": {"quantization": "int8", "calibration_examples": 0}}},
     "export.tflite.calibration_examples", "calibration data"),
    ("unknown quantization", {"export": {"tflite": {"quantization": "int4"}}}, "export.tflite.quantization", "Input should be"),
    ("saved_model cannot be off", {"export": {"saved_model": False}}, "export.saved_model", "Input should be True"),
    ("uppercase label key", {"labels": {"Team": "ml"}}, "labels", "not a GCP label key"),
    ("label key starting with digit", {"labels": {"1team": "ml"}}, "labels", "not a GCP label key"),
    ("label value with dot", {"labels": {"team": "m.l"}}, "labels", "not a GCP label value"),
    ("label key too long", {"labels": {"k" * 64: "v"}}, "labels", "at most 63"),
    ("reserved label prefix", {"labels": {"trainjobs-job": "x"}}, "labels", "reserved"),
    ("gpu count not attachable", {"accelerator": {"type": "gpu", "gpu_type": "nvidia-tesla-t4", "count": 3}}, "accelerator.count", "counts of"),
    ("unknown gpu", {"accelerator": {"type": "gpu", "gpu_type": "rtx-4090"}}, "accelerator.gpu_type", "unknown GPU type"),
    ("bf16 on a gpu without it", {"accelerator": {"type": "gpu", "gpu_type": "nvidia-tesla-t4"}, "strategy": "auto",
                                  "precision": "mixed_bfloat16"}, "precision", "no bfloat16"),
    ("one_device over two gpus", {"accelerator": GPU2, "strategy": "one_device"}, "strategy", "uses one device"),
    ("default over two cpus", {"strategy": "default"}, "strategy", "uses one device"),
    ("unknown accelerator type", {"accelerator": {"type": "fpga"}}, "accelerator", "does not match any of the expected tags"),
    ("unknown strategy", {"strategy": "parameter_server"}, "strategy", "Input should be"),
    ("steps_per_execution zero", {"steps_per_execution": 0}, "steps_per_execution", "between 1 and 10000"),
    ("XLA off on a TPU", {"accelerator": {"type": "tpu", "tpu_type": "v5litepod-8"}, "strategy": "auto",
                          "jit_compile": False}, "jit_compile", "compiled by XLA"),
    ("XLA as a word", {"jit_compile": "xla"}, "jit_compile", "true, false or 'auto'"),
    ("XLA as a number", {"jit_compile": 1}, "jit_compile", "true, false or 'auto'"),
    ("runtime zero", {"limits": {"max_runtime": "0s"}}, "limits.max_runtime", "between 1 second and 14 days"),
    ("runtime absurd", {"limits": {"max_runtime": "90d"}}, "limits.max_runtime", "between 1 second and 14 days"),
    ("negative retries", {"limits": {"max_retries": -1}}, "limits.max_retries", "greater than or equal to 0"),
    ("negative cost", {"limits": {"max_cost_usd": -5}}, "limits.max_cost_usd", "greater than 0"),
    ("model name and module", {"model": {"name": "cnn", "module": "my.py"}}, "model.module", "exactly one"),
    ("unknown builtin model", {"model": {"name": "transformer"}}, "model.name", "unknown model"),
    ("typo in a built-in model's params", {"model": {"name": "mlp", "params": {"hiden_units": [64]}}},
     "model.params.hiden_units", "did you mean 'hidden_units'?"),
    ("built-in param of the wrong type", {"model": {"name": "cnn", "params": {"filters": "32,64"}}},
     "model.params.filters", "a list of 1 to 64 whole numbers"),
    ("built-in dropout out of range", {"model": {"name": "resnet", "params": {"dropout": 1.5}}},
     "model.params.dropout", "from 0 up to (not including) 1"),
    ("param another built-in takes", {"model": {"name": "mlp", "params": {"kernel_size": 3}}},
     "model.params.kernel_size", "it takes dropout, hidden_units"),
    ("typo in an application's params", {"model": {"name": "MobileNetV2", "params": {"alpah": 0.5}}},
     "model.params.alpah", "did you mean 'alpha'?"),
    ("application param of the wrong type", {"model": {"name": "EfficientNetV2B0", "params": {"include_preprocessing": "no"}}},
     "model.params.include_preprocessing", "true or false"),
    ("param the application has no use for", {"model": {"name": "ResNet50", "params": {"alpha": 0.5}}},
     "model.params.alpha", "ResNet50 takes no param 'alpha'; it takes dropout"),
    ("unsupported source", {"dataset": {"source": "ftp://host/x.npz"}}, "dataset.source", "unsupported dataset source"),
    ("csv option on npz", {"dataset": {"source": "d.npz", "format": "npz", "options": {"label_column": "y"}}},
     "dataset.options.label_column", "label_column applies to csv"),
    ("validation split too big", {"dataset": {"source": "d.npz", "options": {"validation_split": 0.9}}},
     "dataset.options.validation_split", "less than or equal to 0.5"),
    ("missing dataset", {"dataset": None}, "dataset", "the managed trainer (model) trains on a dataset"),
    # program: the user's own code (issue 20)
    ("program with model", {"program": {"source": "train.py"}}, "program", "not both"),
    ("neither model nor program", {"model": None}, "model", "or program (your own training script)"),
    ("entrypoint outside the source", {"model": None, "program": {"source": "src/", "entrypoint": "../x.py"}},
     "program.entrypoint", "inside it"),
    ("entrypoint not a script", {"model": None, "program": {"source": "src/", "entrypoint": "run.sh"}},
     "program.entrypoint", "must be a .py file"),
    ("a requirement that is not PEP 508", {"model": None, "program": {"source": "t.py", "requirements": ["pandas>=2", "keras hub"]}},
     "program.requirements.1", "not a PEP 508 requirement"),
    ("a pip option as a requirement", {"model": None, "program": {"source": "t.py", "requirements": ["--index-url=http://x"]}},
     "program.requirements.0", "pip options"),
    ("the image's TensorFlow from elsewhere", {"model": None, "program": {
        "source": "t.py", "requirements": ["tensorflow @ https://example.com/tf.whl"]}},
     "program.requirements.0", "would replace the image's tensorflow"),
    ("an argument too long to store", {"model": None, "program": {"source": "t.py", "args": ["--x", "y" * 5000]}},
     "program.args.1", "an argument of 5000 characters"),
    ("too many arguments", {"model": None, "program": {"source": "t.py", "args": ["-v"] * 300}},
     "program.args", "300 arguments, over the limit of 256"),
    ("too many requirements", {"model": None, "program": {"source": "t.py", "requirements": [f"p{i}" for i in range(65)]}},
     "program.requirements", "65 requirements, over the limit of 64"),
    # task: what the labels are (issue 21)
    ("an unknown task", {"task": "ranking"}, "task", "'classification', 'binary', 'multilabel' or 'regression'"),
    ("a positive label outside task binary", {"task": "regression", "dataset": {"source": "sklearn:digits", "options": {
        "positive_label": "yes"}}}, "dataset.options.positive_label", "this job's task is regression"),
    ("a regression on an image folder", {"task": "regression", "dataset": {"source": "gs://my-bucket/pets/", "format": "image_folder"}},
     "task", "task regression needs label columns"),
    ("several label columns for classes", {"dataset": {"source": "d.csv", "options": {"label_column": ["a", "b"]}}},
     "dataset.options.label_column", "task classification has one label column"),
    ("a label separator outside multilabel", {"dataset": {"source": "d.csv", "options": {"label_separator": "|"}}},
     "dataset.options.label_separator", "this job's task is classification"),
    ("a label separator over several columns", {"task": "multilabel", "dataset": {"source": "d.csv", "options": {
        "label_separator": "|", "label_column": ["a", "b"]}}}, "dataset.options.label_separator", "not a list of them"),
    ("a column type nobody reads", {"dataset": {"source": "d.csv", "options": {"columns": {"city": "date"}}}},
     "dataset.options.columns.city", "numeric, categorical, text, not 'date'"),
    ("column types without a header", {"dataset": {"source": "d.csv", "options": {"header": "none", "columns": {
        "city": "categorical"}}}}, "dataset.options.columns", "this CSV has none"),
    ("a label column's type", {"dataset": {"source": "d.csv", "options": {"label_column": "y", "columns": {
        "y": "categorical"}}}}, "dataset.options.columns.y", "that is a label column"),
    ("column types for npz data", {"dataset": {"source": "d.npz", "options": {"columns": {"a": "text"}}}},
     "dataset.options.columns", "columns applies to csv data, not npz"),
    # training.pruning (issue 23)
    ("pruning a program", {"model": None, "program": {"source": "t.py"}, "training": {"pruning": {
        "target_sparsity": 0.5}}}, "training.pruning", "a program prunes its own model"),
    ("pruning convolutions of an mlp", {"model": {"name": "mlp"}, "training": {"pruning": {
        "target_sparsity": 0.5, "layers": "conv"}}}, "training.pruning.layers", "model mlp has no conv layers"),
    ("a pruning window past the end", {"training": {"epochs": 4, "pruning": {"target_sparsity": 0.5, "end_epoch": 6}}},
     "training.pruning.end_epoch", "after the last epoch (4)"),
    ("a pruning window that ends first", {"training": {"pruning": {"target_sparsity": 0.5, "begin_epoch": 2,
                                                                    "end_epoch": 2}}},
     "training.pruning.end_epoch", "must come after begin_epoch"),
    ("a sparsity of 1", {"training": {"pruning": {"target_sparsity": 1.0}}}, "training.pruning.target_sparsity",
     "less than 1"),
    # training.distillation (issue 23); the teacher job itself: tests/integration/test_distillation.py
    ("distilling a program", {"model": None, "program": {"source": "t.py"}, "training": {"distillation": {
        "teacher_job": TEACHER}}}, "training.distillation", "the managed trainer's"),
    ("distilling a regression", {"task": "regression", "dataset": {"source": "d.csv"}, "training": {"distillation": {
        "teacher_job": TEACHER}}}, "training.distillation", "task regression has none"),
    ("distillation with class weights", {"training": {"class_weight": "balanced", "distillation": {
        "teacher_job": TEACHER}}}, "training.class_weight", "weigh the labels with alpha"),
    ("a teacher that is no job id", {"training": {"distillation": {"teacher_job": "../other/artifacts"}}},
     "training.distillation.teacher_job", "pattern"),
    ("a temperature of 0", {"training": {"distillation": {"teacher_job": TEACHER, "temperature": 0}}},
     "training.distillation.temperature", "greater than 0"),
    ("an alpha above 1", {"training": {"distillation": {"teacher_job": TEACHER, "alpha": 1.5}}},
     "training.distillation.alpha", "less than or equal to 1"),
    # training.profile (issue 24)
    ("profiling a program", {"model": None, "program": {"source": "t.py"}, "training": {"profile": True}},
     "training.profile", "a program runs its own loop"),
    ("a profile window past the end", {"training": {"epochs": 3, "profile": {"epoch": 4}}},
     "training.profile.epoch", "after the last epoch (3)"),
    ("a profile of epoch 0", {"training": {"profile": {"epoch": 0}}}, "training.profile.epoch",
     "greater than or equal to 1"),
    ("a profile of 0 steps", {"training": {"profile": {"steps": 0}}}, "training.profile.steps",
     "greater than or equal to 1"),
    ("a profile longer than 1000 steps", {"training": {"profile": {"steps": 1001}}}, "training.profile.steps",
     "less than or equal to 1000"),
    ("a profile given as a number", {"training": {"profile": 20}}, "training.profile", "true, false or {epoch, steps}"),
    ("a misspelt profile field", {"training": {"profile": {"step": 20}}}, "training.profile.step", "did you mean 'steps'?"),
    ("a label column named twice", {"task": "multilabel", "dataset": {"source": "d.csv", "options": {
        "label_column": ["a", "a"]}}}, "dataset.options.label_column", "a list of distinct ones"),
    ("a regression's integer TFLite output", {"task": "regression", "export": {"tflite": {"quantization": "int8",
                                                                                         "io_type": "int8"}}},
     "export.tflite.io_type", "would round its answers"),
    ("early stopping on a metric the task does not report", {"task": "regression", "training": {
        "early_stopping": {"monitor": "val_accuracy"}}}, "training.early_stopping.monitor",
     "'val_accuracy' is not a metric this job reports: one of loss, mae, rmse, r2, val_loss"),
    ("early stopping on a metric training.metrics leaves out", {"task": "binary", "training": {
        "metrics": ["pr_auc"], "early_stopping": {"monitor": "val_auc"}}}, "training.early_stopping.monitor",
     "one of loss, pr_auc, val_loss, val_pr_auc (training.metrics chooses them)"),
    ("another task's metric", {"task": "regression", "training": {"metrics": ["r2", "auc"]}}, "training.metrics.1",
     "task regression reports mae, rmse, r2, mape, not 'auc'"),
    ("a metric named twice", {"training": {"metrics": ["accuracy", "accuracy"]}}, "training.metrics",
     "a metric is named twice"),
    ("metrics for a program", {"model": None, "program": {"source": "t.py"}, "training": {"metrics": ["accuracy"]}},
     "training.metrics", "a program compiles its own metrics"),
    ("early stopping on the validation split with none held out", {"dataset": {"source": "sklearn:digits", "options": {
        "validation_split": 0}}, "training": {"early_stopping": {}}}, "training.early_stopping.monitor",
     "val_loss needs a validation split"),
    ("early stopping in a program", {"model": None, "program": {"source": "t.py"}, "training": {"early_stopping": {}}},
     "training.early_stopping", "a program stops its own training"),
    ("a loss of another task", {"task": "regression", "training": {"loss": "binary_crossentropy"}}, "training.loss",
     "task regression trains with mse or mae or huber, not 'binary_crossentropy'"),
    ("class weights in a regression", {"task": "regression", "training": {"class_weight": "balanced"}},
     "training.class_weight", "task regression has none"),
    ("a class weight that is not positive", {"training": {"class_weight": {"cat": 0}}}, "training.class_weight",
     "the weight of 'cat' must be a number greater than 0"),
    ("class weights by another rule", {"training": {"class_weight": "inverse"}}, "training.class_weight",
     "'balanced' or {label: weight}"),
    ("an environment variable the runtime sets", {"model": None, "program": {"source": "t.py", "env": {"TF_CONFIG": "{}"}}},
     "program.env.TF_CONFIG", "cannot be overridden"),
    ("a Vertex AI directory variable", {"model": None, "program": {"source": "t.py", "env": {"AIP_MODEL_DIR": "/x"}}},
     "program.env.AIP_MODEL_DIR", "cannot be overridden"),
    ("not a variable name", {"model": None, "program": {"source": "t.py", "env": {"MY-FLAG": "1"}}},
     "program.env.MY-FLAG", "not an environment variable name"),
    ("a misspelt program field", {"model": None, "program": {"source": "t.py", "entry_point": "t.py"}},
     "program.entry_point", "did you mean 'entrypoint'?"),
    ("an unknown variant", {"export": {"variants": ["tflite_int4"]}}, "export.variants.0", "Input should be"),
    ("a variant named twice", {"export": {"variants": ["saved_model_int8", "tflite_dynamic", "saved_model_int8"]}},
     "export.variants.2", "saved_model_int8 is named twice"),
    ("a variant that is model.tflite", {"export": {"tflite": {"quantization": "float16"}, "variants": [
        "saved_model_int8", "tflite_float16"]}}, "export.variants.1",
     "tflite_float16 is model.tflite already (export.tflite.quantization float16)"),
    ("a float32 variant beside a float32 model.tflite", {"export": {"tflite": {}, "variants": ["tflite_float32"]}},
     "export.variants.0", "tflite_float32 is model.tflite already (export.tflite.quantization none)"),
    ("variants of a program", {"model": None, "program": {"source": "t.py"}, "export": {"variants": ["tflite_int8"]}},
     "export.variants", "a program exports its own model"),
]



def refusals(spec: dict[str, Any]) -> dict[str, str]:
    """Field -> reason, as submit renders a spec that does not validate (nothing when it does)."""
    try:
        JobSpec.model_validate(spec)
    except ValidationError as exc:
        return {d["field"]: d["reason"] for d in describe_errors([dict(e) for e in exc.errors()])}
    return {}


@pytest.mark.parametrize("overrides,field,reason", [c[1:] for c in REJECTED], ids=[c[0] for c in REJECTED])
def test_a_contradiction_is_refused_naming_the_field(overrides: dict[str, Any], field: str, reason: str) -> None:
    fields = refusals(digits_spec(**overrides))
    assert field in fields, fields
    assert reason in fields[field], fields[field]


ACCEPTED = [
    ("cpu mirrored", {}),
    ("tpu auto bf16", {"accelerator": TPU, "strategy": "auto", "precision": "auto"}),
    ("tpu pod slice", {"accelerator": {"type": "tpu", "tpu_type": "v5litepod-16", "topology": "4x4"}, "strategy": "tpu"}),
    ("tpu pod image", {"accelerator": {"type": "tpu", "tpu_type": "v4-32", "runtime_version": "tpu-vm-tf-2.17.0-pod-pjrt"},
                       "strategy": "tpu"}),
    ("gpus mirrored fp16", {"accelerator": GPU2, "strategy": "mirrored", "precision": "mixed_float16"}),
    ("multi worker", {"accelerator": GPU2, "strategy": "multi_worker_mirrored", "workers": 2,
                      "training": {"global_batch_size": 64}}),
    ("global batch divisible", {"training": {"global_batch_size": 64, "lr_scaling": "sqrt"}}),
    ("int8 export", {"export": {"tflite": {"quantization": "int8"}}}),
    ("runtime as text", {"limits": {"max_runtime": "90m", "max_cost_usd": 3.5}}),
    ("a binary task with its positive label", {"task": "binary", "dataset": {"source": "data.csv", "options": {
        "positive_label": "yes"}}}),
    ("a regression exported to int8 TFLite with a float interface", {"task": "regression", "export": {
        "tflite": {"quantization": "int8"}}}),
    ("a regression with the huber loss", {"task": "regression", "training": {"loss": "huber"}}),
    ("focal loss for classes", {"training": {"loss": "sparse_categorical_focal_crossentropy"}}),
    ("built-in params", {"model": {"name": "mlp", "params": {"hidden_units": [64, 32], "dropout": 0}}}),
    ("one hidden layer as a number", {"model": {"name": "mlp", "params": {"hidden_units": 64}}}),
    ("application params", {"model": {"name": "MobileNetV3Small", "params": {"alpha": 0.75, "minimalistic": True,
                                                                           "dropout": 0.2}}}),
    ("a pruned multilabel student", {"task": "multilabel", "dataset": {"source": "d.csv", "options": {
        "label_column": ["a", "b"]}}, "training": {"distillation": {"teacher_job": TEACHER.upper()},
                                                 "pruning": {"target_sparsity": 0.5}}}),
    ("every variant beside an int8 model.tflite", {"export": {"tflite": {"quantization": "int8", "io_type": "uint8"},
                                                             "variants": ["saved_model_int8", "tflite_float32",
                                                                          "tflite_dynamic", "tflite_float16"]}}),
    ("a regression's variants", {"task": "regression", "export": {"variants": ["saved_model_int8", "tflite_int8"]}}),
    ("no variants", {"export": {"variants": []}}),
    ("a profile of the last epoch", {"training": {"epochs": 3, "profile": {"epoch": 3, "steps": 1000}}}),
    ("XLA forced on a GPU", {"accelerator": {"type": "gpu", "gpu_type": "nvidia-l4"}, "jit_compile": True}),
    ("XLA off on a CPU", {"jit_compile": False}),
]



@pytest.mark.parametrize("overrides", [c[1] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_a_consistent_spec_is_accepted(overrides: dict[str, Any]) -> None:
    assert refusals(digits_spec(**overrides)) == {}


@pytest.mark.parametrize(("profile", "epochs", "window"), [
    (True, 5, (2, 20)),  # the second epoch: the first one's steps include tracing and compilation
    (True, 1, (1, 20)),
    ({"steps": 50}, 5, (2, 50)),
    ({"epoch": 4, "steps": 3}, 5, (4, 3)),
    (False, 5, None),
    (None, 5, None),
], ids=["true", "true with one epoch", "steps only", "epoch and steps", "false", "absent"])
def test_the_profile_window_is_the_epoch_and_steps_asked_or_the_default(profile: Any, epochs: int,
                                                                       window: tuple[int, int] | None) -> None:
    training: dict[str, Any] = {"epochs": epochs, **({"profile": profile} if profile is not None else {})}
    assert JobSpec.model_validate(digits_spec(training=training)).training.profile_window() == window


@pytest.mark.parametrize("tpu_type, image", [("v4-8", "tpu-vm-tf-2.18.0-pjrt"), ("v5litepod-8", "tpu-vm-tf-2.18.0-pjrt"),
                                             ("v4-32", "tpu-vm-tf-2.18.0-pod-pjrt"), ("v6e-16", "tpu-vm-tf-2.18.0-pod-pjrt")])
def test_a_tpu_job_without_an_image_gets_the_tested_one_of_its_slice_kind(tpu_type: str, image: str) -> None:
    spec = JobSpec.model_validate(digits_spec(accelerator={"type": "tpu", "tpu_type": tpu_type}, strategy="tpu"))
    assert spec.model_dump(mode="json")["accelerator"]["runtime_version"] == image


def test_a_runtime_version_with_a_trailing_newline_is_refused() -> None:
    accelerator = {"type": "tpu", "tpu_type": "v4-8", "runtime_version": "tpu-vm-tf-2.18.0-pjrt\n"}
    fields = refusals(digits_spec(accelerator=accelerator, strategy="auto"))
    assert "not a TensorFlow TPU VM image" in fields["accelerator.runtime_version"]


def test_the_readmes_sweep_example_is_a_valid_sweep() -> None:
    """README, Sweeps: the YAML as written is a sweep the API accepts (every trial's spec checked)."""
    from pathlib import Path

    import yaml

    from trainjobs.spec.sweep import SweepSpec

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("## Sweeps", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    spec = SweepSpec.model_validate(yaml.safe_load(block))
    assert spec.trials == 12 and spec.objective.direction == "maximize"
    assert set(spec.parameters) == {"training.learning_rate", "model.params.dropout"}


def test_a_fine_stepped_range_is_checked_at_its_ends_and_refused_as_a_grid_without_listing_it() -> None:
    """A float range of ten million steps: checked at three values, counted (not listed) for a grid."""
    from pydantic import ValidationError

    from trainjobs.spec.sweep import SweepSpec

    sweep = {"job": {"dataset": {"source": "sklearn:iris"}, "model": {"name": "mlp"}},
             "parameters": {"model.params.dropout": {"type": "float", "low": 0.0, "high": 0.5, "step": 5e-8}},
             "objective": {"metric": "val_accuracy"}}
    assert SweepSpec.model_validate(sweep).trials == 24
    with pytest.raises(ValidationError, match="the grid has 10000001 combinations, over the limit of 10000"):
        SweepSpec.model_validate({**sweep, "algorithm": "grid"})
