"""A program job on the machine (issue 20): the user's own training script, run as a child process of
the agent with the runtime (trainjobs/runtime) to hand it the spec's strategy, precision, step fusion,
batch, data and directories.

The agent itself starts no TensorFlow here: the accelerators are the program's (a TPU opens in one
process only). What it does around the program:

- fetches the code (the uploaded .py, archive or folder; trainjobs/program_source.py decides its root
  and entrypoint), the staged dataset, if the job names one, and its channels (agent/channels.py);
- hands it SageMaker's and Vertex AI's names for all of it (trainjobs/program_env.py), and
  `program.hyperparameters` as `--name value` arguments after `program.args`;
- installs `program.requirements` into an environment layered over its own (agent/requirements.py);
- restores the checkpoint directory from the job's storage before the program starts, and uploads each
  save the program writes there as soon as it is whole (agent/checkpoint_sync.py);
- follows the runtime's reports (trainjobs/program_env.REPORTS_FILE: JSON lines) into the job's status,
  metrics.json and progress;
- passes a SIGTERM on to the program (the runtime's callback saves at the next step and stops), kills
  it when the grace runs out, and uploads the checkpoint it left;
- on exit 0, uploads the chief's model directory as the job's artifacts, with the manifest; on any other
  status the job fails with the exit status and the end of the program's output, except when a signal
  killed the program (the kernel's out-of-memory killer, a crash in native code) while the agent was
  not stopping it: that attempt failed for the machine's reason and the worker retries it
  (ProgramKilled, within limits.max_retries).

The program's output is the job's live log, line by line, in the agent's log file.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainjobs import program_env, storage
from trainjobs.job_paths import ARTIFACT_HISTORY, ARTIFACT_METRICS
from trainjobs.program_source import entrypoint_in, is_archive, root_of, single_file_entrypoint, unpack
from trainjobs.stop_request import term_grace_s
from agent import export
from agent.checkpoint_sync import CheckpointWatch, restore as restore_checkpoints
from agent.job import AgentJob, WorkDir, wait_for_chief
from agent.status import RetryableFailure, StatusReporter

log = logging.getLogger("trainjobs.agent")
program_log = logging.getLogger("trainjobs.program")

OUTPUT_TAIL_LINES = 40  # of the program's output, in job.error when it fails ...
OUTPUT_TAIL_CHARS = 3500  # ... at most this much of their end (the status keeps 4,000 characters of a message)
STOP_MARGIN_S = 5.0  # of the SIGTERM grace kept for the last uploads after the program is stopped
MAX_REPORT_LINE = 1 << 20  # bytes of one line of the runtime's reports; longer ones are skipped
REPORT_READ_BYTES = 4 << 20  # read from the reports file at a time
MAX_REPORTED_NAMES, MAX_REPORTED_CHARS = 64, 200  # per report: metrics (or plan values), and their texts
MAX_REPORTED_LIST = 16  # items of a list value (the plan's notes)
MAX_EPOCH = 100_000


class ProgramFailed(Exception):
    """The program exited with a status other than 0; the message says which and how it ended."""


class ProgramKilled(ProgramFailed, RetryableFailure):
    """A signal the agent did not send ended the program: another attempt may well succeed (the worker
    retries it within limits.max_retries), where a program that exits non-zero by itself would fail again."""


# What a signal that ends a program most often means, for the message the user reads.
_SIGNAL_CAUSES = {
    signal.SIGKILL: "often the kernel's out-of-memory killer: the machine ran out of memory",
    signal.SIGSEGV: "a crash in native code (TensorFlow, a driver, an extension module)",
    signal.SIGBUS: "a crash in native code, or a file it had mapped shrank or its disk filled",
    signal.SIGABRT: "an abort in native code (a failed check in TensorFlow or a library)",
    signal.SIGTERM: "stopped by another process of the machine",
}


def killed_by(signum: int) -> str:
    """'signal 9 (SIGKILL: often the kernel's out-of-memory killer: ...)'."""
    try:
        sig = signal.Signals(signum)
    except ValueError:
        return f"signal {signum}"
    cause = _SIGNAL_CAUSES.get(sig)
    return f"signal {signum} ({sig.name}{': ' + cause if cause else ''})"


def run_program(job: AgentJob, work: WorkDir, reporter: StatusReporter, terminated: type[BaseException]) -> None:
    from agent.data import download_dataset, save_local
    from agent.requirements import (
        LEGACY_KERAS_ENV, image_versions, install_requirements, installed_version, keras_2_requirements,
    )
    from agent.models import local_code_path

    spec = job.spec
    program = spec.program
    assert program is not None
    reporter.set_phase("downloading")
    root, entrypoint = _fetch(local_code_path(program.source, work.program, "program source"),
                              program.entrypoint, work.program)
    data_dir = None
    summary: dict[str, Any] | None = None
    if job.dataset_uri:
        data = download_dataset(job.dataset_uri, work.data)
        save_local(data, work.data)
        data_dir, summary = work.data, data.summary()
    channel_files: dict[str, list[str]] = {}
    if program.channels:  # as SageMaker does: each in <input>/data/<name> before the program starts
        from agent.channels import download_channels

        channel_files = download_channels(list(program.channels), job.paths, work.root / "input" / "data")

    python = sys.executable
    timings: dict[str, float] = {}
    requirements = list(program.requirements)
    if program.keras == 2:  # tf_keras, where the image lacks it (agent/requirements.py)
        requirements += keras_2_requirements(requirements, image_versions(), installed_version("tf-keras"))
    if requirements:
        reporter.set_phase("installing")
        started = time.monotonic()
        python = str(install_requirements(requirements, work.root / "requirements"))
        timings["install_s"] = round(time.monotonic() - started, 3)

    model_dir = work.artifacts if job.is_chief else work.root / "model-not-chief"
    for d in (model_dir, work.checkpoints, work.tensorboard):
        d.mkdir(parents=True, exist_ok=True)
    restored, committed = restore_checkpoints(job.paths.checkpoints, work.checkpoints, clean=job.is_chief)
    if committed is not None:
        log.info("restored checkpoint set %s (%d file(s), attempt %s) into the program's checkpoint directory",
                 committed.get("set"), len(restored), committed.get("attempt"))
    reports = work.root / "reports.jsonl"
    runtime_file = work.root / "runtime.json"
    runtime_file.write_text(json.dumps({
        "job_id": job.job_id, "attempt": job.attempt, "task_index": job.task_index,
        "spec": spec.model_dump(mode="json"), "restored_checkpoint": bool(restored),
    }))
    argv = [*program.args, *program_env.hyperparameter_args(program.hyperparameters)]
    env = _environment(job, entrypoint.relative_to(root).as_posix(), argv, runtime_file, reports, model_dir, work,
                       data_dir, channel_files)
    if program.keras == 2:
        env[LEGACY_KERAS_ENV] = "1"  # `tf.keras` is tf_keras, and the runtime follows (trainjobs/runtime)

    follower = ReportFollower(job, reporter, reports, summary, timings)
    watch = CheckpointWatch(work.checkpoints, job.paths.checkpoints, upload=job.is_chief, attempt=job.attempt,
                            committed=committed)
    reporter.runtime = {"program": True, "entrypoint": entrypoint.relative_to(root).as_posix(),
                        "restored_checkpoint": bool(restored), **({"dataset": summary} if summary else {}), **timings}
    reporter.set_phase("training")
    log.info("running %s %s", entrypoint.relative_to(root).as_posix(), " ".join(argv))
    # In the agent's process group, so a provisioner's delete (which signals the group) reaches it, and
    # killed by the kernel if the agent dies without a word (SIGKILL, say): never left training alone.
    proc = subprocess.Popen([python, str(entrypoint), *argv], cwd=root, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
    tail: deque[str] = deque(maxlen=OUTPUT_TAIL_LINES)
    pump = threading.Thread(target=_pump, args=(proc, tail), name="program-output", daemon=True)
    pump.start()
    alive_at = time.time()  # the last time the program was seen running
    try:
        while True:
            seen = time.time()
            if proc.poll() is not None:
                break
            alive_at = seen
            time.sleep(0.2)
            saved = follower.poll()  # the runtime said a save is complete: no need to wait for quiet
            watch.turn(saved=saved)
    except terminated:
        _stop(proc)
        pump.join(timeout=2)
        follower.poll()
        watch.last(alive_until=_killed_at(proc, alive_at))
        raise
    pump.join(timeout=10)
    follower.poll()
    watch.last(alive_until=_killed_at(proc, alive_at))
    if proc.returncode != 0:
        # The end of the output is what says why (a traceback's last line): it is what job.error keeps.
        output = "its last output:\n" + "\n".join(tail)[-OUTPUT_TAIL_CHARS:]
        if proc.returncode < 0:
            raise ProgramKilled(f"the program was killed by {killed_by(-proc.returncode)}; an attempt that failed "
                                f"for the machine's reason, retried within limits.max_retries; {output}")
        raise ProgramFailed(f"the program exited with status {proc.returncode}; {output}")
    follower.finish()
    if not job.is_chief:
        reporter.set_phase("waiting_for_chief")
        wait_for_chief(job)
        return
    reporter.set_phase("exporting")
    out = model_dir
    final = follower.final_metrics()
    # The job's record reads these two; a program's own files of the same names are left as they are.
    for name, doc in ((ARTIFACT_METRICS, final), (ARTIFACT_HISTORY, follower.history)):
        if (out / name).exists():
            log.warning("the program wrote its own %s to the model directory: kept, and the job's metrics "
                        "come from its reports only", name)
        else:
            (out / name).write_text(json.dumps(doc, indent=2))
    _keep_output_data(work, out)
    files = storage.local_files(out)  # listed once: the manifest names exactly what is uploaded
    manifest = export.artifact_manifest(out, job.paths.artifacts, files)
    storage.upload_dir(out, job.paths.artifacts, found=files)
    if work.tensorboard.exists() and any(work.tensorboard.iterdir()):
        storage.upload_dir(work.tensorboard, job.paths.tensorboard)
    storage.write_json(job.paths.artifact_manifest, manifest)  # last: its presence means every artifact is in


def _fetch(local: Path, entrypoint: str | None, dest: Path) -> tuple[Path, Path]:
    """(the folder the program runs in, its entrypoint file)."""
    if local.is_dir():
        names = [p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()]
        return local, local / entrypoint_in(names, entrypoint, root="")
    if is_archive(local.name):
        names = unpack(local, dest / "unpacked")
        return dest / "unpacked" / root_of(names), dest / "unpacked" / entrypoint_in(names, entrypoint)
    single_file_entrypoint(local.name, entrypoint)
    return local.parent, local


def _environment(job: AgentJob, entry_point: str, argv: list[str], runtime_file: Path, reports: Path,
                 model_dir: Path, work: WorkDir, data_dir: Path | None,
                 channel_files: dict[str, list[str]]) -> dict[str, str]:
    """The agent's environment (already the allow-listed one the provisioner gave it), the program's own
    variables, and what the runtime and other platforms' scripts read (trainjobs/program_env.py)."""
    program = job.spec.program
    assert program is not None
    env = {**os.environ, **program.env}
    places = {program_env.MODEL_DIR: model_dir, program_env.CHECKPOINT_DIR: work.checkpoints,
              program_env.TENSORBOARD_DIR: work.tensorboard}
    if data_dir is not None:
        places[program_env.DATA_DIR] = data_dir
    for name, path in places.items():
        env[name] = str(path)
        for alias in program_env.ALIASES.get(name, ()):
            env[alias] = str(path)
    input_dir, output_dir = work.root / "input", work.root / "output"
    channels = {name: str(input_dir / "data" / name) for name in channel_files}
    if data_dir is not None:  # the staged dataset is SageMaker's default channel, unless the job names one
        channels.setdefault(program_env.TRAINING_CHANNEL, str(data_dir))
    setting = program_env.ProgramSetting(
        job_id=job.job_id, workers=job.spec.workers, task_index=job.task_index,
        instance_type=_instance_type(job), num_cpus=len(os.sched_getaffinity(0)), num_gpus=_gpus(job),
        entry_point=entry_point, module_dir=program.source,
        hyperparameters=_hyperparameters(program.args, program.hyperparameters), user_args=argv,
        channels=channels, model_dir=str(model_dir), input_dir=str(input_dir), output_dir=str(output_dir),
        channel_files=channel_files, tf_config=os.environ.get("TF_CONFIG") or None)
    env.update(program_env.sagemaker_env(setting))
    env.update(program_env.vertex_env(setting))
    # SageMaker's folders exist before its script starts, and its config files with them.
    for d in (input_dir / "config", output_dir / "data"):
        d.mkdir(parents=True, exist_ok=True)
    for name, doc in program_env.sagemaker_config_files(setting).items():
        (input_dir / "config" / name).write_text(json.dumps(doc))
    env[program_env.RUNTIME_FILE] = str(runtime_file)
    env[program_env.REPORTS_FILE] = str(reports)
    env["PYTHONUNBUFFERED"] = "1"  # its output is the live log
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's start-up notices, unless the program asks
    # The agent's own code and the runtime, importable by the program under any interpreter.
    here = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    return env


def _hyperparameters(args: list[str], given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """SageMaker's SM_HPS: the `--name value` pairs of the arguments, and program.hyperparameters over
    them (passed after the arguments, they are what argparse keeps of a name given twice)."""
    return {**program_env.hyperparameters_of_args(args), **(given or {})}


def _instance_type(job: AgentJob) -> str:
    acc = job.spec.accelerator
    kind = getattr(acc, "gpu_type", None) or getattr(acc, "tpu_type", None)
    return f"{acc.type}:{kind}" if kind else acc.type


def _gpus(job: AgentJob) -> int:
    return int(getattr(job.spec.accelerator, "count", 0)) if job.spec.accelerator.type == "gpu" else 0


def _keep_output_data(work: WorkDir, out: Path) -> None:
    """SageMaker keeps what a script writes to SM_OUTPUT_DATA_DIR (its output.tar.gz): here it goes with
    the artifacts, under output/data/, unless the program made an output/ of its own there."""
    data = work.root / "output" / "data"
    if data.is_symlink():  # the program put a link in the folder's place: where it leads is not its output
        log.warning("SM_OUTPUT_DATA_DIR was replaced by a link to %s: not kept", os.path.realpath(data))
        return
    if data.is_dir() and any(data.iterdir()) and not (out / "output").exists():
        # Links are copied as links (storage.local_files uploads only those that stay inside).
        shutil.copytree(data, out / "output" / "data", symlinks=True, ignore=_special_files)


def _special_files(folder: str, names: list[str]) -> list[str]:
    """Named pipes, sockets, devices: nothing to keep, and copying one fails the job after its program succeeded."""
    def special(name: str) -> bool:
        mode = os.lstat(os.path.join(folder, name)).st_mode
        return not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode))

    return [name for name in names if special(name)]


def _killed_at(proc: subprocess.Popen[bytes], alive_at: float) -> float | None:
    """None if the program exited by itself (its files are as it left them); else when it was last seen
    alive (a signal may have cut a file off mid-write after that)."""
    return None if proc.returncode is not None and proc.returncode >= 0 else alive_at


def _pump(proc: subprocess.Popen[bytes], tail: deque[str]) -> None:
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        tail.append(line)
        program_log.info("%s", line)


def _die_with_parent() -> None:
    """In the program's process before it runs: SIGKILL when the agent's thread that started it ends
    (prctl PR_SET_PDEATHSIG, Linux); elsewhere nothing."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the program (the runtime saves and stops at the next step; a delete may have sent
    it one already), then SIGKILL when the grace is nearly over."""
    if proc.poll() is not None:
        return
    log.warning("SIGTERM: asking the program to checkpoint and stop")
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(max(1.0, term_grace_s() - STOP_MARGIN_S))
    except subprocess.TimeoutExpired:
        log.warning("the program did not stop in time; killing it")
        proc.kill()
        proc.wait()


class ReportFollower:
    """Reads the runtime's JSON lines as they are appended: the plan it resolved, per-epoch metrics
    (Keras logs or tj.report), progress, saved checkpoints."""

    def __init__(self, job: AgentJob, reporter: StatusReporter, path: Path, dataset: dict[str, Any] | None,
                 timings: dict[str, float]):
        self.job, self.reporter, self.path = job, reporter, path
        self.dataset, self.timings = dataset, timings
        self.history: list[dict[str, Any]] = self._previous() if job.is_chief else []
        self._offset = 0
        self._partial = b""
        self._skipping = False
        self.plan: dict[str, Any] = {}
        self.initial_epoch = 0

    def _previous(self) -> list[dict[str, Any]]:
        if self.job.attempt <= 1:
            return []
        doc = storage.read_json(self.job.paths.metrics) or {}
        return list(doc.get("history", []))

    def poll(self) -> bool:
        """Reads what is new; True when the runtime saved a checkpoint since the last poll."""
        saved = epochs = False
        while True:  # a bounded read at a time: the program may write gigabytes there
            try:
                with self.path.open("rb") as f:
                    f.seek(self._offset)
                    chunk = f.read(REPORT_READ_BYTES)
            except FileNotFoundError:
                break
            self._offset += len(chunk)
            saved_now, epochs_now = self._lines(chunk)
            saved, epochs = saved or saved_now, epochs or epochs_now
            if len(chunk) < REPORT_READ_BYTES:
                break
        if epochs:
            if self.job.is_chief:
                storage.write_json(self.job.paths.metrics, self._metrics_doc())
            self.reporter.write()
        return saved

    def _lines(self, chunk: bytes) -> tuple[bool, bool]:
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_REPORT_LINE:  # never a line of the runtime's: not kept in memory
            if not self._skipping:
                log.warning("ignored a report line of over %d bytes in %s", MAX_REPORT_LINE, self.path.name)
            self._partial, self._skipping = b"", True
        saved = epochs = False
        for line in lines:
            if self._skipping:  # the end of a line too long to read
                self._skipping = False
                continue
            try:
                event = json.loads(line) if len(line) <= MAX_REPORT_LINE else None
                if not isinstance(event, dict):
                    raise ValueError("not a JSON object")
                saved_now, epoch_now = self._apply(event)
            except (ValueError, TypeError, OverflowError) as exc:
                # The program may write anything there: a line we cannot read is skipped, never trusted.
                log.warning("ignored a report line (%s): %.200s", exc, line.decode(errors="replace"))
                continue
            saved, epochs = saved or saved_now, epochs or epoch_now
        return saved, epochs

    def _apply(self, event: dict[str, Any]) -> tuple[bool, bool]:
        """One report: (a checkpoint was saved, an epoch's metrics came)."""
        kind = event.get("kind")
        if kind == "runtime" and isinstance(event.get("plan"), dict):
            plan = _scalars(event["plan"])
            self.plan = dict(list({**self.plan, **plan}.items())[:MAX_REPORTED_NAMES])
            if "initial_epoch" in plan:  # fit begins: where the restored checkpoint stands
                self.initial_epoch = int(plan["initial_epoch"] or 0)
                # An epoch the checkpoint does not hold is trained again: its old entry goes.
                self.history = [e for e in self.history if e.get("epoch", 0) <= self.initial_epoch]
            self.reporter.runtime = {**(self.reporter.runtime or {}), **self.plan}
            self.reporter.epoch = self.initial_epoch
            self.reporter.write()
        elif kind == "checkpoint":
            return True, False
        elif kind == "progress":
            self.reporter.step_progress_fraction(min(1.0, max(0.0, float(event.get("fraction") or 0.0))))
        elif kind == "metrics":
            # Everything read and checked before anything changes: a bad report changes nothing.
            entry = _scalars(event.get("metrics") or {})
            entry.update(epoch=int(event.get("epoch") or len(self.history) + 1), attempt=self.job.attempt)
            if not 0 < entry["epoch"] <= MAX_EPOCH:
                raise ValueError(f"epoch {entry['epoch']} is not between 1 and {MAX_EPOCH}")
            if event.get("step") is not None:
                entry["step"] = int(event["step"])
            total = None if event.get("epochs") is None else max(1, int(event["epochs"]))
            self.history = [e for e in self.history if e.get("epoch") != entry["epoch"]] + [entry]
            if len(self.history) > MAX_EPOCH:
                self.history = self.history[-MAX_EPOCH:]
            if total is not None:
                self.reporter.step_progress_fraction(min(1.0, entry["epoch"] / total))
            self.reporter.epoch_done(entry["epoch"], entry, write=False, progress=False)
            return False, True
        return False, False

    def _metrics_doc(self) -> dict[str, Any]:
        return {"job_id": self.job.job_id, "attempt": self.job.attempt,
                "epochs": self.plan.get("epochs", self.job.spec.training.epochs),
                "initial_epoch": self.initial_epoch, "history": self.history}

    def finish(self) -> None:
        if self.job.is_chief and self.history:
            storage.write_json(self.job.paths.metrics, self._metrics_doc())

    def final_metrics(self) -> dict[str, Any]:
        last = self.history[-1] if self.history else {}
        final = {k: v for k, v in last.items() if k not in ("attempt",)}
        final.update({k: self.plan[k] for k in ("strategy", "precision", "replicas", "global_batch_size",
                                                "steps_per_execution", "initial_epoch") if k in self.plan})
        final.update(self.timings)
        return final


def _scalar(v: Any) -> bool:
    return isinstance(v, int | float | str | bool) or v is None


def _scalars(values: dict[str, Any]) -> dict[str, Any]:
    """What of a report's names and values the job keeps: scalars and short lists of them (the plan's
    notes), names and texts cut short, at most MAX_REPORTED_NAMES of them (the job's status.json has
    1 MiB)."""
    if not isinstance(values, dict):
        raise TypeError("metrics are not a JSON object")

    def cut(value: Any) -> Any:
        return value[:MAX_REPORTED_CHARS] if isinstance(value, str) else value

    kept: dict[str, Any] = {}
    for name, value in list(values.items())[:MAX_REPORTED_NAMES]:
        if _scalar(value):
            kept[str(name)[:MAX_REPORTED_CHARS]] = cut(value)
        elif isinstance(value, list) and all(_scalar(v) for v in value):
            kept[str(name)[:MAX_REPORTED_CHARS]] = [cut(v) for v in value[:MAX_REPORTED_LIST]]
    return kept

