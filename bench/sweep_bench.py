"""Sweeps (issue 22): what median pruning saves. Goal: a 16-trial sweep with median pruning spends at
most 0.6x the accelerator-seconds of the same 16 trials run to completion, and finds a best objective
within 0.01 of theirs.

Both sweeps run in one `trainjobs up` (API, worker, local provisioner, two machines at once) on a new
database of the PostgreSQL named by TRAINJOBS_TEST_DATABASE_URL and a GCS emulator this bench starts.
Both use the random sampler with the same seed, so they draw the same 16 parameter sets (the engine
seeds each ask with the seed plus the trials asked before it); only early_stopping differs. The job:
the managed trainer's mlp (two layers of 1024) on scikit-learn's digits, batches of 16, `--epochs`
epochs; the learning rate is drawn
log-uniformly over 1e-6..0.3, so many trials learn slowly: the case a pruner is for.

Accelerator-seconds: each trial's job's accelerators (1 for a CPU job) times the seconds from its
machine's provisioning to its end (a pruned trial's teardown included), summed by the sweep
(GET /v1/sweeps/{id}: accelerator_seconds). The pruned sweep runs first, then the full one; `--runs 2`
runs them in the order A B B A and pools.

Usage: python bench/sweep_bench.py [--runs 1] [--epochs 10] [--trials 16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.small_job_bench import empty_database  # noqa: E402
from stack.embedded import start_gcs_emulator, use_emulator  # noqa: E402
from bench.up import TrainjobsUp  # noqa: E402

BUCKET = "trainjobs-sweepbench"


def sweep_spec(trials: int, epochs: int, pruned: bool, seed: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": f"bench-{'pruned' if pruned else 'full'}",
        # Wide layers and small batches: an epoch of seconds, as a real trial's epochs are minutes long
        # next to the engine's reaction (a tick every 2 s); with epochs of milliseconds a trial ends
        # before any pruner could look at it.
        "job": {"dataset": {"source": "sklearn:digits"},
                "model": {"name": "mlp", "params": {"hidden_units": [1024, 1024]}},
                "accelerator": {"type": "cpu"}, "strategy": "default", "steps_per_execution": 1,
                "training": {"epochs": epochs, "global_batch_size": 16, "seed": 1}},
        "parameters": {"training.learning_rate": {"type": "float", "low": 1e-6, "high": 0.3, "log": True}},
        "objective": {"metric": "val_accuracy"}, "algorithm": "random", "max_trials": trials,
        "parallel_trials": 2, "seed": seed}
    if pruned:
        spec["early_stopping"] = {"type": "median", "min_epochs": 2}
    return spec


class Product:
    """`trainjobs up` for the whole run (bench/up.py): two local machines at once."""

    def __init__(self, url: str, scratch: Path) -> None:
        self.stack = TrainjobsUp(url, scratch, concurrency=2)
        self.client = self.stack.client

    def sweep(self, spec: dict[str, Any]) -> dict[str, Any]:
        started = time.time()
        sweep_id = self.client.submit_sweep(spec)["id"]
        sweep = self.client.wait_sweep(sweep_id, poll_s=1.0)
        trials = self.client.sweep_trials(sweep_id)
        return {"status": sweep["status"], "wall_s": round(time.time() - started, 1),
                "accelerator_seconds": sweep["accelerator_seconds"],
                "best": sweep["best"]["value"] if sweep["best"] else None,
                "pruned": sum(t["state"] == "PRUNED" for t in trials),
                "epochs_trained": sum(len(t["curve"]) for t in trials),
                "params": sorted(round(t["params"]["training.learning_rate"], 12) for t in trials)}

    def stop(self) -> None:
        self.stack.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--trials", type=int, default=16)
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="sweepbench-"))
    emulator = start_gcs_emulator(None, bucket=BUCKET)
    use_emulator(emulator, BUCKET)
    os.environ["TRAINJOBS_BUCKET"] = BUCKET
    product = Product(empty_database("trainjobs_sweepbench"), scratch)
    results: dict[str, list[dict[str, Any]]] = {"pruned": [], "full": []}
    try:
        order = ["pruned", "full", "full", "pruned"] * args.runs
        for i, way in enumerate(order[: 2 * args.runs]):
            run = product.sweep(sweep_spec(args.trials, args.epochs, way == "pruned", seed=100 + i // 2))
            print(json.dumps({way: run}), flush=True)
            results[way].append(run)
    finally:
        product.stop()
        emulator.stop()
    for a, b in zip(results["pruned"], results["full"], strict=True):
        assert a["params"] == b["params"], "the two sweeps drew different trials"
    pruned = sum(r["accelerator_seconds"] for r in results["pruned"])
    full = sum(r["accelerator_seconds"] for r in results["full"])
    gap = max(abs((a["best"] or 0) - (b["best"] or 0)) for a, b in zip(results["pruned"], results["full"], strict=True))
    print(json.dumps({"accelerator_seconds_ratio": round(pruned / full, 3), "goal_ratio": 0.6,
                      "best_objective_gap": round(gap, 4), "goal_gap": 0.01,
                      "pruned_trials": [r["pruned"] for r in results["pruned"]],
                      "epochs_trained": {k: [r["epochs_trained"] for r in v] for k, v in results.items()}}))


if __name__ == "__main__":
    main()
