"""One attempt of one job, start to finish: plan, data, model, resume, train, export.

Called by __main__ after the local devices are configured and before any other TensorFlow work,
because MultiWorkerMirroredStrategy and the TPU system must be set up first.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
from typing import Any

from trainjobs import storage
from trainjobs.job_paths import ARTIFACT_HISTORY, ARTIFACT_METRICS
from trainjobs.spec import TrainingSpec
from agent import (
    autotune, columns, devices, distillation, export, keras_compat, optimization, precision_trial, pruning, small_tables,
    tasks, tuning, variants,
)
from agent.builtin_models import BUILTIN_BUILDERS
from agent.checkpoints import CheckpointSchedule, CheckpointStore
from agent.data import (
    LocalDataset, download_dataset, eval_dataset, input_choice, read_arrays, read_columns, train_dataset,
)
from agent.input_wait import InputWaitMeter
from agent.job import AgentJob, WorkDir, wait_for_chief
from agent.models import ModelInputs, build, builder_for
from agent.optimizer import make_optimizer
from agent.plan import Hardware, RuntimePlan, TrainingPosition, resolve_plan, resume_from, strategy_to_build
from agent.profiling import TraceWindow
from agent.publisher import Publisher
from agent.status import StatusReporter
from agent.step_functions import install_step_functions
from agent.step_time import step_time_breakdown
from agent.tensorboard import ScalarLog
from agent.train import EpochRecorder, StopEarly, fit

log = logging.getLogger("trainjobs.agent")

STATS_EXAMPLES = 4096  # training examples that fix the built-ins' normalization
EVAL_EXAMPLES = 10_000  # validation examples scored on the exported models


def run_job(job: AgentJob, work: WorkDir, reporter: StatusReporter) -> None:
    import keras

    spec = job.spec
    assert spec.model is not None, "a program job runs in agent/program.py"
    hardware = devices.detect_hardware(spec)
    strategy_name = strategy_to_build(spec, hardware)
    strategy = devices.build_strategy(strategy_name, hardware)
    log.info("job %s attempt %d task %d: %s over %d replica(s) on %s", job.job_id, job.attempt, job.task_index,
             strategy_name, strategy.num_replicas_in_sync, hardware)

    reporter.set_phase("downloading")
    data = download_dataset(job.dataset_uri, work.data)
    teacher = None
    if (distilled := spec.training.distillation) is not None:  # its outputs join the training records
        data, teacher = distillation.teach(job.paths, distilled.teacher_job, data, work.root / "teacher")
    # A small table's defaults where the spec leaves them unset (agent/small_tables.py): batch, rate, early stopping, mlp.
    table = small_tables.choose(spec, data.input_shape, data.train.examples,
                                data.validation.examples if data.validation else 0, strategy.num_replicas_in_sync)
    plan = resolve_plan(spec, hardware, strategy_name, strategy.num_replicas_in_sync, data.train.examples, table=table)
    keras.mixed_precision.set_global_policy(plan.precision)
    keras.utils.set_random_seed(spec.training.seed)

    reporter.set_phase("building")
    params = table.mlp_params if table.mlp_params is not None else spec.model.params
    inputs = _model_inputs(params, data, builtin=spec.model.module is None)
    builder = builder_for(spec.model, work.user_model)
    # Per-epoch uploads go through one background thread (agent/publisher.py); a job of one
    # task skips a checkpoint that would overlap the previous one's upload.
    publisher = Publisher()
    store = CheckpointStore(work.checkpoints, job.paths.checkpoints, upload=job.is_chief, attempt=job.attempt,
                            publisher=publisher, may_skip=spec.workers == 1)
    repairs = keras_compat.repair_before_build()  # what the images' older Keras lacks
    jit, jit_notes = _jit_compile(spec.jit_compile, hardware, strategy.num_replicas_in_sync)
    model, checkpoint, saved_at, pruner = _compile_and_restore(builder, inputs, plan, spec.training, strategy, store,
                                                               jit_compile=jit)
    variants.check_quantizable(model, spec.export)  # before training: export.variants' saved_model_int8
    if strategy_name == "multi_worker_mirrored":
        repairs += keras_compat.repair_multi_worker_fit(model, strategy)
    meter = InputWaitMeter()
    train_function = install_step_functions(model, plan.steps_per_execution, meter)
    plan = resume_from(plan, saved_at)
    plan = dataclasses.replace(
        plan, jit_compile=bool(model.jit_compile), notes=data.staging_notes + plan.notes + tuple(repairs) + jit_notes,
        loss_scaling=isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer),
    )
    reporter.runtime = plan.as_dict() | {"dataset": data.summary()}
    reporter.epoch = plan.initial_epoch
    reporter.step_progress(plan.initial_epoch + plan.initial_step / plan.steps_per_epoch)
    log.info("runtime plan: %s", json.dumps(reporter.runtime))

    history = _previous_history(job.paths.metrics, plan.initial_epoch) if job.is_chief else []
    tb = ScalarLog(work.tensorboard, job.paths.tensorboard) if job.is_chief else None
    schedule = CheckpointSchedule(store, checkpoint, spec.training, plan)

    def on_epoch(entry: dict[str, Any], at: TrainingPosition) -> None:
        epoch = entry["epoch"]
        history.append(entry)
        log.info("epoch %d/%d: %s", epoch, plan.epochs, json.dumps(entry))
        if job.is_chief:
            # metrics.json before the checkpoint (the publisher keeps that order): a resumed run
            # truncates history to the checkpoint, so the opposite order could lose an epoch's entry.
            doc = _metrics_doc(job, plan, list(history))
            publisher.put("metrics", lambda: storage.write_json(job.paths.metrics, doc))
        schedule.after_epoch(at)
        reporter.epoch_done(epoch, entry, write=False)
        publisher.put("status", reporter.write)
        if tb is not None:
            tb.write(epoch, entry)
            publisher.put("tensorboard", tb.upload)

    feeding = input_choice(data, spec.training.cache_dataset)
    plan = dataclasses.replace(plan, notes=plan.notes + (feeding.note,))
    train = train_dataset(data, plan.global_batch_size, spec.training.seed, feeding.mode)
    val = None
    if data.validation is not None:
        val = eval_dataset(data, plan.global_batch_size, plan.static_shapes, feeding.mode)
    reporter.set_phase("training")
    weights = tasks.class_weights(spec.training.class_weight, data.labels, data.train_class_counts)
    if weights is not None:
        log.info("class weights: %s", json.dumps({data.labels[i]: round(w, 6) for i, w in weights.items()}))
    try_xla = spec.jit_compile == "auto" and hardware.kind == "gpu" and hardware.local_devices is None
    no_bfloat16 = precision_trial.why_not(spec, plan.precision, hardware.cpu_bfloat16,
                                          builtin=spec.model.module is None and spec.model.name in BUILTIN_BUILDERS,
                                          replicas=strategy.num_replicas_in_sync)
    plan, train_function, trial = autotune.tune(spec, plan, model, train_function, train, meter, job.paths.checkpoints,
                                                job.attempt, chief=job.is_chief, may_measure=pruner is None,
                                                try_xla=try_xla, try_bfloat16=hardware.kind == "cpu" and no_bfloat16 is None,
                                                class_weight=weights)
    if hardware.kind == "cpu" and spec.precision == "auto" and no_bfloat16 is not None:
        plan = dataclasses.replace(plan, notes=plan.notes + (f"precision auto: {plan.precision}; mixed_bfloat16 not "
                                                             f"tried: {no_bfloat16}",))
    plan = dataclasses.replace(plan, jit_compile=bool(model.jit_compile))
    reporter.runtime = plan.as_dict() | {"dataset": data.summary()}
    window = None  # after the trial: it traces fit's calls, at the steps per call the trial chose
    if job.is_chief and (asked := spec.training.profile_window()) is not None:
        window = TraceWindow(work.tensorboard, *asked, plan)

    def after_call(at: TrainingPosition) -> None:
        if window is not None:  # stopped first: the trace holds steps, not the checkpoint after them
            window.after_call(at)
        schedule.after_call(at)

    recorder = EpochRecorder(tuning.fit_plan(plan, trial), job.attempt, meter, train_function, on_epoch, after_call,
                             reporter.step_progress, names=tasks.epoch_names(data.task, spec.training.metrics),
                             before_call=window.before_call if window is not None else None, trial=trial)
    stopping = table.early_stopping or (None if spec.training.early_stopping == "auto" else spec.training.early_stopping)
    stop_early = StopEarly(stopping) if stopping is not None else None
    try:
        fit(model, tuning.fit_plan(plan, trial), train, val, recorder, stop_early, weights,
            before=[pruner.callback()] if pruner else [])
    finally:
        if window is not None:
            window.close(recorder.position)
    # The final checkpoint and metrics.json are in storage before the job can report success.
    publisher.drain()
    if tb is not None:
        tb.close()
        tb.upload()  # complete: a background upload may have caught the events file mid-write

    if not job.is_chief:
        # Export touches no collective op, so other workers have nothing to contribute to it. They
        # stay up until the chief is done all the same: a machine counts as stopped once any of its
        # hosts exits (local.py; a VM shuts down after its agent), and the worker would replace a
        # machine whose chief is only exporting.
        reporter.set_phase("waiting_for_chief")
        wait_for_chief(job)
        return
    reporter.set_phase("exporting")
    # What the training options did, for the final metrics.
    extra: dict[str, Any] = stop_early.outcome() if stop_early is not None else {}
    if teacher is not None and distilled is not None:
        extra["distillation"] = {"teacher_job": teacher.job_id, "temperature": distilled.temperature,
                                 "alpha": distilled.alpha, "teacher_seconds": round(teacher.seconds, 3),
                                 **distillation.teacher_scores(teacher, data, EVAL_EXAMPLES)}
    if weights is not None:
        extra["class_weight"] = {data.labels[i]: w for i, w in weights.items()}
    extra["step_time_breakdown"] = step_time_breakdown(history, job.attempt, plan.steps_per_execution)
    if window is not None:
        extra["profile"] = window.report(history, job.attempt)
    _export(job, work, plan, data, builder, inputs, model, history, extra)


def _jit_compile(asked: bool | str, hardware: Hardware, replicas: int) -> tuple[bool, tuple[str, ...]]:
    """XLA at compile time, and what the runtime notes say of it. `auto` starts without it: its trial
    turns it on, on a real GPU only (agent/xla_trial.py says why)."""
    if asked is True and hardware.local_devices is not None and replicas > 1:
        # XLA cannot use a variable of another logical device of the same CPU (stock Keras fails the same
        # way: tensorflow.org/xla/known_issues, "tf.Variable on a different device").
        return False, ("jit_compile true: off on this local stand-in, whose replicas are logical devices of one CPU",)
    if asked == "auto" and hardware.kind == "cpu":
        return False, ("jit_compile auto: off; XLA is tried on a GPU (on a CPU it made the built-in models 3-8x "
                       "slower per step, bench/README.md)",)
    return asked is True, ()


def _compile_and_restore(builder: Any, inputs: ModelInputs, plan: RuntimePlan, training: TrainingSpec, strategy: Any,
                         store: CheckpointStore, jit_compile: bool) -> tuple[Any, Any, TrainingPosition, pruning.Pruner | None]:
    """The compiled model under the strategy, with the newest checkpoint (if any) loaded into it,
    where training stood when that checkpoint was taken, and its pruning masks (training.pruning),
    which the checkpoint holds too."""
    import tensorflow as tf

    with strategy.scope():
        model = build(builder, inputs)
        model.compile(optimizer=make_optimizer(training, plan), loss=tasks.loss(inputs.task, training.loss),
                      metrics=tasks.metrics(inputs.task, inputs.target_mean, inputs.target_std, training.metrics),
                      steps_per_execution=plan.steps_per_execution, jit_compile=jit_compile)
        if (distilled := training.distillation) is not None:
            distillation.install(model, inputs.task, distilled.temperature, distilled.alpha)
        if not model.built:
            model.build((None, *inputs.input_shape))
        # Built now, not lazily on the first step, so a checkpoint has variables to restore into.
        model.optimizer.build(model.trainable_variables)
        pruner = pruning.for_spec(model, training, plan.steps_per_epoch)
        masks = {"pruning": pruner.masks} if pruner is not None else {}
        checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, **masks)
        saved_at = store.restore(checkpoint, plan.steps_per_epoch)
    if pruner is not None:
        pruner.restore_progress()
    return model, checkpoint, saved_at, pruner


def _export(job: AgentJob, work: WorkDir, plan: RuntimePlan, data: LocalDataset, builder: Any, inputs: ModelInputs,
            model: Any, history: list[dict[str, Any]], extra: dict[str, Any]) -> None:
    paths, tflite_options = job.paths, job.spec.export.tflite
    out = work.artifacts
    out.mkdir(parents=True, exist_ok=True)
    exported = export.float32_copy(builder, inputs, model)
    serving = tasks.serving_model(exported, inputs.task, inputs.target_mean, inputs.target_std)
    labels = export.labels_doc(data)
    encoder = columns.encoder(data.columns) if data.columns is not None else None
    export.save_model(serving, inputs.input_shape, out / "saved_model", labels, data.columns, encoder)
    export.write_labels(out / export.LABELS_NAME, labels)  # next to saved_model/ and model.tflite
    # Without a validation split there is nothing to score: empty arrays give scores of None.
    held_out, limit = data.validation or data.train, EVAL_EXAMPLES if data.validation else 0
    val_x, val_y = read_arrays(data, held_out, limit)
    last = history[-1] if history else {}
    final: dict[str, Any] = {k: last.get(k) for k in tasks.epoch_names(data.task, job.spec.training.metrics)}
    # A CSV's columns: the served model is fed the rows' cells as they are.
    raw_x = read_columns(data, held_out, limit)[0] if data.columns is not None else val_x
    final.update(export.saved_model_scores(out / "saved_model", data.task, raw_x, val_y))
    source = variants.Source(out, work.root, builder, inputs, model, exported, serving, labels, data, encoder)
    if tflite_options is not None:
        calibration, _ = read_arrays(data, data.train, tflite_options.calibration_limit)
        converted = out / "saved_model"
        if data.columns is not None:  # TFLite holds no string lookups: it takes the encoded vector
            converted = work.root / variants.ENCODED_MODEL
            export.save_model(serving, inputs.input_shape, converted, labels)
        tflite = export.to_tflite(converted, tflite_options, calibration)
        (out / "model.tflite").write_bytes(tflite)
        final.update(tflite_quantization=tflite_options.quantization, tflite_io_type=tflite_options.io_type,
                     tflite_bytes=len(tflite))
        final.update(export.tflite_scores(tflite, data.task, val_x, val_y))
    made = variants.export_variants(job.spec.export, source)
    if (asked := job.spec.training.pruning) is not None:  # what the exported model's kernels hold
        final["pruning"] = {"target_sparsity": asked.target_sparsity, "schedule": asked.schedule,
                            "layers": pruning.sparsity(exported, asked.layers)}
    final["saved_model_gzip_bytes"] = export.gzip_size(out / "saved_model")
    if tflite_options is not None:
        final["tflite_gzip_bytes"] = export.gzip_size(out / "model.tflite")
    compared = optimization.report(made, out, data.task, raw_x, val_x, val_y)
    (out / optimization.OPTIMIZATION_NAME).write_text(json.dumps(compared, indent=2))
    final["optimization"] = optimization.summary(compared)
    final.update(_throughput(history, job.attempt))
    final.update(extra)
    final.update(eval_examples=int(len(val_y)), epochs=plan.epochs, initial_epoch=plan.initial_epoch,
                 initial_step=plan.initial_step, optimizer_iterations=int(model.optimizer.iterations.numpy()),
                 precision=plan.precision, replicas=plan.replicas, global_batch_size=plan.global_batch_size)
    log.info("final metrics: %s", json.dumps(final))
    (out / ARTIFACT_METRICS).write_text(json.dumps(final, indent=2))
    (out / ARTIFACT_HISTORY).write_text(json.dumps(history, indent=2))
    files = storage.local_files(out)  # listed once: the manifest names exactly what is uploaded
    manifest = export.artifact_manifest(out, paths.artifacts, files)
    storage.upload_dir(out, paths.artifacts, found=files)
    # Last, so its presence means every artifact it lists is in place.
    storage.write_json(paths.artifact_manifest, manifest)


def _model_inputs(params: dict[str, Any], data: LocalDataset, builtin: bool) -> ModelInputs:
    mean = variance = None
    if builtin:
        x, _ = read_arrays(data, data.train, STATS_EXAMPLES)
        axes = tuple(range(x.ndim - 1))
        mean, variance = tuple(x.mean(axis=axes).tolist()), tuple(x.var(axis=axes).tolist())
    outputs = tasks.num_outputs(data.task, data.num_classes, len(data.target_names))
    return ModelInputs(data.input_shape, outputs, dict(params), mean, variance, task=data.task,
                       target_mean=data.target_mean, target_std=data.target_std)


def _previous_history(metrics_uri: str, initial_epoch: int) -> list[dict[str, Any]]:
    if not initial_epoch:
        return []
    doc = storage.read_json(metrics_uri) or {}
    return [e for e in doc.get("history", []) if e["epoch"] <= initial_epoch]


def _metrics_doc(job: AgentJob, plan: RuntimePlan, history: list[dict[str, Any]]) -> dict[str, Any]:
    return {"job_id": job.job_id, "attempt": job.attempt, "epochs": plan.epochs,
            "initial_epoch": plan.initial_epoch, "initial_step": plan.initial_step, "history": history}


def _throughput(history: list[dict[str, Any]], attempt: int) -> dict[str, Any]:
    """Medians over this attempt's epochs, leaving out its first (tracing and compilation) when it
    trained more than one."""
    ours = [e for e in history if e["attempt"] == attempt] or history
    if len(ours) > 1:
        ours = ours[1:]
    if not ours:
        return {}
    return {k: statistics.median(e[k] for e in ours) for k in ("examples_per_sec", "step_time_ms", "input_wait_fraction")}
