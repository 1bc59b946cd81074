"""Small jobs (issue 12): a short job end to end through the product against the hand-written Keras
script with its own per-epoch checkpoint, in one run. Goals: the training loop's wall time <= 1.2x
the script's, training throughput >= 0.95x.

1. The product: `trainjobs up` (API, worker, local provisioner) on a new database (per checkout) of
   the PostgreSQL named by TRAINJOBS_TEST_DATABASE_URL and a GCS emulator this bench starts; a job
   submitted through the client: sklearn digits (1797 8x8 images, 20% validation), the built-in cnn,
   mirrored over 2 CPU replicas, float32, 20 epochs, a checkpoint every epoch (the default), a
   SavedModel at the end. Measured: submit -> SUCCEEDED, and the training loop, from the agent's
   "training epochs" log line to the last of its last epoch's line and its last checkpoint upload.
2. The script: bench/baseline_keras.py on the same staged shards (downloaded), with the agent's
   global batch, steps per epoch, steps_per_execution and learning rate, saving a tf.train.Checkpoint
   after every epoch and a SavedModel at the end. Measured: the process, and the training loop from
   the first epoch's start to the last epoch's end (its checkpoint included).
3. Throughput on both sides: the median examples/s of the epochs after the first.

Usage: python bench/small_job_bench.py [--runs 2] [--epochs 20] [--repo PATH ...]
--repo (repeatable) runs the product from these checkouts, alternating within each run (e.g. this
one and a worktree at an older commit, for before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sqlalchemy import text  # noqa: E402

from stack.embedded import start_gcs_emulator, use_emulator  # noqa: E402
from trainjobs import storage  # noqa: E402
from trainjobs.job_paths import JobPaths  # noqa: E402
from trainjobs.client.api import Client  # noqa: E402

BUCKET = "trainjobs-smallbench"
LOG_TIME = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO trainjobs\.agent: "


def spec(epochs: int) -> dict[str, Any]:
    return {"name": "small", "accelerator": {"type": "cpu", "replicas": 2}, "strategy": "mirrored",
            # One step per call: stock Keras cannot run more under MirroredStrategy (bench/README.md).
            "precision": "float32", "steps_per_execution": 1,
            "dataset": {"source": "sklearn:digits", "options": {"validation_split": 0.2}},
            "model": {"name": "cnn"},
            "training": {"epochs": epochs, "per_replica_batch_size": 32, "learning_rate": 0.003, "seed": 7}}


def _logged(pattern: str, logs: str) -> list[float]:
    return [datetime.strptime(t, "%Y-%m-%d %H:%M:%S,%f").timestamp()
            for t in re.findall(LOG_TIME + pattern, logs, re.M)]


def run_product(repo: Path, url: str, epochs: int, scratch: Path) -> dict[str, Any]:
    data_dir = Path(tempfile.mkdtemp(dir=scratch))
    env = {**os.environ, "TRAINJOBS_DATABASE_URL": url, "TRAINJOBS_HOME": str(data_dir), "PYTHONPATH": str(repo),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    from trainjobs.loopback import free_port

    port = free_port()
    up = subprocess.Popen([sys.executable, "-m", "stack.cli", "up", "--port", str(port), "--data-dir", str(data_dir),
                           "--provisioner", "local", "--concurrency", "1"], cwd=repo, env=env,
                          stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        assert up.stderr is not None
        said = []
        for line in up.stderr:
            said.append(line)
            if line.strip() == "ready":
                break
        else:
            raise RuntimeError(f"trainjobs up exited {up.wait()}: {''.join(said[-20:])}")
        # Keep reading what it says, so that a full pipe never blocks it.
        threading.Thread(target=lambda: [None for _ in up.stderr or []], daemon=True).start()
        key = json.loads((data_dir / "config.json").read_text())["api_key"]
        client = Client(f"http://127.0.0.1:{port}", key)
        t0 = time.time()
        job = client.submit(spec(epochs))
        job = client.wait(job["id"], timeout=1800, poll=0.2)
        wall = time.time() - t0
        if job["status"] != "SUCCEEDED":
            raise RuntimeError(f"job {job['status']}: {job.get('error')}")
        history = (storage.read_json(JobPaths.for_job(job["id"], BUCKET).metrics) or {})["history"]
        logs = client.logs(job["id"])
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGTERM)
            up.wait(60)
    began = _logged("training epochs", logs)[0]
    ended = max(_logged(rf"epoch {epochs}/{epochs}:", logs) + _logged("checkpoint at epoch .* uploaded", logs))
    times = {k: datetime.fromisoformat(job[k]).timestamp() for k in ("running_at", "finished_at")}
    return {"submit_to_succeeded_s": round(wall, 2), "running_to_finished_s": round(times["finished_at"] - times["running_at"], 2),
            "training_loop_s": round(ended - began, 2), "examples_per_sec": statistics.median(e["examples_per_sec"] for e in history[1:]),
            "runtime": job["runtime"], "job_id": job["id"]}


def staged_copy(url: str, job_id: str, into: Path) -> Path:
    from service.db.session import get_engine

    with get_engine(url).connect() as conn:
        uri = conn.execute(text("SELECT dataset_uri FROM jobs WHERE id = :id"), {"id": job_id}).scalar_one()
    storage.download_prefix(uri.rstrip("/"), into)
    return into


def run_script(data: Path, runtime: dict[str, Any], epochs: int, scratch: Path) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(dir=scratch))
    cmd = [sys.executable, str(REPO / "bench" / "baseline_keras.py"), "--data", str(data), "--strategy", "mirrored",
           "--devices", "2", "--global-batch", str(runtime["global_batch_size"]),
           "--steps-per-epoch", str(runtime["steps_per_epoch"]), "--steps-per-execution",
           str(runtime["steps_per_execution"]), "--epochs", str(epochs), "--learning-rate", str(runtime["learning_rate"]),
           "--seed", "7", "--checkpoint-dir", str(out / "ckpt"), "--export-dir", str(out / "saved_model"),
           "--out", str(out / "result.json")]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"baseline exited {proc.returncode}: {proc.stderr[-3000:]}")
    wall = time.time() - t0
    result = json.loads((out / "result.json").read_text())
    epochs_done = result["epochs"]
    return {"process_s": round(wall, 2), "training_loop_s": round(epochs_done[-1]["ended_at"] - epochs_done[0]["train_began_at"], 2),
            "examples_per_sec": statistics.median(e["examples_per_sec"] for e in epochs_done[1:])}


def empty_database(name: str) -> str:
    """`trainjobs up` migrates it with its own checkout's migrations."""
    import psycopg
    from sqlalchemy.engine import make_url

    base = make_url(os.environ["TRAINJOBS_TEST_DATABASE_URL"].replace("postgresql://", "postgresql+psycopg://", 1))
    admin = base.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return base.set(database=name).render_as_string(hide_password=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--repo", type=Path, action="append", help="checkouts to run the product from (default: this one)")
    args = ap.parse_args()
    args.repo = args.repo or [REPO]
    scratch = Path(tempfile.mkdtemp(prefix="smallbench-"))
    emulator = start_gcs_emulator(None, bucket=BUCKET)
    use_emulator(emulator, BUCKET)
    os.environ["TRAINJOBS_BUCKET"] = BUCKET
    urls = {str(repo): empty_database(f"trainjobs_smallbench_{i}") for i, repo in enumerate(args.repo)}
    data: Path | None = None
    rows = []
    try:
        for i in range(args.runs):
            products = {}
            for repo in args.repo:  # the checkouts alternate within a run, then the script
                products[str(repo)] = product = run_product(repo, urls[str(repo)], args.epochs, scratch)
                if data is None:
                    data = staged_copy(urls[str(repo)], product["job_id"], scratch / "data")
            assert data is not None
            script = run_script(data, next(iter(products.values()))["runtime"], args.epochs, scratch)
            print(json.dumps({"run": i + 1, "script": script}), flush=True)
            for repo, product in products.items():
                row = {"run": i + 1, "repo": repo,
                       "product": {k: v for k, v in product.items() if k not in ("runtime", "job_id")},
                       "training_loop_ratio": round(product["training_loop_s"] / script["training_loop_s"], 3),
                       "throughput_ratio": round(product["examples_per_sec"] / script["examples_per_sec"], 3),
                       "end_to_end_ratio": round(product["submit_to_succeeded_s"] / script["process_s"], 3)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        emulator.stop()
    for repo in args.repo:
        mine = [r for r in rows if r["repo"] == str(repo)]
        for key in ("training_loop_ratio", "throughput_ratio", "end_to_end_ratio"):
            print(f"{repo} {key}: median {statistics.median(r[key] for r in mine)} "
                  f"({', '.join(str(r[key]) for r in mine)})")


if __name__ == "__main__":
    main()
