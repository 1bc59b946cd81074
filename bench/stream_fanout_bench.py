"""What a running job costs while nothing happens, and what its followers cost (issue 25), for the code
before the change (a checkout of --before) and this one, in the same run, against the same PostgreSQL
and GCS emulator. Storage requests are counted by the emulator where they arrive (by operation and
GCS price class, stack/emulator_requests.py), not by the code being measured.

1. Idle jobs: a worker (default DriverConfig: a 1 s poll) drives --jobs RUNNING jobs on machines that
   stay up (the in-memory cloud); their agent is this script, which rewrites each job's status.json
   every 10 s with nothing new but the heartbeat, as the real agent's heartbeat does. Reported per job
   and minute: the worker's GCS requests (class B; class A less this script's own writes), and the
   `jobs` row updates and transactions PostgreSQL counted (pg_stat; lease renewals included).
2. Followers: `trainjobs api` serves 1, then --followers follow-streams of one job's log, while this
   script appends a line to it every second (re-uploading it, as the agent does). Reported per minute:
   the API's storage requests (lists, downloads, metadata GETs).

Usage: python bench/stream_fanout_bench.py [--before 13329a6] [--jobs 8] [--idle-s 60] [--stream-s 20]
Uses TRAINJOBS_TEST_DATABASE_URL (or TRAINJOBS_DATABASE_URL), else an embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import bench_db  # noqa: E402
from bench.api_bench import start, stop  # noqa: E402
from bench.log_memory_bench import checkout  # noqa: E402
from trainjobs.loopback import free_port  # noqa: E402

SPEC = {"name": "fanout", "dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp"},
        "accelerator": {"type": "cpu"}, "training": {"epochs": 10}}

WORKER = """
import sys, threading, uuid
from service.db.session import get_engine
from worker.gcs_channel import GcsJobChannel
from worker.loop import Worker, WorkerConfig
from worker.memory_cloud import MemoryCloud, memory_stager
url, jobs = sys.argv[1], int(sys.argv[2])
w = Worker(get_engine(url), MemoryCloud(train_s=1e9), GcsJobChannel(), memory_stager,
           WorkerConfig(concurrency=jobs, name=f"bench-{uuid.uuid4().hex[:6]}"))
w.start()
threading.Event().wait()
"""


def requests(emulator: str, bucket: str) -> Counter[tuple[str, str, int]]:
    """The emulator's count of requests on `bucket` so far, by (operation, price class, HTTP status)."""
    from stack.emulator_requests import request_counts

    counts: Counter[tuple[str, str, int]] = Counter()
    for row in request_counts(emulator, bucket):
        counts[(row["op"], row["class"], row["status"])] += row["count"]
    return counts


def pg_counts(url: str) -> tuple[int, int]:
    """(row updates of `jobs`, committed transactions) in the database, as pg_stat counts them."""
    import psycopg
    from sqlalchemy.engine import make_url

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    time.sleep(1.5)  # pg_stat takes what backends flush, at most a second late
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        upd = conn.execute("SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'jobs'").fetchone()
        xact = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()
    assert upd is not None and xact is not None
    return int(upd[0]), int(xact[0])


def report(progress: float) -> dict[str, object]:
    return {"state": "running", "phase": "training", "attempt": 1, "progress": progress, "epoch": 1, "epochs": 10,
            "metrics": {"loss": 0.5}, "heartbeat_at": datetime.now(UTC).isoformat()}


def idle_jobs(side: str, repo: Path, emulator: str, jobs: int, window_s: float) -> dict[str, float]:
    from service.db import jobs as jobdata
    from service.db.models import Job
    from service.db.projects import ensure_project
    from service.db.session import get_engine, session_factory, transaction
    from trainjobs import storage
    from trainjobs.job_paths import JobPaths
    from trainjobs.spec import JobSpec
    from trainjobs.states import JobStatus

    url = bench_db.fresh_database(f"trainjobs_fanout_{side}")
    bucket = f"fanout-idle-{side}-{uuid.uuid4().hex[:6]}"
    os.environ["TRAINJOBS_BUCKET"] = bucket
    storage.ensure_bucket(bucket)
    factory = session_factory(get_engine(url))
    spec = JobSpec.model_validate(SPEC).model_dump(mode="json")
    with transaction(factory) as s:
        project = ensure_project(s, "bench")
        ids = [jobdata.create_job(s, project, spec, idempotency_key=None, request_hash=b"")[0].id for _ in range(jobs)]
    stop_beats, writes = threading.Event(), [0]

    def heartbeat() -> None:  # the agent's TRAINJOBS_HEARTBEAT_S default: nothing new but the heartbeat
        while True:
            for job_id in ids:
                storage.write_json(JobPaths.for_job(str(job_id)).status, report(0.1))
                writes[0] += 1
            if stop_beats.wait(10.0):
                return

    beats = threading.Thread(target=heartbeat, daemon=True)
    beats.start()
    env = {**os.environ, "PYTHONPATH": str(repo), "TRAINJOBS_BUCKET": bucket}
    worker = subprocess.Popen([sys.executable, "-c", WORKER, url, str(jobs)], cwd=repo, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with transaction(factory) as s:
                if all(s.get(Job, i).status == JobStatus.RUNNING for i in ids):  # type: ignore[union-attr]
                    break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"{side}: the jobs never all ran")
        time.sleep(20)  # past the first reports, and past the status reads' backing off
        gcs0, (upd0, xact0), w0 = requests(emulator, bucket), pg_counts(url), writes[0]
        time.sleep(window_s)
        gcs1, (upd1, xact1), w1 = requests(emulator, bucket), pg_counts(url), writes[0]
    finally:
        stop_beats.set()
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    per = 60.0 / window_s / jobs
    diff = gcs1 - gcs0
    by_class: Counter[str] = Counter()
    for (_, cls, _), n in diff.items():
        by_class[cls] += n
    return {"GCS class B": by_class["B"] * per,
            "GCS class A, less the agent's writes": (by_class["A"] - (w1 - w0)) * per,
            "  of class B: answered 304": sum(n for (_, _, code), n in diff.items() if code == 304) * per,
            "  of class B: metadata GETs": sum(n for (op, _, _), n in diff.items() if op == "objects.get") * per,
            "jobs row updates": (upd1 - upd0) * per, "transactions": (xact1 - xact0) * per}


def followers(side: str, repo: Path, emulator: str, counts: list[int], window_s: float) -> dict[int, dict[str, float]]:
    from sqlalchemy import text

    from service.db import jobs as jobdata
    from service.db.projects import create_api_key, ensure_project
    from service.db.session import get_engine, session_factory, transaction
    from trainjobs import storage
    from trainjobs.job_paths import JobPaths
    from trainjobs.spec import JobSpec

    url = bench_db.fresh_database(f"trainjobs_fanout_streams_{side}")
    bucket = f"fanout-streams-{side}-{uuid.uuid4().hex[:6]}"
    storage.ensure_bucket(bucket)
    os.environ["TRAINJOBS_BUCKET"] = bucket
    factory = session_factory(get_engine(url))
    with transaction(factory) as s:
        key = create_api_key(s, "bench")
    port = free_port()
    env = {**os.environ, "TRAINJOBS_DATABASE_URL": url, "PYTHONPATH": str(repo), "TRAINJOBS_BUCKET": bucket,
           "TRAINJOBS_STREAMS_PER_KEY": "1000", "TRAINJOBS_STREAMS_PER_PROCESS": "1000"}
    api = start([sys.executable, "-m", "stack.cli", "api", "--port", str(port)], f"http://127.0.0.1:{port}/healthz",
                env, cwd=repo)
    results: dict[int, dict[str, float]] = {}
    try:
        for n in counts:
            spec = JobSpec.model_validate(SPEC).model_dump(mode="json")
            with transaction(factory) as s:
                job = jobdata.create_job(s, ensure_project(s, "bench"), spec, idempotency_key=None, request_hash=b"")[0]
                # A running job's stream polls at the running rate; no worker runs here to start it.
                s.execute(text("UPDATE jobs SET status = 'RUNNING' WHERE id = :id"), {"id": job.id})
            log_uri = f"{JobPaths.for_job(str(job.id)).logs}/agent-1-0.log"
            storage.blob(log_uri).upload_from_string(b"started\n")
            lines_seen = Counter[int]()
            done = threading.Event()

            def follow(index: int, job_id: str = str(job.id)) -> None:
                with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"},
                                  timeout=None) as client, client.stream("GET", f"/v1/jobs/{job_id}/logs?follow=true") as r:
                    for line in r.iter_lines():
                        if line.startswith("event: log"):
                            lines_seen[index] += 1
                        if done.is_set():
                            return

            threads = [threading.Thread(target=follow, args=(i,), daemon=True) for i in range(n)]
            for t in threads:
                t.start()
            time.sleep(3)  # every stream started and caught up
            before, text_now, written = requests(emulator, bucket), "started\n", 0
            started = time.monotonic()
            while time.monotonic() - started < window_s:
                text_now += f"line {written}\n"
                storage.blob(log_uri).upload_from_string(text_now.encode())
                written += 1
                time.sleep(1.0)
            time.sleep(2)
            diff = requests(emulator, bucket) - before
            done.set()
            storage.blob(log_uri).upload_from_string((text_now + "bye\n").encode())  # wakes each reader to leave
            for t in threads:
                t.join(10)
            per = 60.0 / (time.monotonic() - started)
            results[n] = {"lists": sum(v for (op, _, _), v in diff.items() if op == "objects.ls") * per,
                          "downloads": sum(v for (op, _, _), v in diff.items() if op.endswith("(media)")) * per,
                          "metadata GETs": sum(v for (op, _, _), v in diff.items() if op == "objects.get") * per,
                          "lines per follower (min)": float(min(lines_seen[i] for i in range(n)) if n else 0)}
    finally:
        stop(api)
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default="13329a6", help="the commit before issue 25's status reads and feeds")
    ap.add_argument("--jobs", type=int, default=8)  # a project runs 8 at once by default (service/db/quotas.py)
    ap.add_argument("--idle-s", type=float, default=60.0)
    ap.add_argument("--followers", type=int, default=50)
    ap.add_argument("--stream-s", type=float, default=20.0)
    args = ap.parse_args()

    from stack.embedded import start_gcs_emulator, use_emulator

    emu = start_gcs_emulator(None, bucket="fanout-bench")
    use_emulator(emu, "fanout-bench")
    before = checkout(args.before)
    sides = {"before": before, "after": ROOT}
    try:
        idle = {side: idle_jobs(side, repo, emu.url, args.jobs, args.idle_s) for side, repo in sides.items()}
        streams = {side: followers(side, repo, emu.url, [1, args.followers], args.stream_s)
                   for side, repo in sides.items()}
    finally:
        emu.stop()

    print(f"\n1. {args.jobs} RUNNING jobs, agent writing only heartbeats (every 10 s); per job per minute, "
          f"{args.idle_s:.0f} s window")
    names = sorted({k for v in idle.values() for k in v})
    print(f"{'':34s}" + "".join(f"{s:>12s}" for s in sides))
    for name in names:
        print(f"{name:34s}" + "".join(f"{idle[s].get(name, 0.0):12.1f}" for s in sides))
    print(f"\n2. storage requests per minute of the API for one job's log stream, {args.stream_s:.0f} s window, "
          "a line a second")
    for n in (1, args.followers):
        for side in sides:
            row = streams[side][n]
            print(f"{side:7s} {n:3d} follower(s): " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()))


if __name__ == "__main__":
    main()
