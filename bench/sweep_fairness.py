"""The sweep engine under a hostile project (issue 36, findings 2 and 4): 200 active sweeps of 20 projects,
10 each. Goal: every other project's sweep gets its next trial within its normal time (the ratio of its
wait to the same wait in a run without the hostile project), and the worker's peak memory stays within
a fixed bound.

Each run: a fresh database on TRAINJOBS_TEST_DATABASE_URL's server (else an embedded PostgreSQL), a GCS
emulator this bench starts, and the worker's real SweepEngine (worker/sweeps.py, default SweepConfig: a
tick every 2 s, 32 sweeps leased a tick, 4 step threads) in a process of its own, whose peak RSS is the
kernel's high-water mark (VmHWM). The bench plays the trials' jobs as a worker and an agent would
(status in PostgreSQL, metrics.json in the emulator; no TensorFlow): every sweep runs one trial at a
time, and in each round every honest sweep's trial ends (SUCCEEDED, 4 epochs written) at once; the
figure is the wait from that end to the sweep's next trial's job, measured by polling the database
every 0.1 s, for the 190 sweeps of the 19 honest projects.

In both runs project 0's 10 sweeps ask trials of 10,000 epochs (the most a spec allows, so the engine's
read cap for them is the full 4 MiB) whose jobs run for ever, rewriting their metrics.json every 5 s (a
new generation each time); only what they write differs:
- baseline: the agent's own history of 4 epochs. The hostile run's 2.6 MB documents are written at the
  same rate too, to objects no trial reads: the writes load this machine's cores and the emulator alike in
  both runs, as a job's own machine and GCS would pay for them, not the worker.
- hostile: a 60,000-epoch history of 2.6 MB (the review's attack).

Besides the waits: the engine process's peak RSS and its CPU seconds (utime + stime) over the run.

`--repo` runs the engine of another checkout (e.g. a `git archive` of the code before the fix) against
the same setup; `--round-timeout` bounds how long a round waits for every sweep's next trial.

`--runs 2` runs them in the order baseline, hostile, hostile, baseline and pools each side's waits (the
machine's load drifts between runs as much as the figure itself).

Usage: python bench/sweep_fairness.py [--rounds 3] [--runs 1] [--repo PATH] [--only baseline|hostile]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import text  # noqa: E402

from bench.bench_db import fresh_database  # noqa: E402
from service.db import sweeps as sweep_data  # noqa: E402
from service.db.projects import ensure_project  # noqa: E402
from service.db.session import get_engine, session_factory, transaction  # noqa: E402
from stack.embedded import start_gcs_emulator, use_emulator  # noqa: E402
from trainjobs import storage  # noqa: E402
from trainjobs.job_paths import JobPaths  # noqa: E402
from trainjobs.spec.sweep import SweepSpec  # noqa: E402

PROJECTS, SWEEPS_EACH = 20, 10
HOSTILE_EPOCHS, HOSTILE_HISTORY = 10_000, 60_000
REWRITE_EVERY_S = 5.0

ENGINE = """
import signal, sys, threading
sys.path.insert(0, sys.argv[1])
from service.db.session import get_engine, session_factory
from worker.sweeps import SweepEngine
engine = get_engine(sys.argv[2])
stopping = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stopping.set())
SweepEngine(engine, session_factory(engine), "bench-worker", stopping).run()
"""


def sweep_body(name: str, epochs: int, trials: int) -> dict[str, Any]:
    spec = SweepSpec.model_validate({
        "name": name, "job": {"dataset": {"source": "sklearn:iris"}, "model": {"name": "mlp"},
                              "accelerator": {"type": "cpu"}, "strategy": "default", "training": {"epochs": epochs}},
        "parameters": {"training.learning_rate": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True}},
        "objective": {"metric": "val_accuracy"}, "algorithm": "random", "max_trials": trials, "parallel_trials": 1})
    stored = spec.model_dump(mode="json")
    stored["objective"]["goal"], stored["max_trials"] = spec.objective.direction, spec.trials  # as the route does
    return stored


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for {pid}")


class Run:
    def __init__(self, label: str, hostile: bool, repo: Path, rounds: int, round_timeout_s: float) -> None:
        self.label, self.hostile, self.repo, self.rounds, self.round_timeout_s = label, hostile, repo, rounds, round_timeout_s
        self.url = fresh_database(f"trainjobs_sweepfair_{label}")
        self.factory = session_factory(get_engine(self.url))
        self.bucket = f"sweepfair-{uuid.uuid4().hex[:8]}"
        storage.ensure_bucket(self.bucket)
        os.environ["TRAINJOBS_BUCKET"] = self.bucket
        self.honest: list[uuid.UUID] = []
        self.project0: list[uuid.UUID] = []
        with transaction(self.factory) as session:
            projects = [ensure_project(session, f"project-{p}") for p in range(PROJECTS)]
        # One transaction each, so each has a created_at of its own (now() is the transaction's start),
        # taking turns across projects, the hostile one first.
        for s in range(SWEEPS_EACH):
            for p, project in enumerate(projects):
                with transaction(self.factory) as session:
                    body = sweep_body(f"p{p}-s{s}", HOSTILE_EPOCHS if p == 0 else 4, rounds + 1)
                    sweep = sweep_data.create_sweep(session, project, body)
                (self.project0 if p == 0 else self.honest).append(sweep.id)
        self.stop_writing = threading.Event()

    def trials(self) -> dict[uuid.UUID, list[tuple[int, str]]]:
        with transaction(self.factory) as session:
            rows = session.execute(text("SELECT sweep_id, number, job_id FROM sweep_trials ORDER BY number")).all()
        out: dict[uuid.UUID, list[tuple[int, str]]] = {}
        for sweep_id, number, job_id in rows:
            out.setdefault(sweep_id, []).append((number, str(job_id)))
        return out

    def wait_for(self, counts: dict[uuid.UUID, int], since: float) -> dict[uuid.UUID, float]:
        """Seconds from `since` until each sweep has `counts[sweep]` trials (missing: never, in time)."""
        waits: dict[uuid.UUID, float] = {}
        deadline = since + self.round_timeout_s
        while len(waits) < len(counts) and time.monotonic() < deadline:
            now = time.monotonic()
            for sweep_id, trials in self.trials().items():
                if sweep_id in counts and sweep_id not in waits and len(trials) >= counts[sweep_id]:
                    waits[sweep_id] = now - since
            time.sleep(0.1)
        return waits

    def end_trials(self, jobs: list[str]) -> None:
        """Each job trained its 4 epochs and SUCCEEDED (metrics.json as the agent writes it)."""
        history = {"history": [{"epoch": i, "val_accuracy": 0.5 + i / 10, "loss": 0.5} for i in range(1, 5)]}
        for job_id in jobs:
            storage.write_json(JobPaths.for_job(job_id, self.bucket).metrics, history)
        with transaction(self.factory) as session:
            session.execute(text(
                "UPDATE jobs SET status = 'SUCCEEDED', provisioning_at = now(), finished_at = now(),"
                " metrics = '{\"val_accuracy\": 0.9}' WHERE id = ANY(CAST(:ids AS uuid[]))"), {"ids": jobs})

    def run_for_ever(self, jobs: list[str]) -> None:
        """Project 0's trials' jobs: RUNNING, rewriting their metrics.json every REWRITE_EVERY_S."""
        with transaction(self.factory) as session:
            session.execute(text("UPDATE jobs SET status = 'RUNNING', provisioning_at = now()"
                                 " WHERE id = ANY(CAST(:ids AS uuid[]))"), {"ids": jobs})
        long = json.dumps({"history": [{"epoch": i, "val_accuracy": round(0.5 + i / 240_000, 6)}
                                       for i in range(1, HOSTILE_HISTORY + 1)]}).encode()
        short = json.dumps({"history": [{"epoch": i, "val_accuracy": 0.5 + i / 10, "loss": 0.5}
                                        for i in range(1, 5)]}).encode()
        metrics = [JobPaths.for_job(job_id, self.bucket).metrics for job_id in jobs]
        unread = [f"gs://{self.bucket}/unread/{i}/metrics.json" for i in range(len(jobs))]
        if self.hostile:
            self.rewrite({uri: long for uri in metrics})
        else:
            self.rewrite({uri: short for uri in metrics} | {uri: long for uri in unread})
        print(f"  project 0's trials write {len(long if self.hostile else short):,} bytes each "
              f"every {REWRITE_EVERY_S:.0f} s", flush=True)

    def rewrite(self, docs: dict[str, bytes]) -> None:
        def rewrite() -> None:
            while not self.stop_writing.is_set():
                for uri, doc in docs.items():
                    storage.blob(uri).upload_from_string(doc, content_type="application/json")
                self.stop_writing.wait(REWRITE_EVERY_S)

        threading.Thread(target=rewrite, daemon=True).start()

    def go(self) -> dict[str, Any]:
        engine = subprocess.Popen([sys.executable, "-c", ENGINE, str(self.repo), self.url], cwd=self.repo)
        try:
            started = time.monotonic()
            first = self.wait_for({s: 1 for s in self.honest + self.project0}, started)
            print(f"  {self.label}: first trials of {len(first)} sweeps in {max(first.values(), default=0):.1f} s",
                  flush=True)
            # (an engine before the fix may not have given each its first trial)
            self.run_for_ever([jobs[-1][1] for s, jobs in self.trials().items() if s in self.project0])
            waits: list[float] = []
            missed = 0
            for r in range(self.rounds):
                current = self.trials()
                self.end_trials([current[s][-1][1] for s in self.honest if s in current])
                since = time.monotonic()
                got = self.wait_for({s: len(current.get(s, [])) + 1 for s in self.honest}, since)
                missed += len(self.honest) - len(got)
                waits.extend(got.values())
                print(f"  {self.label} round {r + 1}: {len(got)}/{len(self.honest)} next trials, "
                      f"median {statistics.median(got.values()) if got else float('nan'):.2f} s, "
                      f"max {max(got.values(), default=float('nan')):.2f} s", flush=True)
            peak, cpu = peak_rss_mb(engine.pid), cpu_s(engine.pid)
        finally:
            self.stop_writing.set()
            engine.terminate()
            try:
                engine.wait(30)
            except subprocess.TimeoutExpired:
                engine.kill()
        curves = self.project0_curve()
        waits.sort()
        return {"waits": waits, "missed": missed, "peak_rss_mb": peak, "cpu_s": cpu, "project0_curve": curves}

    def project0_curve(self) -> int:
        with transaction(self.factory) as session:
            return int(session.execute(text(
                "SELECT coalesce(max(jsonb_array_length(curve)), 0) FROM sweep_trials WHERE sweep_id = ANY(CAST(:ids AS uuid[]))"),
                {"ids": [str(s) for s in self.project0]}).scalar() or 0)


def quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repo", type=Path, default=ROOT, help="the checkout whose sweep engine runs")
    ap.add_argument("--round-timeout", type=float, default=120.0)
    ap.add_argument("--only", choices=("baseline", "hostile"))
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    emulator = start_gcs_emulator(None, bucket="sweepfair")
    use_emulator(emulator, "sweepfair")
    results: dict[str, dict[str, Any]] = {}
    order = [("baseline", False), ("hostile", True)]
    try:
        for i in range(args.runs):
            for label, hostile in order if i % 2 == 0 else order[::-1]:
                if args.only not in (None, label):
                    continue
                print(f"{label}: {PROJECTS} projects x {SWEEPS_EACH} sweeps, engine of {args.repo}", flush=True)
                r = Run(label, hostile, args.repo, args.rounds, args.round_timeout).go()
                pooled = results.setdefault(label, {"waits": [], "missed": 0, "peak_rss_mb": 0.0, "cpu_s": 0.0,
                                                    "project0_curve": 0})
                pooled["waits"] = sorted(pooled["waits"] + r["waits"])
                pooled["missed"] += r["missed"]
                pooled["cpu_s"] += r["cpu_s"]
                pooled["peak_rss_mb"] = max(pooled["peak_rss_mb"], r["peak_rss_mb"])
                pooled["project0_curve"] = max(pooled["project0_curve"], r["project0_curve"])
    finally:
        emulator.stop()
    print("\n| run | next-trial waits | median | p95 | max | missed | engine peak RSS | engine CPU | project 0: longest curve |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, r in results.items():
        w = r["waits"]
        print(f"| {label} | {len(w)} | {quantile(w, 0.5):.2f} s | {quantile(w, 0.95):.2f} s | {max(w, default=float('nan')):.2f} s"
              f" | {r['missed']} | {r['peak_rss_mb']:.0f} MB | {r['cpu_s']:.1f} s | {r['project0_curve']} epochs |")
    if len(results) == 2:
        b, h = results["baseline"], results["hostile"]
        print(f"\nratio hostile/baseline: median {quantile(h['waits'], 0.5) / quantile(b['waits'], 0.5):.2f}x, "
              f"p95 {quantile(h['waits'], 0.95) / quantile(b['waits'], 0.95):.2f}x, "
              f"max {max(h['waits']) / max(b['waits']):.2f}x, peak RSS {h['peak_rss_mb'] / b['peak_rss_mb']:.2f}x")


if __name__ == "__main__":
    main()
