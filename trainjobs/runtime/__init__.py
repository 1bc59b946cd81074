"""The runtime a program job imports (issue 20): the spec's strategy, precision, step fusion, batch,
data, directories, metrics, checkpoints and preemption, for any TensorFlow/Keras code.

    from trainjobs import runtime as tj

    strategy = tj.strategy()            # the spec's tf.distribute strategy on this hardware
    with strategy.scope():
        model = build_model()           # the precision policy is already set
        model.compile(..., steps_per_execution=tj.steps_per_execution)
    train = tj.dataset("train", batch_size=tj.global_batch_size)   # the staged data, (x, y) batches
    model.fit(train, epochs=tj.epochs, callbacks=tj.callbacks())   # progress, metrics, resume, TensorBoard
    model.save(tj.model_dir / "model.keras")                       # model_dir comes back as artifacts
    tj.report(epoch=3, loss=0.2, val_auc=0.91)                      # a custom loop's metrics

Values (module attributes, resolved when first read): `steps_per_execution`, `global_batch_size`,
`per_replica_batch_size`, `learning_rate` (scaled as the spec says), `epochs`, `precision`, `replicas`,
`seed`; `is_chief`, `task_index`, `num_workers`; `model_dir`, `checkpoint_dir`, `tensorboard_dir`,
`data_dir` (pathlib.Path; data_dir is None without a dataset). The agent also sets the names scripts for
Vertex AI (AIP_MODEL_DIR, AIP_CHECKPOINT_DIR, AIP_TENSORBOARD_LOG_DIR) and SageMaker (SM_MODEL_DIR,
SM_CHANNEL_TRAINING, SM_HPS) read (trainjobs/program_env.py).

Preemption: Keras 3 has no save_before_preemption, so the runtime owns it. Once a program has asked for
`tj.callbacks()` or `tj.should_stop()`, a SIGTERM (the cloud's, or the worker's delete) only sets a flag:
the callbacks save a checkpoint at the next step and end `fit`; a custom loop reads `tj.should_stop()`,
saves, and calls `tj.checkpoint_saved()`. A program that asked for neither is ended by SIGTERM as usual.
The next attempt finds the checkpoint directory as it was saved (the agent restores it first), and
`tj.callbacks()`' BackupAndRestore continues from it.

Keras 2 or 3: a program run with TF_USE_LEGACY_KERAS=1 (`program.keras: 2`) builds its models with
tf_keras, TensorFlow's rule for what `tf.keras` is; the runtime then sets tf_keras' precision policy and
seed and gives it tf_keras callbacks (a Keras 3 callback in a tf_keras fit is refused, and Keras 3's
policy does not reach tf_keras layers). Otherwise, Keras 3.

Run outside a job (by hand, on a laptop), the same code works: the spec is TRAINJOBS_SPEC's (a JSON
file) or the defaults, on this machine's devices, and the directories are under ./trainjobs-local.

Imports the core and the agent (tests/unit/test_layers.py: the runtime layer); TensorFlow and Keras
are imported when first needed.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from trainjobs import program_env

_lock = threading.RLock()
_state: dict[str, Any] = {}
_stop = threading.Event()
_cooperative = threading.Event()  # the program reads the stop flag (callbacks or should_stop)
LOCAL_ROOT = "trainjobs-local"
LEGACY_KERAS_ENV = program_env.LEGACY_KERAS_ENV  # set by the agent for `program.keras: 2`

_PLAN_VALUES = ("steps_per_execution", "global_batch_size", "per_replica_batch_size", "learning_rate", "epochs",
                "precision", "replicas", "seed", "strategy_name")
_DIRS = {"model_dir": program_env.MODEL_DIR, "checkpoint_dir": program_env.CHECKPOINT_DIR,
         "tensorboard_dir": program_env.TENSORBOARD_DIR}


def __getattr__(name: str) -> Any:
    if name in _PLAN_VALUES:
        return plan()[name]
    if name in _DIRS:
        return _directory(_DIRS[name], name)
    if name == "data_dir":
        raw = os.environ.get(program_env.DATA_DIR)
        return Path(raw) if raw else None
    if name in ("is_chief", "task_index", "num_workers"):
        return _cluster()[name]
    raise AttributeError(f"module 'trainjobs.runtime' has no attribute {name!r}")


def in_job() -> bool:
    """True when the agent runs this program for a job."""
    return bool(os.environ.get(program_env.RUNTIME_FILE))


def _config() -> dict[str, Any]:
    with _lock:
        if "config" not in _state:
            path = os.environ.get(program_env.RUNTIME_FILE)
            if path:
                _state["config"] = json.loads(Path(path).read_text())
            else:
                spec_file = os.environ.get("TRAINJOBS_SPEC")
                raw = json.loads(Path(spec_file).read_text()) if spec_file else {}
                raw.setdefault("program", {"source": "local.py"})
                raw.pop("model", None)
                _state["config"] = {"job_id": None, "attempt": 1, "task_index": 0, "spec": raw}
        return dict(_state["config"])


def _spec() -> Any:
    from trainjobs.spec import JobSpec, parse_stored

    raw = _config()["spec"]
    return parse_stored(raw) if in_job() else JobSpec.model_validate(raw)


def _directory(env_name: str, attr: str) -> Path:
    raw = os.environ.get(env_name)
    path = Path(raw) if raw else Path.cwd() / LOCAL_ROOT / attr.removesuffix("_dir")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _cluster() -> dict[str, Any]:
    tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    workers = len((tf_config.get("cluster") or {}).get("worker") or []) or 1
    index = int((tf_config.get("task") or {}).get("index", _config().get("task_index", 0)))
    return {"is_chief": index == 0, "task_index": index, "num_workers": workers}


def strategy() -> Any:
    """The spec's tf.distribute strategy on this machine, built once; the spec's precision policy and
    seed are set with it. In a job it is built when the runtime is imported (see the end of this
    module); outside one, call it before other TensorFlow work."""
    with _lock:
        if "strategy" not in _state:
            _state["strategy"] = _build()
        return _state["strategy"]


def plan() -> dict[str, Any]:
    """What the runtime resolved for this machine: strategy, replicas, precision, batch, learning rate,
    steps per execution, epochs."""
    strategy()
    return dict(_state["plan"])


def legacy_keras() -> bool:
    """True when `tf.keras` is tf_keras in this process: TensorFlow's own test of TF_USE_LEGACY_KERAS
    (tensorflow/python/util/lazy_loader.py)."""
    return os.environ.get(LEGACY_KERAS_ENV) in ("true", "True", "1")


def _keras() -> Any:
    """The Keras the program's models are built with: tf_keras under TF_USE_LEGACY_KERAS, else Keras 3."""
    import importlib

    return importlib.import_module("tf_keras" if legacy_keras() else "keras")


def _build() -> Any:
    from agent import devices, keras_compat
    from agent.plan import strategy_to_build
    from trainjobs.spec.derived import (
        AUTO_STEPS_PER_EXECUTION, global_batch_size, resolve_precision, scaled_learning_rate,
    )

    spec = _spec()
    if (n := devices.local_device_count()) is not None:
        devices.configure_local_devices(n)
    hardware = devices.detect_hardware(spec)
    name = strategy_to_build(spec, hardware)
    built = devices.build_strategy(name, hardware)
    replicas = int(built.num_replicas_in_sync)
    precision = resolve_precision(spec.precision, hardware.kind, hardware.gpu_compute_capability)
    keras = _keras()
    keras.mixed_precision.set_global_policy(precision)
    # What the managed trainer repairs in the Keras at hand (agent/keras_compat.py), for the program's
    # models too: metrics over every replica in the images' older Keras, and fit under multi-worker.
    # Each is a repair of Keras 3's internals: tf_keras has neither fault.
    repairs = [] if legacy_keras() else keras_compat.repair_before_build()
    if name == "multi_worker_mirrored" and not legacy_keras():
        repairs += keras_compat.repair_multi_worker_fit(None, built)
    keras.utils.set_random_seed(spec.training.seed)
    batch = global_batch_size(spec.training, replicas)
    spe = spec.steps_per_execution
    _state["plan"] = {
        "strategy_name": name, "strategy": name, "requested_strategy": spec.resolved_strategy,
        "hardware": hardware.kind, "local_devices": hardware.local_devices, "workers": spec.workers,
        "replicas": replicas, "precision": precision, "global_batch_size": batch,
        "per_replica_batch_size": batch // replicas,
        "steps_per_execution": AUTO_STEPS_PER_EXECUTION[hardware.kind] if spe == "auto" else spe,
        "learning_rate": scaled_learning_rate(spec.training, batch), "epochs": spec.training.epochs,
        "seed": spec.training.seed, **({"notes": repairs} if repairs else {}),
    }
    _emit({"kind": "runtime", "plan": {k: v for k, v in _state["plan"].items() if k != "strategy_name"}})
    return built


def dataset(split: str = "train", batch_size: int | None = None, *, shuffle: bool | None = None,
            drop_remainder: bool | None = None) -> Any:
    """The job's staged dataset as a tf.data.Dataset of (features, labels) batches, one pass over
    `split` ("train" or "validation"); batch_size defaults to the global batch. The training split is
    shuffled (by the spec's seed) and drops its last partial batch unless told otherwise. Under
    multi-worker training tf.distribute shards it over the workers by batch."""
    from agent.data import load_local, split_dataset

    data_dir = __getattr__("data_dir")
    if data_dir is None:
        raise RuntimeError("this job names no dataset: give spec.dataset, or read your data yourself")
    training = split == "train"
    return split_dataset(load_local(data_dir), split, batch_size or plan()["global_batch_size"],
                         shuffle=training if shuffle is None else shuffle, seed=plan()["seed"],
                         drop_remainder=training if drop_remainder is None else drop_remainder)


def dataset_info() -> dict[str, Any] | None:
    """The staged dataset's shape: feature_shape, num_classes, class_names, examples per split."""
    from agent.data import load_local

    data_dir = __getattr__("data_dir")
    return None if data_dir is None else load_local(data_dir).summary()


def callbacks(*, checkpoint_every_steps: int | None = None, tensorboard: bool = True) -> list[Any]:
    """Keras callbacks for `fit`: resume from the checkpoint directory (BackupAndRestore, saved every
    epoch, or every `checkpoint_every_steps` steps, and at the next step after a SIGTERM), the job's
    progress and per-epoch metrics, and TensorBoard events in tensorboard_dir."""
    keras = _keras()
    _watch_sigterm()
    _cooperative.set()
    found = [_backup_callback(keras, checkpoint_every_steps), _report_callback(keras)]
    if not legacy_keras():  # tf_keras runs steps_per_execution under every strategy itself
        found.append(_step_fusion_callback(keras))
    if tensorboard:
        found.append(_tensorboard_callback(keras))
    return found


def report(epoch: int | None = None, step: int | None = None, epochs: int | None = None, **metrics: Any) -> None:
    """Metrics to the job's record and streams: one entry per epoch (a later report for the same epoch
    replaces it). `epochs`, the total, makes the job's progress epoch/epochs."""
    clean = {k: (float(v) if _number(v) else v) for k, v in metrics.items()}
    _emit({"kind": "metrics", "epoch": epoch, "step": step, "epochs": epochs, "metrics": clean})


def progress(fraction: float) -> None:
    """How far the program is, 0..1, for the job's progress."""
    _emit({"kind": "progress", "fraction": float(fraction)})


def should_stop() -> bool:
    """True once the job is being stopped (preemption, cancel, a delete): save and return soon."""
    _watch_sigterm()
    _cooperative.set()
    return _stop.is_set()


def checkpoint_saved() -> None:
    """Tell the agent a checkpoint in checkpoint_dir is complete, so it is uploaded now."""
    _emit({"kind": "checkpoint"})


def _number(v: Any) -> bool:
    try:
        import numpy as np

        return isinstance(v, int | float | np.number) and not isinstance(v, bool)
    except ImportError:  # pragma: no cover - numpy comes with TensorFlow
        return isinstance(v, int | float) and not isinstance(v, bool)


def _emit(event: dict[str, Any]) -> None:
    path = os.environ.get(program_env.REPORTS_FILE)
    line = json.dumps(event, default=float) + "\n"
    if not path:
        if event.get("kind") == "metrics":
            print(f"[trainjobs] {line.strip()}", flush=True)
        return
    with _lock, open(path, "a") as f:
        f.write(line)


def _watch_sigterm() -> None:
    """SIGTERM sets the stop flag while the program reads it; otherwise it ends the program as usual."""
    with _lock:
        if _state.get("sigterm") or threading.current_thread() is not threading.main_thread():
            return
        _state["sigterm"] = True

    def on_sigterm(signum: int, frame: Any) -> None:
        _stop.set()
        if not _cooperative.is_set():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)


def _backup_callback(keras: Any, every_steps: int | None) -> Any:
    legacy = legacy_keras()

    class Backup(keras.callbacks.BackupAndRestore):
        """BackupAndRestore that also saves at the next step after a SIGTERM, tells the agent when a
        save is complete, and keeps its checkpoint when fit ends because the job is stopping."""

        def __init__(self) -> None:
            super().__init__(str(__getattr__("checkpoint_dir")), save_freq=every_steps or "epoch")
            self._stopping = False
            self._call_began_at = 0
            if legacy:
                import tensorflow as tf

                # tf_keras refuses a model built under OneDeviceStrategy (its list names the multi-device
                # strategies only), which the runtime builds for one device: its checkpoint is like any other.
                self._supported_strategies += (tf.distribute.OneDeviceStrategy,)

        def _save_model(self) -> None:  # Keras 3's save
            super()._save_model()
            checkpoint_saved()

        def _backup(self, epoch: int, batch: int = 0) -> None:  # tf_keras' save
            if self.save_freq != "epoch":
                # tf_keras resumes at the step after the one it saved, and records the step a call began at
                # (on_train_batch_begin): with steps_per_execution > 1 the call's other steps ran again.
                self._training_state._ckpt_saved_batch.assign(batch)
            super()._backup(epoch, batch)
            checkpoint_saved()

        def _implements_train_batch_hooks(self) -> bool:  # tf_keras: the stop is seen at a step's end
            return True

        def on_train_begin(self, logs: Any = None) -> None:
            # The restore builds the optimizer's variables; older Keras (3.4, the TF 2.17 images) does
            # so only inside the strategy's scope ("Need to be inside with strategy.scope()").
            with strategy().scope():
                super().on_train_begin(logs)

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            super().on_train_batch_begin(batch, logs)
            self._call_began_at = batch

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            super().on_train_batch_end(batch, logs)
            if _stop.is_set() and not self._stopping:
                self._stopping = True
                self._save_stopped(self._last_step(batch))
                self.model.stop_training = True

        def _save_stopped(self, last_step: int) -> None:
            if not legacy:
                self._last_batch_seen = last_step  # where in the epoch (Keras restores the epoch only)
                self._save_model()
            elif self.save_freq != "epoch":
                self._backup(self._current_epoch, last_step)
            # else nothing: tf_keras reads any checkpoint of save_freq="epoch" as a finished epoch
            # (worker_training_state.maybe_load_initial_counters_from_ckpt), so a save now would skip the
            # rest of this one. The last finished epoch's stays; this epoch is trained again from its start.

        def _last_step(self, batch: int) -> int:
            """The index of the last step the call that just ended ran. Newer Keras (3.15) passes it;
            older (3.4, 3.6: the TF 2.17 and 2.18 images) passes the call's first step, the same index
            on_train_batch_begin had, and a call runs steps_per_execution steps, fewer at the epoch's end."""
            if batch != self._call_began_at:
                return batch
            spe = int(getattr(self.model, "steps_per_execution", 1) or 1)
            steps = self.params.get("steps") or batch + spe
            return min(batch + spe, int(steps)) - 1

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            # fit ends a stopped epoch as if it were complete: saved as such, the next attempt would
            # skip the rest of it. The save above says it is still to be trained.
            if not self._stopping:
                super().on_epoch_end(epoch, logs)

        def on_train_end(self, logs: Any = None) -> None:
            if not self._stopping:
                super().on_train_end(logs)

    return Backup()


def _tensorboard_callback(keras: Any) -> Any:
    """Keras' TensorBoard callback where the tensorboard package is installed; else per-epoch scalars
    written the way the managed trainer writes them (agent/tensorboard.py), which needs only TensorFlow."""
    import importlib.util

    log_dir = __getattr__("tensorboard_dir")
    if importlib.util.find_spec("tensorboard") is not None:
        return keras.callbacks.TensorBoard(log_dir=str(log_dir))
    from agent.tensorboard import ScalarLog

    class Scalars(keras.callbacks.Callback):
        def on_train_begin(self, logs: Any = None) -> None:
            self._log = ScalarLog(log_dir, "")

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self._log.write(epoch + 1, {k: float(v) for k, v in (logs or {}).items() if _number(v) or hasattr(v, "numpy")})

        def on_train_end(self, logs: Any = None) -> None:
            self._log.close()

    return Scalars()


def _step_fusion_callback(keras: Any) -> Any:
    class StepFusion(keras.callbacks.Callback):
        """The model's steps_per_execution, run the trainer's way (agent/step_functions.py): Keras'
        own multi-step function puts each step inside a tf.cond, which MirroredStrategy and
        MultiWorkerMirroredStrategy cannot run (keras-team/keras#19246). Installed as fit begins,
        after Keras made its own functions, so fit and a later evaluate call these."""

        def on_train_begin(self, logs: Any = None) -> None:
            from agent.step_functions import make_finite_train_function, make_test_function

            spe = int(getattr(self.model, "steps_per_execution", 1) or 1)
            if spe > 1:
                self.model.train_function = make_finite_train_function(self.model, spe)
                self.model.test_function = make_test_function(self.model, spe)

    return StepFusion()


def _report_callback(keras: Any) -> Any:
    class Report(keras.callbacks.Callback):
        """The job's progress (at most once a second) and one metrics entry per epoch."""

        def on_train_begin(self, logs: Any = None) -> None:
            self._epochs = int(self.params.get("epochs") or 1)
            self._steps = self.params.get("steps")
            self._epoch = int(getattr(self.model, "_initial_epoch", 0) or 0)
            self._last = 0.0
            # tf_keras' fit reads the epoch to resume at from the checkpoint after on_train_begin: told
            # as its first epoch begins.
            self._told = not legacy_keras()
            if self._told:
                self._tell_initial_epoch()

        def _tell_initial_epoch(self) -> None:
            _emit({"kind": "runtime", "plan": {"initial_epoch": self._epoch, "epochs": self._epochs}})

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._epoch = epoch
            if not self._told:
                self._told = True
                self._tell_initial_epoch()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            now = time.monotonic()
            if self._steps and now - self._last >= 1.0:
                self._last = now
                progress((self._epoch + (batch + 1) / self._steps) / self._epochs)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if _stop.is_set():
                return  # a stopped epoch is not one: the next attempt trains it again
            metrics = {k: float(v) for k, v in (logs or {}).items() if _number(v) or hasattr(v, "numpy")}
            _emit({"kind": "metrics", "epoch": epoch + 1, "step": None, "epochs": self._epochs, "metrics": metrics})

    return Report()


# In a job the strategy is built as the program imports the runtime, its first line: the local
# stand-in's logical devices and multi-worker collectives can only be set up before TensorFlow's first
# op, and a script may well load and resize its data before it asks for the strategy.
if in_job():
    strategy()
