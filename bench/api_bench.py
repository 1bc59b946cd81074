"""API hot paths (issue 12): `wrk` against `trainjobs api` and against a bare FastAPI + SQLAlchemy app
(bench/bare_app.py: one primary-key select) in the same run, on the same PostgreSQL.

Measured, each as wrk -t2 -c32 (HTTP/1.1 keep-alive), after a warm-up, rounds alternating so that
machine load that drifts over the minutes hits both sides alike:
  GET  /v1/jobs/{id}        a RUNNING job (what a dashboard polls) vs the bare app's GET /jobs/{id}
  POST /v1/jobs             a small spec (sklearn:digits, cnn), into a project emptied before each run
  GET  /v1/jobs?limit=50    the newest page of a project holding --jobs jobs
with `trainjobs api --workers 1` and then `--workers 2`. Then the list and POST again at the goals' rates
(150/s and 250/s, offered by 32 clients that pause between requests: wrk's delay()), for their p99 at
that load rather than at saturation.

--explain: also seeds --explain-jobs jobs into one project and prints EXPLAIN (ANALYZE, BUFFERS) of
the list query with no filter, a status filter, a label filter and both (bench/README.md).

--before CHECKOUT (issue 25): also serve `trainjobs api` from another checkout (the code before a change),
one process beside ours, and alternate bare / before / ours in every round, so that both ratios come
from the same minutes. --get-only: only the GET rounds.

Usage: python bench/api_bench.py [--duration 10] [--rounds 3] [--workers 1,2] [--jobs 2000] [--explain]
       [--explain-only] [--profile] [--repo CHECKOUT] [--before CHECKOUT] [--get-only]
Uses TRAINJOBS_TEST_DATABASE_URL (or TRAINJOBS_DATABASE_URL), else an embedded PostgreSQL. Needs wrk.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import bench_db  # noqa: E402

import httpx  # noqa: E402
from sqlalchemy import text  # noqa: E402

from service.db.projects import create_api_key, ensure_project  # noqa: E402
from service.db.session import get_engine, session_factory, transaction  # noqa: E402
from service.db.session import upgrade  # noqa: E402
from trainjobs.loopback import free_port  # noqa: E402

SPEC = {"name": "digits", "dataset": {"source": "sklearn:digits"}, "model": {"name": "cnn"},
        "accelerator": {"type": "cpu", "replicas": 2}, "strategy": "mirrored", "training": {"epochs": 2},
        "labels": {"team": "vision"}}
METRICS = {"epoch": 2, "loss": 0.21, "accuracy": 0.94, "val_loss": 0.25, "val_accuracy": 0.93,
           "examples_per_sec": 14000.0, "step_time_ms": 2.1, "input_wait_fraction": 0.02}
RUNTIME = {"strategy": "mirrored", "replicas": 2, "precision": "float32", "global_batch_size": 64,
           "learning_rate": 0.001, "steps_per_execution": 4, "notes": ["steps_per_execution auto: 4 (CPU)"]}
POST_RATE, LIST_RATE = 250, 150  # issue 12's throughput goals, offered paced for the p99 at that load
STATUSES = ["SUCCEEDED"] * 16 + ["FAILED", "CANCELLED", "RUNNING", "QUEUED"]


def seed(url: str, project: str, n: int, *, quota: int | None = None, labels: dict[str, str] | None = None) -> str:
    """n jobs in `project`, one a second up to now, returns a new key of the project. Statuses and
    labels are drawn independently (a fixed seed): 80% SUCCEEDED, 5% each FAILED, CANCELLED,
    RUNNING and QUEUED; team one of four, sweep one of fifty, and one job in 2000 labelled rare=yes;
    `labels` on every job."""
    factory = session_factory(get_engine(url))
    with transaction(factory) as s:
        project_id = ensure_project(s, project)
        s.execute(text("UPDATE projects SET max_running_jobs = :q WHERE id = :p"), {"q": quota, "p": project_id})
        key = create_api_key(s, project)
        s.execute(text("SELECT setseed(0.42)"))
        s.execute(text("""
            INSERT INTO jobs (project_id, name, spec, labels, status, created_at, updated_at, progress, metrics,
                              runtime, staging_at, provisioning_at, running_at, finished_at)
            SELECT :p, 'job-' || g, CAST(:spec AS jsonb),
                   jsonb_build_object('team', (ARRAY['vision','speech','nlp','ads'])[1 + floor(random() * 4)::int],
                                      'sweep', 's' || floor(random() * 50)::int)
                     || CASE WHEN random() < 0.0005 THEN '{"rare": "yes"}'::jsonb ELSE '{}'::jsonb END
                     || CAST(:labels AS jsonb),
                   CAST((CAST(:statuses AS text[]))[1 + floor(random() * 20)::int] AS job_status),
                   now() - (:n - g) * interval '1 second', now(), 1.0, CAST(:metrics AS jsonb), CAST(:runtime AS jsonb),
                   now(), now(), now(), now()
              FROM generate_series(1, :n) g"""),
                  {"p": project_id, "n": n, "spec": json.dumps(SPEC), "metrics": json.dumps(METRICS),
                   "runtime": json.dumps(RUNTIME), "statuses": STATUSES, "labels": json.dumps(labels or {})})
    with get_engine(url).connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE jobs"))
    return key


def wait_up(url: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer")


def start(cmd: list[str], probe: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, start_new_session=True)
    wait_up(probe, proc)
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _ms(value: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", value).groups()  # type: ignore[union-attr]
    return float(number) * _UNITS[unit]


def wrk(url: str, key: str, seconds: float, script: str | None = None) -> dict[str, Any]:
    cmd = ["wrk", "-t2", "-c32", f"-d{round(seconds)}s", "--latency", "-H", f"Authorization: Bearer {key}", url]
    if script:
        cmd[1:1] = ["-s", script]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    pct = dict(re.findall(r"^\s+(50|99)%\s+(\S+)\s*$", out, re.M))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sockets = re.search(r"Socket errors: (.*)", out)
    return {"rps": round(rps, 1), "p50_ms": round(_ms(pct["50"]), 1), "p99_ms": round(_ms(pct["99"]), 1),
            "non_2xx": int(errors.group(1)) if errors else 0, "socket_errors": sockets.group(1) if sockets else ""}


def profile(pid: int, seconds: int, run_load) -> list[str]:  # type: ignore[no-untyped-def]
    """py-spy samples of the server process `pid` while run_load() drives it: the top frames by own
    time, and the share of samples under each of our functions (inclusive)."""
    raw = Path(tempfile.mkdtemp()) / "profile.txt"
    spy_bin = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    # --gil: only the thread holding the GIL, i.e. where the one core Python can use goes.
    spy = subprocess.Popen([spy_bin, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", "100", "--gil",
                            "--format", "raw", "-o", str(raw)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_load()
    spy.wait()
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [f for f in stack.split(";") if not f.startswith("process ") and not f.startswith("thread ")]
        n = int(count)
        if not frames:
            continue
        total += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for f in set(frames):
            if "/work/main/" in f or "(service/" in f or "(stack/" in f:
                inclusive[f] = inclusive.get(f, 0) + n
    out = [f"{total} busy samples; top own time:"]
    out += [f"  {100 * n / total:5.1f}%  {f}" for f, n in sorted(own.items(), key=lambda kv: -kv[1])[:15]]
    out.append("our code, inclusive:")
    out += [f"  {100 * n / total:5.1f}%  {f}" for f, n in sorted(inclusive.items(), key=lambda kv: -kv[1])[:12]]
    return out


def post_script(tmp: Path, paced_rps: float | None = None) -> str:
    path = tmp / ("post.lua" if paced_rps is None else f"post-{paced_rps:g}.lua")
    body = json.dumps(SPEC).replace("\\", "\\\\").replace("'", "\\'")
    path.write_text(f"wrk.method = 'POST'\nwrk.body = '{body}'\nwrk.headers['Content-Type'] = 'application/json'\n"
                    + _pace(paced_rps))
    return str(path)


def paced_script(tmp: Path, paced_rps: float) -> str:
    path = tmp / f"get-{paced_rps:g}.lua"
    path.write_text(_pace(paced_rps))
    return str(path)


def _pace(rps: float | None) -> str:
    """32 clients that each wait between requests so that together they send about `rps` a second
    (wrk's delay(); a little under 32/rps each, as the answer's own time adds to it): latency at a
    given load rather than at saturation."""
    if rps is None:
        return ""
    return f"function delay() return {int(32000 / rps * 0.8)} end\n"


LIST_FILTERS: dict[str, tuple[list[str], dict[str, str]]] = {
    "no filter": ([], {}),
    "status=RUNNING (5%)": (["RUNNING"], {}),
    "label team=vision (25%)": ([], {"team": "vision"}),
    "label sweep=s7 (2%)": ([], {"sweep": "s7"}),
    "label rare=yes (0.05%)": ([], {"rare": "yes"}),
    "label team=none (no job)": ([], {"team": "none"}),
    "status=QUEUED + sweep=s7 (0.1%)": (["QUEUED"], {"sweep": "s7"}),
    "status=QUEUED,RUNNING + rare=yes": (["QUEUED", "RUNNING"], {"rare": "yes"}),
}


def _plan(conn: Any, sql: str) -> str:
    plan = conn.execute(text(f"EXPLAIN (ANALYZE, COSTS OFF) {sql}")).scalars().all()
    nodes = [line.strip().removeprefix("->  ").split(" (actual")[0] for line in plan
             if any(k in line for k in ("Scan", "BitmapAnd", "Sort  (", "Sort (", "Incremental Sort"))]
    took = next(line for line in plan if line.startswith("Execution Time")).split(": ")[1]
    return f"{took:>10}  {' / '.join(nodes)}"


def explain(url: str, after: bool) -> None:
    """Before: EXPLAIN ANALYZE of the one statement the list ran. After: the time of
    service.db.jobs.list_jobs itself (median of 5, both of its statements when it needs both), and
    the plan of the statement that found the page."""
    from service.db import jobs as data
    from service.db.jobstate import JobStatus

    factory = session_factory(get_engine(url))
    with factory() as session:
        pid = session.execute(text("SELECT id FROM projects WHERE name = 'bench-explain'")).scalar_one()
        for name, (statuses, labels) in LIST_FILTERS.items():
            where = f"project_id = '{pid}'"
            if statuses:
                where += " AND status IN (" + ", ".join(f"'{st}'" for st in statuses) + ")"
            if labels:
                where += f" AND labels @> '{json.dumps(labels)}'"
            plain = f"SELECT id FROM jobs WHERE {where} ORDER BY created_at DESC, id DESC LIMIT 51"
            if not after:
                session.execute(text(plain)).all()  # warm: the second run is what a busy API sees
                print(f"  {name:<34} {_plan(session, plain)}")
                continue
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                page, _ = data.list_jobs(session, pid, statuses=[JobStatus(st) for st in statuses], labels=labels,
                                         limit=50, cursor=None)
                times.append(time.perf_counter() - t0)
            how = "one statement"
            if labels:
                walk = (f"SELECT id FROM (SELECT id, created_at, labels FROM jobs WHERE {where.split(' AND labels')[0]} "
                        f"ORDER BY created_at DESC, id DESC LIMIT {data.LABEL_WALK_ROWS}) w WHERE labels @> "
                        f"'{json.dumps(labels)}' ORDER BY created_at DESC, id DESC LIMIT 51")
                walked = len(session.execute(text(walk)).all())
                if walked == 51:
                    how, plain = "walk", walk
                else:
                    how = "walk, then GIN"
                    plain = (f"SELECT id FROM jobs WHERE {where.split(' AND labels')[0]} AND "
                             f"jsonb_set('{{}}', ARRAY[project_id::text], labels) @> '{json.dumps({str(pid): labels})}' "
                             "ORDER BY created_at DESC, id DESC LIMIT 51")
            print(f"  {name:<34} list_jobs {1000 * statistics.median(times):6.2f} ms ({len(page)} rows, {how}); "
                  f"its plan: {_plan(session, plain)}")
            session.rollback()


def explain_before_after(url: str, jobs: int) -> None:
    from service.db.session import downgrade

    t0 = time.perf_counter()
    seed(url, "bench-explain", jobs)
    # Another project as big, every job of which carries the label that is rare in ours.
    seed(url, "bench-other", jobs, labels={"rare": "yes"})
    print(f"\nlist plans, {jobs} jobs in the project listed and as many in another, all of whose jobs are "
          f"labelled rare=yes (seeded in {time.perf_counter() - t0:.0f} s)")
    downgrade(url, "0003")
    with get_engine(url).connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE jobs"))
    print("before (GIN on labels alone; one statement, the planner's choice):")
    explain(url, after=False)
    upgrade(url)
    with get_engine(url).connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE jobs"))
    print("after (migration 0005: GIN on {project: labels}; list_jobs walks the newest, then asks the GIN):")
    explain(url, after=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--explain", action="store_true")
    ap.add_argument("--profile", action="store_true", help="py-spy the 1-process server under each load instead")
    ap.add_argument("--explain-jobs", type=int, default=100_000)
    ap.add_argument("--explain-only", action="store_true")
    ap.add_argument("--repo", type=Path, default=ROOT, help="serve `trainjobs api` from another checkout (before)")
    ap.add_argument("--revision", default="head", help="migrate only to this revision (the --repo checkout's head)")
    ap.add_argument("--before", type=Path, help="another checkout's `trainjobs api` beside ours, GET rounds alternating")
    ap.add_argument("--get-only", action="store_true", help="only GET /v1/jobs/{id} (and the bare app's)")
    args = ap.parse_args()
    if args.explain_only:
        explain_before_after(bench_db.fresh_database("trainjobs_apibench"), args.explain_jobs)
        return
    if not shutil.which("wrk"):
        sys.exit("wrk not found: apt-get install wrk")
    url = bench_db.fresh_database("trainjobs_apibench", args.revision)
    key = seed(url, "bench", args.jobs)
    post_key = seed(url, "bench-post", 0, quota=1_000_000)
    with get_engine(url).connect() as conn:
        running = conn.execute(text("SELECT j.id FROM jobs j JOIN projects p ON p.id = j.project_id WHERE p.name = 'bench' "
                                    "AND j.status = 'RUNNING' ORDER BY j.created_at DESC LIMIT 1")).scalar()
    env = {**os.environ, "TRAINJOBS_DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    tmp = Path(tempfile.mkdtemp())
    post = post_script(tmp)
    results: dict[str, list[dict[str, Any]]] = {}

    def record(name: str, r: dict[str, Any]) -> None:
        results.setdefault(name, []).append(r)
        print(f"{name:<28} {r['rps']:>8.1f} req/s  p50 {r['p50_ms']:>7.1f} ms  p99 {r['p99_ms']:>7.1f} ms"
              + (f"  non-2xx {r['non_2xx']}" if r["non_2xx"] else "")
              + (f"  socket errors {r['socket_errors']}" if r["socket_errors"] else ""), flush=True)

    bare_port = free_port()
    bare = start([sys.executable, "bench/bare_app.py", url, str(bare_port)],
                 f"http://127.0.0.1:{bare_port}/jobs/{running}", env)
    before = None
    if args.before:
        before_port = free_port()
        before = start([sys.executable, "-m", "stack.cli", "api", "--port", str(before_port)],
                       f"http://127.0.0.1:{before_port}/healthz", {**env, "PYTHONPATH": str(args.before)},
                       cwd=args.before)
        before_get = f"http://127.0.0.1:{before_port}/v1/jobs/{running}"
        wrk(before_get, key, args.warmup)
    try:
        for workers in [int(w) for w in args.workers.split(",")]:
            port = free_port()
            ours = start([sys.executable, "-m", "stack.cli", "api", "--port", str(port)]
                         + (["--workers", str(workers)] if workers > 1 else []),
                         f"http://127.0.0.1:{port}/healthz", {**env, "PYTHONPATH": str(args.repo)}, cwd=args.repo)
            base = f"http://127.0.0.1:{port}"
            try:
                if args.profile:
                    for what, target, k, script in (
                            ("GET /v1/jobs/{id}", f"{base}/v1/jobs/{running}", key, None),
                            ("GET /v1/jobs?limit=50", f"{base}/v1/jobs?limit=50", key, None),
                            ("POST /v1/jobs", f"{base}/v1/jobs", post_key, post)):
                        print(f"\n== {what}")
                        print("\n".join(profile(ours.pid, args.duration,
                                                 lambda: record(what, wrk(target, k, args.duration, script)))))
                    continue
                for target in (f"http://127.0.0.1:{bare_port}/jobs/{running}", f"{base}/v1/jobs/{running}",
                               f"{base}/v1/jobs?limit=50"):
                    wrk(target, key, args.warmup)
                for _ in range(args.rounds):
                    if workers == 1:
                        record("bare GET /jobs/{id}", wrk(f"http://127.0.0.1:{bare_port}/jobs/{running}", key,
                                                         args.duration))
                        if before is not None:
                            record("before w1 GET /v1/jobs/{id}", wrk(before_get, key, args.duration))
                    record(f"w{workers} GET /v1/jobs/{{id}}", wrk(f"{base}/v1/jobs/{running}", key, args.duration))
                    if args.get_only:
                        continue
                    record(f"w{workers} GET /v1/jobs?limit=50", wrk(f"{base}/v1/jobs?limit=50", key, args.duration))
                    with get_engine(url).begin() as conn:
                        conn.execute(text("DELETE FROM jobs WHERE project_id = "
                                          "(SELECT id FROM projects WHERE name = 'bench-post')"))
                    record(f"w{workers} POST /v1/jobs", wrk(f"{base}/v1/jobs", post_key, args.duration, post))
                    # The goals' rates (issue 12: POST 250/s, list 150/s), offered by 32 clients.
                    record(f"w{workers} list @{LIST_RATE}/s", wrk(f"{base}/v1/jobs?limit=50", key, args.duration,
                                                              paced_script(tmp, LIST_RATE)))
                    record(f"w{workers} POST @{POST_RATE}/s", wrk(f"{base}/v1/jobs", post_key, args.duration,
                                                              post_script(tmp, POST_RATE)))
            finally:
                stop(ours)
    finally:
        stop(bare)
        if before is not None:
            stop(before)

    print("\nmedians over rounds (spread min-max):")
    med = {name: statistics.median(r["rps"] for r in rs) for name, rs in results.items()}
    for name, rs in results.items():
        vals = [r["rps"] for r in rs]
        p99 = statistics.median(r["p99_ms"] for r in rs)
        print(f"{name:<28} {med[name]:>8.1f} req/s ({min(vals):.0f}-{max(vals):.0f})  p99 {p99:.1f} ms")
    bare_runs = [r["rps"] for r in results.get("bare GET /jobs/{id}", [])]
    for name in ("before w1 GET /v1/jobs/{id}", "w1 GET /v1/jobs/{id}"):
        ours_runs = [r["rps"] for r in results.get(name, [])]
        if bare_runs and ours_runs:
            ratios = [o / b for o, b in zip(ours_runs, bare_runs)]
            print(f"{name} vs bare, per round: {', '.join(f'{r:.2f}x' for r in ratios)}; "
                  f"median {statistics.median(ratios):.2f}x")
    for what in ("GET /v1/jobs/{id}", "GET /v1/jobs?limit=50", "POST /v1/jobs"):
        if f"w1 {what}" in med and f"w2 {what}" in med:
            print(f"{what}: 2 processes / 1 = {med[f'w2 {what}'] / med[f'w1 {what}']:.2f}x")
    if args.explain:
        explain_before_after(url, args.explain_jobs)


if __name__ == "__main__":
    main()
