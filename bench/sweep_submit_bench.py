"""What one sweep's submit costs the API (issue 36, 1): the review's hostile sweep (32 parameters x 64
choices over a program job with 64 requirements and 96 environment variables) against a minimal sweep of
the same job kind, in the same run.

1. Validation, in this process: SweepSpec.model_validate of each, alternating, --rounds times; the
   hostile sweep's median as a ratio to the minimal one's, and as a count of whole validations of its
   job (the work before the fix was 2,049 of them).
2. Through the API (`create_app` behind uvicorn, in a process of its own, on a fresh database): each
   sweep POSTed --posts times while another client GETs /healthz back to back; the slowest /healthz
   answer during each submit (median and worst over the submits of each kind), and when idle. Before the fix, a hostile submit held the event loop
   for its whole validation (6 s on 2 cores here, 30-40 s in the review): the stall was the submit.

Usage: python bench/sweep_submit_bench.py [--rounds 20] [--posts 10]
Uses TRAINJOBS_TEST_DATABASE_URL (or TRAINJOBS_DATABASE_URL), else an embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_db import fresh_database  # noqa: E402
from tests.support.sweep_shapes import hostile_sweep, minimal_sweep  # noqa: E402
from trainjobs.loopback import free_port  # noqa: E402
from trainjobs.spec import JobSpec  # noqa: E402
from trainjobs.spec.sweep import SweepSpec  # noqa: E402

SERVER = """
import sys, uvicorn
from service.app import create_app
uvicorn.run(create_app(sys.argv[1]), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


def _seconds(fn: Any, *args: Any) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def validation(rounds: int) -> dict[str, float]:
    hostile, minimal = hostile_sweep(), minimal_sweep()
    times: dict[str, list[float]] = {"hostile": [], "minimal": [], "hostile job": []}
    for _ in range(rounds):
        times["hostile"].append(_seconds(SweepSpec.model_validate, hostile))
        times["minimal"].append(_seconds(SweepSpec.model_validate, minimal))
        times["hostile job"].append(_seconds(JobSpec.model_validate, hostile["job"]))
    return {k: statistics.median(v) for k, v in times.items()}


class Poller(threading.Thread):
    """GET /healthz back to back; the latency of each answer, with when it was asked."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.samples, self.stop = url, [], threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=120) as client:
            while not self.stop.is_set():
                start = time.perf_counter()
                client.get("/healthz").raise_for_status()
                self.samples.append((start, time.perf_counter() - start))

    def worst(self, since: float, until: float) -> float:
        return max((lat for t, lat in self.samples if since <= t <= until), default=0.0)


def through_api(posts: int) -> dict[str, Any]:
    from service.db.projects import create_api_key
    from service.db.session import get_engine, session_factory, transaction

    url = fresh_database("trainjobs_sweep_submit_bench")
    port = free_port()
    env = {**os.environ, "TRAINJOBS_SWEEPS_PER_MINUTE": "100000", "TRAINJOBS_MAX_ACTIVE_SWEEPS": "100000"}
    server = subprocess.Popen([sys.executable, "-c", SERVER, url, str(port)], cwd=ROOT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                httpx.get(f"{base}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        with transaction(session_factory(get_engine(url))) as session:
            key = create_api_key(session, "bench")
        poller = Poller(base)
        poller.start()
        time.sleep(1.0)
        out: dict[str, Any] = {"idle": poller.worst(0, time.perf_counter())}
        with httpx.Client(base_url=base, timeout=120, headers={"Authorization": f"Bearer {key}"}) as api:
            for name, body in (("minimal", minimal_sweep()), ("hostile", hostile_sweep())) * 2:
                walls, stalls = [], []
                for _ in range(posts):
                    start = time.perf_counter()
                    r = api.post("/v1/sweeps", json=body)
                    end = time.perf_counter()
                    assert r.status_code == 201, r.text
                    walls.append(end - start)
                    stalls.append(poller.worst(start, end))
                out[name] = {"submit_median_s": statistics.median(walls), "stall_median_s": statistics.median(stalls),
                             "stall_worst_s": max(stalls)}
        poller.stop.set()
        return out
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--posts", type=int, default=10)
    args = parser.parse_args()
    v = validation(args.rounds)
    print(f"validation, median of {args.rounds}: hostile {v['hostile'] * 1e3:.1f} ms, minimal {v['minimal'] * 1e3:.2f} ms "
          f"= {v['hostile'] / v['minimal']:.0f}x; one whole validation of the hostile job {v['hostile job'] * 1e3:.2f} ms, "
          f"so the sweep costs {v['hostile'] / v['hostile job']:.1f} of them (2,049 before)")
    a = through_api(args.posts)
    print(f"through the API, {args.posts} posts each (the second pass kept): /healthz worst while idle "
          f"{a['idle'] * 1e3:.1f} ms")
    for name in ("minimal", "hostile"):
        print(f"  {name}: submit median {a[name]['submit_median_s'] * 1e3:.1f} ms; the slowest /healthz during a "
              f"submit: median {a[name]['stall_median_s'] * 1e3:.1f} ms, worst {a[name]['stall_worst_s'] * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
