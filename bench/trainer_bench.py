"""Trainer benchmark (issue 4 §9): training throughput of a job run through the agent against the
hand-written Keras script in bench/baseline_keras.py, same model, data and strategy, in one run.
Goal: agent >= 0.95x baseline.

1. Data: N synthetic digits-shaped 8x8x1 images in 10 classes (sklearn's digits, resampled with
   pixel noise), staged with worker.staging.stage_dataset into an in-memory GCS emulator.
2. Per configuration (mirrored over 2 logical CPUs; default strategy on 1), runs interleaved in
   ABBA order (agent, baseline, baseline, agent, ...), each its own process:
   - agent: `python -m agent --job-dir gs://...` with TRAINJOBS_LOCAL_DEVICES as the local
     provisioner sets it; examples/s from the job's metrics.json history;
   - baseline: bench/baseline_keras.py on local copies of the same shards, with the global batch,
     steps per epoch, steps_per_execution and learning rate of the agent's runtime plan.
3. What is measured, on both sides: examples/s of each epoch's training steps (on_epoch_begin to
   on_test_begin: validation, checkpoints and uploads are outside the clock), pooled over the
   runs' epochs after each run's first (tracing); the median of those. `ratio` = agent / baseline.
   Also reported, for information: `epoch_interval_s`, the median wall time between consecutive
   epoch ends, which includes validation and, for the agent, its per-epoch bookkeeping
   (metrics.json, checkpoint and TensorBoard uploads); the agent's `input_wait_fraction`; and
   `run_pair_ratios`, each agent run's median against its paired baseline run's.
4. Neighbours: on a small shared machine another process's burst halves a mirrored step. The bench
   samples the CPU used outside its own process tree (neighbour_load.py), waits for a quiet
   machine before each run, and counts only epochs that trained while neighbours used under
   QUIET_CORES (`epochs` lists [examples/s, neighbour cores] for each; `epochs_disturbed` counts
   the rest). With fewer than MIN_QUIET_EPOCHS quiet epochs a side counts all, and says so.

Usage: python bench/trainer_bench.py [--examples 60000] [--epochs 5] [--runs 2] [--configs mirrored,default]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import numpy as np  # noqa: E402

from neighbour_load import NeighbourLoad  # noqa: E402
from trainjobs import storage  # noqa: E402
from trainjobs.job_paths import JobPaths  # noqa: E402
from stack.embedded import start_gcs_emulator, use_emulator  # noqa: E402
from trainjobs.spec import DatasetOptions, DatasetSpec, JobSpec  # noqa: E402
from worker.gcs_channel import GcsJobChannel  # noqa: E402
from worker.staging import stage_dataset  # noqa: E402

BUCKET = "trainjobs-bench"
GOAL = 0.95
RUN_TIMEOUT_S = 300
# An epoch counts as quiet when processes outside the benchmark used under this many cores while it
# trained (an idle machine shows ~0.05); before each run the bench waits up to QUIET_WAIT_S for that.
QUIET_CORES = 0.15
QUIET_WAIT_S = 60
MIN_QUIET_EPOCHS = 3
# The agent logs each finished epoch as "<asctime> INFO trainjobs.agent: epoch N/M: {...}".
EPOCH_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO trainjobs\.agent: epoch (\d+)/\d+:", re.M)


@dataclass(frozen=True)
class Config:
    name: str
    strategy: str  # the strategy both sides build
    devices: int  # logical CPU devices, as the local provisioner would give the agent
    accelerator: dict[str, Any]
    per_replica_batch_size: int
    # Pinned, the same on both sides. Stock Keras 3.15 cannot run several steps per call under
    # MirroredStrategy (keras-team/keras#19246), so the hand-written script can only run 1 there;
    # 4 is what the agent's plan picks on a CPU by itself.
    steps_per_execution: int


CONFIGS = {
    "mirrored": Config("mirrored", "mirrored", 2, {"type": "cpu", "replicas": 2}, 32, 1),
    "default": Config("default", "default", 1, {"type": "cpu", "replicas": 1}, 64, 4),
}


def synthetic_digits(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n learnable 8x8x1 images: sklearn's digits drawn with replacement, plus pixel noise."""
    from sklearn.datasets import load_digits

    d = load_digits()
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(d.target), n)
    x = d.data[pick] + rng.normal(0.0, 1.0, (n, 64))
    return np.clip(x, 0, 16).reshape(n, 8, 8, 1).astype(np.float32), d.target[pick].astype(np.int64)


def stage(examples: int, scratch: Path) -> tuple[str, Path]:
    """Stage the data as the worker would; return its URI and a local copy of manifest + shards."""
    x, y = synthetic_digits(examples)
    source = scratch / "digits.npz"
    np.savez(source, x=x, y=y)
    staged = stage_dataset(DatasetSpec(source=str(source), options=DatasetOptions(validation_split=0.1)),
                           bucket=BUCKET, work_dir=scratch / "staging")
    local = scratch / "dataset"
    storage.download_prefix(staged.uri, local)
    return staged.uri, local


def job_spec(config: Config, epochs: int) -> JobSpec:
    return JobSpec.model_validate({
        "name": f"bench-{config.name}",
        "accelerator": config.accelerator,
        "strategy": config.strategy,
        "precision": "float32",
        "steps_per_execution": config.steps_per_execution,
        "dataset": {"source": "bench"},
        "model": {"name": "cnn"},
        "training": {"epochs": epochs, "per_replica_batch_size": config.per_replica_batch_size,
                     "optimizer": "adam", "learning_rate": 1e-3, "seed": 0},
    })


@dataclass(frozen=True)
class Epoch:
    """One timed epoch of one run."""

    examples_per_sec: float
    train_began_at: float  # wall clock, for the neighbour-load window
    train_seconds: float
    ended_at: float  # after validation and (agent) the epoch's bookkeeping was logged
    neighbours: float | None = None  # CPU cores used outside the benchmark while it trained


@dataclass(frozen=True)
class Run:
    epochs: list[Epoch]  # all of the run's epochs, the first included
    val_accuracy: float | None
    runtime: dict[str, Any] | None = None  # the agent's runtime plan
    input_wait_fraction: list[float] | None = None


def run_agent(config: Config, dataset_uri: str, epochs: int) -> Run:
    job_id = f"bench-{config.name}-{uuid.uuid4().hex[:8]}"
    channel = GcsJobChannel(BUCKET)
    channel.prepare(job_id, 1, job_spec(config, epochs), dataset_uri)
    job_dir = channel.job_dir(job_id)
    env = {**os.environ, "TRAINJOBS_LOCAL_DEVICES": str(config.devices), "PYTHONPATH": str(REPO),
           "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = _run([sys.executable, "-m", "agent", "--job-dir", job_dir], env, "agent")
    history = storage.read_json(JobPaths(job_dir).metrics)["history"]
    logged = {int(n): datetime.strptime(t, "%Y-%m-%d %H:%M:%S,%f").timestamp() for t, n in EPOCH_LINE.findall(out)}
    # The agent logs an epoch right after timing it: the log line's time, less the epoch's
    # seconds (training + validation), is when its training began.
    timed = [Epoch(e["examples_per_sec"], logged[e["epoch"]] - e["epoch_seconds"], e["train_seconds"], logged[e["epoch"]])
             for e in history]
    return Run(timed, history[-1].get("val_accuracy"), storage.read_json(JobPaths(job_dir).status)["runtime"],
               [e["input_wait_fraction"] for e in history])


def run_baseline(config: Config, data: Path, epochs: int, runtime: dict[str, Any], scratch: Path) -> Run:
    result = scratch / f"baseline-{uuid.uuid4().hex[:8]}.json"
    cmd = [sys.executable, str(REPO / "bench" / "baseline_keras.py"), "--data", str(data),
           "--strategy", runtime["strategy"], "--devices", str(config.devices),
           "--global-batch", str(runtime["global_batch_size"]), "--steps-per-epoch", str(runtime["steps_per_epoch"]),
           "--steps-per-execution", str(runtime["steps_per_execution"]), "--epochs", str(epochs),
           "--learning-rate", str(runtime["learning_rate"]), "--out", str(result)]
    _run(cmd, {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}, "baseline")
    history = json.loads(result.read_text())["epochs"]
    timed = [Epoch(e["examples_per_sec"], e["train_began_at"], e["train_seconds"], e["ended_at"]) for e in history]
    return Run(timed, history[-1].get("val_accuracy"))


def _run(cmd: list[str], env: dict[str, str], what: str) -> str:
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if proc.returncode:
        raise RuntimeError(f"{what} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}")
    return proc.stdout


def with_load(run: Run, load: NeighbourLoad) -> Run:
    epochs = [dataclasses.replace(e, neighbours=load.share(e.train_began_at, e.train_began_at + e.train_seconds))
              for e in run.epochs]
    return dataclasses.replace(run, epochs=epochs)


def quiet(e: Epoch) -> bool:
    return e.neighbours is None or e.neighbours < QUIET_CORES


def summarise(runs: list[Run], use_quiet: bool) -> dict[str, Any]:
    """Every run's epochs after its first (tracing), pooled; with use_quiet only those no neighbour
    disturbed."""
    measured = [e for r in runs for e in r.epochs[1:]]
    counted = [e for e in measured if quiet(e)] if use_quiet else measured
    intervals = [b.ended_at - a.ended_at for r in runs for a, b in zip(r.epochs[1:], r.epochs[2:])]
    return {
        "examples_per_sec": round(statistics.median(e.examples_per_sec for e in counted), 1),
        "epochs_counted": len(counted),
        "epochs_disturbed": sum(not quiet(e) for e in measured),
        "all_epochs_examples_per_sec": round(statistics.median(e.examples_per_sec for e in measured), 1),
        "epochs": [[e.examples_per_sec, None if e.neighbours is None else round(e.neighbours, 2)] for e in measured],
        "epoch_interval_s": round(statistics.median(intervals), 3) if intervals else None,
        "val_accuracy": runs[-1].val_accuracy,
    }


def bench_config(config: Config, dataset_uri: str, data: Path, epochs: int, runs: int, scratch: Path,
                 load: NeighbourLoad) -> dict[str, Any]:
    agent: list[Run] = []
    baseline: list[Run] = []
    waited_s = 0.0
    # Interleaved, and in ABBA order (agent, baseline, baseline, agent, ...), so that drift in the
    # machine's speed hits both sides alike and neither always runs first. The baseline copies the
    # first agent run's plan, so that run comes first.
    for i in range(runs):
        sides = ("agent", "baseline") if i % 2 == 0 else ("baseline", "agent")
        for side in sides:
            waited_s += load.wait_for_quiet(QUIET_CORES, QUIET_WAIT_S)
            if side == "agent":
                agent.append(with_load(run_agent(config, dataset_uri, epochs), load))
            else:
                assert agent[0].runtime is not None
                baseline.append(with_load(run_baseline(config, data, epochs, agent[0].runtime, scratch), load))
    # Quiet epochs only, when each side has enough of them; else all, and the output says so.
    use_quiet = all(sum(quiet(e) for r in side for e in r.epochs[1:]) >= MIN_QUIET_EPOCHS for side in (agent, baseline))
    a, b = summarise(agent, use_quiet), summarise(baseline, use_quiet)
    runtime = agent[0].runtime
    plan = {k: runtime[k] for k in ("strategy", "replicas", "precision", "global_batch_size", "steps_per_epoch",
                                    "steps_per_execution")}
    a["input_wait_fraction"] = round(statistics.median(w for r in agent for w in (r.input_wait_fraction or [])[1:]), 4)
    # Each agent run against its paired baseline run: how much the ratio moves from run to run.
    pairs = [statistics.median(e.examples_per_sec for e in ra.epochs[1:]) /
             statistics.median(e.examples_per_sec for e in rb.epochs[1:]) for ra, rb in zip(agent, baseline)]
    return {"plan": plan, "agent": a, "baseline": b, "counted": "quiet epochs" if use_quiet else "all epochs (machine busy)",
            "ratio": round(a["examples_per_sec"] / b["examples_per_sec"], 3), "run_pair_ratios": [round(r, 3) for r in pairs],
            "waited_for_quiet_s": round(waited_s, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=60_000, help="examples generated (10%% become validation)")
    ap.add_argument("--epochs", type=int, default=5, help="per run; the first of each run is left out")
    ap.add_argument("--runs", type=int, default=2, help="runs per side and configuration")
    ap.add_argument("--configs", default="mirrored,default")
    args = ap.parse_args()

    started = time.monotonic()
    load = NeighbourLoad().start()
    emulator = start_gcs_emulator(None, BUCKET)
    use_emulator(emulator, BUCKET)
    try:
        with tempfile.TemporaryDirectory(prefix="trainer-bench-") as tmp:
            scratch = Path(tmp)
            dataset_uri, data = stage(args.examples, scratch)
            results = {name: bench_config(CONFIGS[name], dataset_uri, data, args.epochs, args.runs, scratch, load)
                       for name in args.configs.split(",")}
    finally:
        load.stop()
        emulator.stop()
    text = json.dumps({"examples": args.examples, "epochs_per_run": args.epochs, "runs_per_side": args.runs,
                       "configs": results, "wall_s": round(time.monotonic() - started, 1)}, indent=2)
    # Lists of numbers on one line each, so the per-epoch lists stay readable.
    print(re.sub(r"\[\s+([-\d.,\s]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text))
    ok = all(r["ratio"] >= GOAL for r in results.values())
    print("goal met" if ok else "GOAL NOT MET")


if __name__ == "__main__":
    main()
