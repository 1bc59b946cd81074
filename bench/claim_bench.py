"""Control-plane benchmark (issue 2), against one PostgreSQL in one run.

1. Claim throughput: the worker's claim statement (claim_next_job: expired-lease probe, queued pick
   within the project's quotas, state update and event row, one atomic statement on an autocommit connection, through SQLAlchemy,
   exactly as Worker._claim runs it) against a raw one-statement
   `UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED)` loop on psycopg. Goal: ours >= 50% of raw.
2. Dispatch latency: from just before `POST /v1/jobs` to the claim's commit in an idle worker that
   only learns of work through NOTIFY (its poll interval is 30 s). Goal: p50 <= 20 ms, p99 <= 100 ms.

Usage: python bench/claim_bench.py [--jobs 2000] [--threads 2] [--posts 200] [--jobs-per-project 8]
Uses TRAINJOBS_TEST_DATABASE_URL (or TRAINJOBS_DATABASE_URL), else an embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import bench_db  # noqa: E402

import httpx  # noqa: E402
import psycopg  # noqa: E402
from sqlalchemy import text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from service.db import queue  # noqa: E402
from service.db.projects import create_api_key, ensure_project  # noqa: E402
from service.db.session import get_engine, session_factory, transaction  # noqa: E402

RAW_CLAIM = """UPDATE jobs SET status = 'STAGING', lease_owner = %s, lease_expires_at = now() + interval '60 s'
 WHERE id = (SELECT id FROM jobs WHERE status = 'QUEUED' ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED)
 RETURNING id"""


def fill_queue(url: str, n: int, per_project: int = 8) -> None:
    """n queued jobs, round-robin over projects whose job quota is `per_project`: no claimed job ever
    finishes here, so every project must have room for all of its jobs. The default, 8, is the
    deployment's default quota: each claim checks a quota as it would in production."""
    engine = get_engine(url)
    projects = max(1, -(-n // per_project))
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE job_events, idempotency_keys, jobs CASCADE"))
        conn.execute(text("""INSERT INTO projects (name, max_running_jobs) SELECT 'bench-' || i, :q FROM generate_series(1, :p) i
            ON CONFLICT (name) DO UPDATE SET max_running_jobs = :q"""), {"p": projects, "q": per_project})
        conn.execute(text("""INSERT INTO jobs (project_id, name, spec, status, created_at)
            SELECT p.id, 'j' || g, '{}'::jsonb, 'QUEUED', now() + g * interval '1 microsecond'
              FROM generate_series(1, :n) g JOIN projects p ON p.name = 'bench-' || (1 + g % :p)"""),
                     {"p": projects, "n": n})
        conn.execute(text("ANALYZE jobs"))


def run_threads(threads: int, body) -> float:  # type: ignore[no-untyped-def]
    ts = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def bench_claims(url: str, jobs: int, threads: int, per_project: int) -> dict[str, float]:
    engine = get_engine(url)
    counts = [0] * threads

    def ours(i: int) -> None:
        # Exactly as Worker._claim runs it: one autocommit connection per claim loop.
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            while queue.claim_next_job(conn, f"w{i}", 60) is not None:
                counts[i] += 1

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)

    def raw(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while conn.execute(RAW_CLAIM, (f"w{i}",)).fetchone() is not None:
                counts[i] += 1

    results = {}
    for name, body in (("raw", raw), ("ours", ours), ("raw2", raw), ("ours2", ours)):  # interleaved, twice
        fill_queue(url, jobs, per_project)
        counts[:] = [0] * threads
        elapsed = run_threads(threads, body)
        assert sum(counts) == jobs, (name, sum(counts))
        results[name] = jobs / elapsed
    raw_rate = max(results["raw"], results["raw2"])
    ours_rate = max(results["ours"], results["ours2"])
    return {"raw_claims_per_s": round(raw_rate), "ours_claims_per_s": round(ours_rate),
            "ratio": round(ours_rate / raw_rate, 3)}


def bench_dispatch(url: str, posts: int) -> dict[str, float]:
    import uvicorn

    from service.app import create_app
    from trainjobs.loopback import free_port
    from worker.driver import DriverConfig
    from worker.loop import Worker, WorkerConfig
    from worker.memory_cloud import MemoryCloud, memory_stager

    fill_queue(url, 0)
    factory = session_factory(get_engine(url))
    with transaction(factory) as s:
        ensure_project(s, "bench")
        # This measures dispatch, not waiting for a quota: no job here may wait for a slot.
        s.execute(text("UPDATE projects SET max_running_jobs = :n WHERE name = 'bench'"), {"n": posts + 1})
        key = create_api_key(s, "bench")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(url), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    cloud = MemoryCloud(boot_s=0.01, train_s=0.05)
    worker = Worker(get_engine(url), cloud, cloud, memory_stager,
                    WorkerConfig(concurrency=32, poll_s=30.0, name="bench", driver=DriverConfig(poll_s=0.05)))
    worker.start()
    time.sleep(0.5)
    spec = {"dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp"}}
    sent: dict[str, float] = {}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"}) as c:
        c.post("/v1/jobs", json=spec)  # warm connections and caches
        for _ in range(posts):
            t = time.time()
            sent[c.post("/v1/jobs", json=spec).json()["id"]] = t
            time.sleep(0.02)
    time.sleep(1.0)
    worker.shutdown()
    server.should_exit = True
    with transaction(factory) as s:
        claimed = dict(s.execute(text("SELECT job_id::text, extract(epoch FROM at) FROM job_events WHERE reason = 'claimed'")).all())
    lat = sorted((float(claimed[j]) - t) * 1000 for j, t in sent.items() if j in claimed)
    assert len(lat) == posts, f"only {len(lat)} of {posts} claimed"
    q = statistics.quantiles(lat, n=100)
    return {"posts": posts, "p50_ms": round(q[49], 2), "p99_ms": round(q[98], 2), "max_ms": round(lat[-1], 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--posts", type=int, default=200)
    ap.add_argument("--jobs-per-project", type=int, default=8,
                    help="claim throughput: jobs (and job quota) per project; --jobs-per-project 2000 puts all in one")
    args = ap.parse_args()
    url = bench_db.fresh_database("trainjobs_bench")
    claims = bench_claims(url, args.jobs, args.threads, args.jobs_per_project)
    dispatch = bench_dispatch(url, args.posts)
    print(json.dumps({"claim_throughput": claims, "dispatch_latency": dispatch}, indent=2))
    ok = claims["ratio"] >= 0.5 and dispatch["p50_ms"] <= 20 and dispatch["p99_ms"] <= 100
    print("goals met" if ok else "GOALS NOT MET")


if __name__ == "__main__":
    main()
