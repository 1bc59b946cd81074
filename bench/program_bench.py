"""Program jobs (issue 20): the same training script by hand and as a program job through `trainjobs up`,
in one run. Goal: training throughput >= 0.95x; the fixed overheads reported.

The script is bench/program_script.py (an MLP on data it makes itself, with the runtime's lines: the
spec's strategy, precision, steps_per_execution and callbacks). Three ways, alternating A B C C B A:
- **program**: a job {program: {source: program_script.py}, accelerator: cpu x2 replicas, strategy:
  mirrored, precision float32, steps_per_execution auto} submitted through the Python client to
  `trainjobs up` (API, worker, local provisioner) on a new database of the PostgreSQL named by
  TRAINJOBS_TEST_DATABASE_URL and a GCS emulator this bench starts; its timing.json comes back as an
  artifact.
- **by hand**: the same file with `TRAINJOBS_SPEC` naming the same spec and TRAINJOBS_LOCAL_DEVICES=2
  (the runtime's way outside a job: same strategy, batch, steps_per_execution).
- **plain** (for reference): the same file with --plain: MirroredStrategy over the same two logical
  CPUs, Keras' own train step, steps_per_execution 1: the script as written without trainjobs.

Throughput: the median examples/s of the epochs after each run's first (tracing), pooled per way, counting
only epochs that trained while processes outside the benchmark used under QUIET_CORES (neighbour_load.py;
each run also waits for a quiet machine first). Fixed overheads of the
program job: STAGING (the job's staging_at) -> the script's first training step, against the script's
own process start -> first step by hand; and the last step -> SUCCEEDED (finished_at), against the last
step -> process exit by hand.

Usage: python bench/program_bench.py [--runs 2] [--epochs 4] [--examples 80000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "bench"))
from bench.small_job_bench import empty_database  # noqa: E402
from neighbour_load import NeighbourLoad  # noqa: E402
from stack.embedded import start_gcs_emulator, use_emulator  # noqa: E402
from bench.up import TrainjobsUp  # noqa: E402

BUCKET = "trainjobs-programbench"
SCRIPT = REPO / "bench" / "program_script.py"
QUIET_CORES = 0.15
LOAD = NeighbourLoad()


def job_spec(epochs: int, examples: int, source: str) -> dict[str, Any]:
    return {"name": "program-bench", "accelerator": {"type": "cpu", "replicas": 2}, "strategy": "mirrored",
            "precision": "float32", "steps_per_execution": "auto",
            "program": {"source": source, "args": ["--examples", str(examples)]},
            "training": {"epochs": epochs, "global_batch_size": 256, "learning_rate": 0.001, "seed": 7}}


def _epochs(timing: dict[str, Any]) -> list[list[float | None]]:
    """[examples/s, the neighbours' cores while it trained] of each epoch after the first."""
    out = []
    for e in timing["epochs"][1:]:
        share = LOAD.share(e["began_at"], e["began_at"] + e["seconds"])
        out.append([round(e["examples_per_sec"]), None if share is None else round(share, 2)])
    return out


def _throughput(rows: list[dict[str, Any]]) -> tuple[float, int]:
    """The median over the quiet epochs of these runs (all, if none was quiet), and how many were not."""
    pooled = [e for r in rows for e in r["epochs"]]
    quiet = [e[0] for e in pooled if e[1] is None or e[1] < QUIET_CORES]
    return statistics.median(quiet or [e[0] for e in pooled]), len(pooled) - len(quiet)


class Product:
    """`trainjobs up` for the whole run (bench/up.py), one machine at a time; the program uploaded."""

    def __init__(self, url: str, scratch: Path) -> None:
        self.stack = TrainjobsUp(url, scratch, concurrency=1)
        self.client = self.stack.client
        self.source = self.client.upload_module(SCRIPT)

    def run(self, epochs: int, examples: int, scratch: Path) -> dict[str, Any]:
        t0 = time.time()
        job = self.client.submit(job_spec(epochs, examples, self.source))
        job = self.client.wait(job["id"], timeout=1800, poll=0.1)
        wall = time.time() - t0
        if job["status"] != "SUCCEEDED":
            raise RuntimeError(f"job {job['status']}: {job.get('error')}")
        into = Path(tempfile.mkdtemp(dir=scratch))
        self.client.download_artifacts(job["id"], into)
        timing = json.loads((into / "timing.json").read_text())
        at = {k: datetime.fromisoformat(job[k]).timestamp() for k in ("created_at", "staging_at", "finished_at")}
        return {"epochs": _epochs(timing),
                "staging_to_first_step_s": round(timing["first_step_at"] - at["staging_at"], 2),
                "last_step_to_succeeded_s": round(at["finished_at"] - timing["last_step_at"], 2),
                "submit_to_succeeded_s": round(wall, 2), "steps_per_execution": timing["steps_per_execution"],
                "install_s": (job.get("runtime") or {}).get("install_s")}

    def stop(self) -> None:
        self.stack.stop()


def by_hand(epochs: int, examples: int, scratch: Path, plain: bool) -> dict[str, Any]:
    cwd = Path(tempfile.mkdtemp(dir=scratch))
    spec_file = cwd / "spec.json"
    spec = job_spec(epochs, examples, "program_script.py")
    spec_file.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "TRAINJOBS_SPEC": str(spec_file),
           "TRAINJOBS_LOCAL_DEVICES": "2"}
    args = ["--examples", str(examples)] + (["--plain", "--epochs", str(epochs), "--batch", "256"] if plain else [])
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True)
    ended = time.time()
    if proc.returncode:
        raise RuntimeError(f"the script exited {proc.returncode}: {proc.stderr[-3000:]}")
    model_dir = cwd / ("plain-model" if plain else "trainjobs-local/model")
    timing = json.loads((model_dir / "timing.json").read_text())
    return {"epochs": _epochs(timing),
            "start_to_first_step_s": round(timing["first_step_at"] - timing["started_at"], 2),
            "last_step_to_exit_s": round(ended - timing["last_step_at"], 2),
            "process_s": round(ended - timing["started_at"], 2), "steps_per_execution": timing["steps_per_execution"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--examples", type=int, default=80_000)
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="programbench-"))
    emulator = start_gcs_emulator(None, bucket=BUCKET)
    use_emulator(emulator, BUCKET)
    LOAD.start()
    product = Product(empty_database("trainjobs_programbench"), scratch)
    results: dict[str, list[dict[str, Any]]] = {"program": [], "hand": [], "plain": []}
    order = ["program", "hand", "plain", "plain", "hand", "program"]  # ABCCBA: drift cancels
    try:
        for run in range(args.runs):
            for way in order:
                LOAD.wait_for_quiet(QUIET_CORES, 120)
                if way == "program":
                    row = product.run(args.epochs, args.examples, scratch)
                else:
                    row = by_hand(args.epochs, args.examples, scratch, plain=way == "plain")
                results[way].append(row)
                print(json.dumps({"run": run + 1, "way": way, **row}), flush=True)
    finally:
        product.stop()
        emulator.stop()

    def med(way: str, key: str) -> float:
        return round(float(statistics.median(r[key] for r in results[way])), 2)

    (program, p_out), (hand, h_out), (plain, c_out) = (_throughput(results[w]) for w in ("program", "hand", "plain"))
    print(f"throughput examples/s (median of the quiet epochs of {len(results['program'])} runs each): program job "
          f"{program:.0f}, by hand {hand:.0f}, plain Keras {plain:.0f} (epochs left out as disturbed: {p_out}, "
          f"{h_out}, {c_out})")
    print(f"program job / by hand: {program / hand:.3f}x (goal >= 0.95x); program job / plain Keras: {program / plain:.3f}x")
    print(f"start -> first training step: program job (STAGING ->) {med('program', 'staging_to_first_step_s')} s, "
          f"by hand (process start ->) {med('hand', 'start_to_first_step_s')} s")
    print(f"last training step -> end: program job (-> SUCCEEDED) {med('program', 'last_step_to_succeeded_s')} s, "
          f"by hand (-> process exit) {med('hand', 'last_step_to_exit_s')} s")
    print(f"submit -> SUCCEEDED {med('program', 'submit_to_succeeded_s')} s; by hand, the process {med('hand', 'process_s')} s")


if __name__ == "__main__":
    main()
