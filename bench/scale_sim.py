"""Issue 25's scale test as one simulation: N running jobs on 2 worker processes in 2 zones and both
products, their stand-in agents writing status.json to the GCS emulator on the agent's schedule, and an
API process serving --streams open follow-streams over --followed jobs, measured for --seconds of
steady state after the ramp.

Why a script of its own rather than options on fleet_bench.py: fleet_bench drives its jobs in its own
process through an in-memory channel (so its count is the clouds' alone); here each worker, the API and
the followers are processes of their own, so that each one's CPU and memory can be read (/proc), and
status reads go through the real GcsJobChannel to the emulator, so that they are counted there.

- Clouds: the fake Cloud TPU and Compute Engine APIs (stack/fakecloud), in this process, served over
  HTTP to the workers' real Google clients; counted by the fakes by method (request_counts()).
- Workers: 2 processes, each `trainjobs worker --provisioner gcp`'s provisioner (GcpProvisioner, both
  products, WatchConfig's defaults) with the real GcsJobChannel and the in-memory stager; worker 0's
  zone is us-central1-a with us-central1-b as fallback, worker 1 the reverse, so each lists both zones
  and their jobs run in the zone each tries first. concurrency N/2 each, so the jobs split in two.
- Agents: this script, for every RUNNING job whose machine the fake says runs: status.json rewritten
  every 10 s (the agent's heartbeat default) with nothing new but the heartbeat; --news of the
  followed jobs also advance their progress and append a line to their log each time.
- API: `trainjobs api` (one process); a follower process holds --streams follow-streams of the logs
  of --followed RUNNING jobs (round robin) and reads every line, for the whole window.
- Counted per minute over the window: cloud requests by product and method (the fakes' counters),
  GCS operations by class and operation (the emulator's counter, GET /_trainjobs/requests),
  PostgreSQL transactions and row changes (pg_stat_database of the bench database; pg_stat_statements
  is not preloaded on the shared server), each process's CPU seconds and RSS (/proc,
  one process each). During the window one TPU job's machine is preempted (time to its RECOVERING event) and,
  half way, one GPU job is cancelled (time from the request to CANCELLED).

    .venv/bin/python bench/scale_sim.py --jobs 500 [--streams 200 --followed 50 --news 5 --seconds 60]

Without TRAINJOBS_TEST_DATABASE_URL it starts an embedded PostgreSQL of its own (bench_db): two
workers' and the API's connection pools need about 100 connections, more than a shared server had free.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from collections.abc import Callable
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import bench_db  # noqa: E402
from bench.api_bench import start, stop  # noqa: E402
from bench.fleet_bench import method, wait  # noqa: E402
from trainjobs.loopback import free_port  # noqa: E402

ZONES = ("us-central1-a", "us-central1-b")

WORKER = """
import sys, threading
from service.db.session import get_engine
from worker.gcp.compute import GceVmProvisioner
from worker.gcp.config import GcpConfig
from worker.gcp.machine_watch import WatchConfig
from worker.gcp.router import GcpProvisioner
from worker.gcp.tpu import TpuVmProvisioner
from worker.gcs_channel import GcsJobChannel
from worker.loop import Worker, WorkerConfig
from worker.memory_cloud import memory_stager
url, jobs, name, tpu, gce, zone, fallback = sys.argv[1:8]
config = GcpConfig(project="proj", zone=zone, fallback_zones=(fallback,), tpu_api_endpoint=tpu,
                   compute_api_endpoint=gce)
startup = lambda r: "#!/bin/bash\\n"  # the fakes boot nothing; the agents are the bench's
# As stack/wiring.py builds the gcp runtime; the waits and backoffs as tests/support/fleet.py's.
provisioner = GcpProvisioner(
    TpuVmProvisioner(config, create_wait_s=0, delete_wait_s=30, backoff_s=0.05, startup=startup, watch=WatchConfig()),
    GceVmProvisioner(config, create_wait_s=30, delete_wait_s=30, backoff_s=0.05, poll_s=0.1, startup=startup,
                     watch=WatchConfig()))
w = Worker(get_engine(url), provisioner, GcsJobChannel(), memory_stager,
           WorkerConfig(concurrency=int(jobs), takeover_slots=0, name=name))
w.start()
threading.Event().wait()
"""

FOLLOWERS = """
import sys, threading, time, httpx
base, key, seconds, jobs = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
lines = [0] * len(jobs)
def follow(i, job):
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30) as c:
        while time.monotonic() < deadline:  # a stream that ends (or fails) is opened again, as a watcher would
            try:
                with c.stream("GET", f"/v1/jobs/{job}/logs?follow=true") as r:
                    for line in r.iter_lines():
                        lines[i] += line.startswith("event: log")
                        if time.monotonic() > deadline:
                            return
            except httpx.HTTPError:
                time.sleep(1)
threads = [threading.Thread(target=follow, args=(i, j), daemon=True) for i, j in enumerate(jobs)]
for t in threads:
    t.start()
for t in threads:
    t.join(seconds + 60)
print(*lines, flush=True)
"""


def report(attempt: int, progress: float) -> dict[str, object]:
    return {"state": "running", "phase": "training", "attempt": attempt, "progress": progress, "epoch": 1,
            "epochs": 10, "metrics": {"loss": 0.5}, "heartbeat_at": datetime.now(UTC).isoformat()}


class Agents:
    """Every job's agent, as far as storage sees one: status.json every 10 s while its machine runs
    (from its first boot, as the agent reports before the job is RUNNING); the `news` jobs also
    progress and log a line each time. `running()` says which machines run: {job id's first 20 hex
    digits: attempt}."""

    def __init__(self, ids: list[uuid.UUID], running: Callable[[], dict[str, int]], news: set[uuid.UUID]) -> None:
        self.ids = {i.hex[:20]: i for i in ids}
        self.running, self.news = running, news
        self.writes, self.stop = 0, threading.Event()
        self.logs: dict[uuid.UUID, str] = {}
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        from trainjobs import storage
        from trainjobs.job_paths import JobPaths

        beat = 0
        while not self.stop.is_set():
            began = time.monotonic()
            for tag, attempt in self.running().items():
                if self.stop.is_set() or (job_id := self.ids.get(tag)) is None:
                    continue
                paths = JobPaths.for_job(str(job_id))
                news = job_id in self.news
                storage.write_json(paths.status, report(attempt, min(1.0, 0.01 * beat) if news else 0.1))
                self.writes += 1
                if news:
                    self.logs[job_id] = self.logs.get(job_id, "") + f"step {beat}: loss 0.5\n"
                    storage.blob(f"{paths.logs}/agent-{attempt}-0.log").upload_from_string(self.logs[job_id].encode())
                    self.writes += 1
            beat += 1
            self.stop.wait(max(0.0, 10.0 - (time.monotonic() - began)))


def cpu_rss(pid: int) -> tuple[float, int]:
    """CPU seconds (user + system, /proc/PID/stat) and RSS (bytes) of one process: each measured process
    here is one process (uvicorn with one worker serves in its own)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks, int(fields[21]) * os.sysconf("SC_PAGE_SIZE")


def gcs_requests(emulator: str, bucket: str, news: set[str]) -> Counter[tuple[str, str, str, int]]:
    """The emulator's count so far by (price class, operation, object kind, HTTP status): the object's
    kind tells whose request it was (status.json: the workers' status reads; a log or a listing: the
    API's feeds; spec.json: a worker's prepare; an upload: the agents')."""
    from stack.emulator_requests import request_counts

    counts: Counter[tuple[str, str, str, int]] = Counter()
    for row in request_counts(emulator, bucket):
        name = row["object"].rsplit("/", 1)[-1]
        kind = "log" if name.endswith(".log") else name or ("(listing)" if row["op"] == "objects.ls" else "(upload)")
        if kind == "status.json" and any(job in row["object"] for job in news):
            kind = "status.json (news)"  # read soon after each change, by design: not the idle goal's
        counts[(row["class"], row["op"], kind, row["status"])] += row["count"]
    return counts


def pg_stats(url: str) -> dict[str, int]:
    import psycopg
    from sqlalchemy.engine import make_url

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute("SELECT xact_commit, xact_rollback, tup_returned, tup_fetched, tup_inserted, tup_updated, "
                           "tup_deleted FROM pg_stat_database WHERE datname = current_database()").fetchone()
    assert row is not None
    names = ("xact_commit", "xact_rollback", "tup_returned", "tup_fetched", "tup_inserted", "tup_updated", "tup_deleted")
    return dict(zip(names, (int(v) for v in row)))


def table_stats(url: str) -> dict[str, dict[str, int]]:
    """Per table: sequential scans and the rows they read, index scans and the rows they fetched."""
    import psycopg
    from sqlalchemy.engine import make_url

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        rows = conn.execute("SELECT relname, seq_scan, seq_tup_read, coalesce(idx_scan, 0), coalesce(idx_tup_fetch, 0) "
                            "FROM pg_stat_user_tables").fetchall()
    return {r[0]: {"seq_scan": r[1], "seq_tup_read": r[2], "idx_scan": r[3], "idx_tup_fetch": r[4]} for r in rows}


def submit(factory: Any, project: Any, product: str, n: int) -> list[uuid.UUID]:
    from sqlalchemy import update

    from service.db import jobs as jobdata
    from service.db.models import Project
    from tests.support.fleet import ACCELERATORS
    from trainjobs.spec import JobSpec
    from service.db.session import transaction

    spec = JobSpec.model_validate({"name": f"scale-{product}", "dataset": {"source": "sklearn:digits"},
                                   "model": {"name": "mlp"}, "accelerator": {**cast(dict[str, Any], ACCELERATORS[product]), "spot": True},
                                   "strategy": "auto", "training": {"epochs": 1}}).model_dump(mode="json")
    with transaction(factory) as s:
        # The project's quotas let the whole fleet run at once (the defaults hold 8 jobs).
        s.execute(update(Project).where(Project.id == project).values(max_running_jobs=100_000,
                                                                        max_accelerators=10_000_000))
        return [jobdata.create_job(s, project, spec, idempotency_key=None, request_hash=b"")[0].id for _ in range(n)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from sqlalchemy import func, select

    from service.db import jobs as jobdata
    from service.db.models import Job, JobEvent
    from service.db.projects import create_api_key, ensure_project
    from service.db.session import get_engine, session_factory, transaction
    from stack.embedded import start_gcs_emulator, use_emulator
    from stack.fakecloud import FakeComputeApi, FakeTpuApi
    from stack.fakecloud.compute_inventory import ComputeTiming
    from stack.fakecloud.tpu_inventory import Timing
    from trainjobs.states import JobStatus

    bucket = f"scale-sim-{uuid.uuid4().hex[:6]}"
    emu = start_gcs_emulator(None, bucket=bucket)
    use_emulator(emu, bucket)
    url = bench_db.fresh_database("trainjobs_scale_sim")
    factory = session_factory(get_engine(url))
    sandbox = Path(tempfile.mkdtemp(prefix="scale-sim-"))
    tpu = FakeTpuApi(sandbox=sandbox / "tpu", boot=False, timing=Timing(boot_s=0.3, delete_s=0.2)).start()
    gce = FakeComputeApi(sandbox=sandbox / "gce", boot=False, timing=ComputeTiming(boot_s=0.3, delete_s=0.2)).start()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    agents: Agents | None = None
    try:
        with transaction(factory) as s:
            project = ensure_project(s, "bench")
            key = create_api_key(s, "bench")
        tpu_ids = submit(factory, project, "tpu", args.jobs // 2)
        gpu_ids = submit(factory, project, "gpu", args.jobs - args.jobs // 2)
        ids = [i for pair in zip(tpu_ids, gpu_ids) for i in pair] + tpu_ids[len(gpu_ids):] + gpu_ids[len(tpu_ids):]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        per_worker = (args.jobs + 1) // 2
        for n, (zone, fallback) in enumerate((ZONES, ZONES[::-1])):
            procs[f"worker {n}"] = subprocess.Popen(
                [sys.executable, "-c", WORKER, url, str(per_worker), f"scale-{n}", tpu.url, gce.url, zone, fallback],
                cwd=ROOT, env=env, start_new_session=True)

        def count(status: JobStatus) -> int:
            with transaction(factory) as s:
                return int(s.scalar(select(func.count()).select_from(Job).where(Job.status == status)) or 0)

        followed = ids[: args.followed]  # ids alternate the products: followed jobs of both
        agents = Agents(ids, lambda: _running(tpu, gce), set(followed[: args.news]))
        news = {str(i) for i in followed[: args.news]}
        agents.thread.start()
        ramp_started = time.monotonic()
        ramp_s = wait(f"{args.jobs} jobs RUNNING", lambda: count(JobStatus.RUNNING) == args.jobs, args.ramp_timeout, 1.0)
        port = free_port()
        api_env = {**env, "TRAINJOBS_DATABASE_URL": url, "TRAINJOBS_STREAMS_PER_KEY": str(args.streams + 50),
                   "TRAINJOBS_STREAMS_PER_PROCESS": str(args.streams + 50)}
        procs["api"] = start([sys.executable, "-m", "stack.cli", "api", "--port", str(port)],
                             f"http://127.0.0.1:{port}/healthz", api_env)
        watched = [str(followed[i % len(followed)]) for i in range(args.streams)]
        follow_s = args.settle + args.seconds + 30
        procs["followers"] = subprocess.Popen([sys.executable, "-c", FOLLOWERS, f"http://127.0.0.1:{port}", key,
                                               str(follow_s), *watched], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                              start_new_session=True)
        time.sleep(args.settle)  # streams open and caught up; past the first status reads and their backoff
        victim, cancelled = tpu_ids[-1], gpu_ids[-1]
        victim_machine = next(m for m in tpu.node_names() if victim.hex[:20] in m)

        def snapshot() -> dict[str, Any]:
            return {"t": time.monotonic(), "tpu": Counter(method(r, tpu.routes) for r in tpu.requests),
                    "gce": Counter(method(r, gce.routes) for r in gce.requests), "gcs": gcs_requests(emu.url, bucket, news),
                    "pg": pg_stats(url), "tables": table_stats(url), "cpu": {name: cpu_rss(p.pid) for name, p in procs.items()},
                    "writes": agents.writes if agents else 0}

        before = snapshot()
        preempted_at = datetime.now(UTC)
        tpu.preempt(victim_machine)
        time.sleep(args.seconds / 2)
        with transaction(factory) as s:  # one user's cancel, half way
            jobdata.request_cancel(s, project, cancelled)
        one_cancel_s = wait("the cancel", lambda: _status(factory, cancelled) == JobStatus.CANCELLED, 120, 0.05)
        time.sleep(max(0.0, args.seconds - (time.monotonic() - before["t"])))
        after = snapshot()
        with transaction(factory) as s:
            noticed = s.scalars(select(JobEvent.at).where(JobEvent.job_id == victim,
                                                          JobEvent.to_status == JobStatus.RECOVERING)).first()
        zones = _zones(tpu, gce)
        stop(procs.pop("api"))
        out, _ = procs.pop("followers").communicate(timeout=120)
    finally:
        if agents:
            agents.stop.set()
        for p in procs.values():
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        tpu.stop()
        gce.stop()
        emu.stop()
        shutil.rmtree(sandbox, ignore_errors=True)
    elapsed = after["t"] - before["t"]
    per_min = 60.0 / elapsed
    running_jobs = args.jobs

    def rate(c: Counter[Any]) -> dict[str, float]:
        return {str(k): round(v * per_min, 1) for k, v in sorted(c.items()) if v}

    gcs = after["gcs"] - before["gcs"]
    by_class: Counter[str] = Counter()
    by_op: Counter[str] = Counter()
    for (cls, op, kind, code), n in gcs.items():
        by_class[cls] += n
        by_op[f"{cls} {op} {kind} {code}"] += n
    # The idle goal: reads of the jobs whose agent writes nothing but its heartbeat.
    status_reads = sum(n for (cls, _, kind, _), n in gcs.items() if cls == "B" and kind == "status.json")
    agent_writes = after["writes"] - before["writes"]
    pg = {k: round((after["pg"][k] - before["pg"][k]) * per_min) for k in before["pg"]}
    tables = {t: {k: round((v - before["tables"].get(t, {}).get(k, 0)) * per_min) for k, v in row.items()}
              for t, row in after["tables"].items()}
    tables = {t: row for t, row in tables.items() if row["seq_tup_read"] + row["idx_tup_fetch"] > 0}
    procs_cpu = {}
    for name in after["cpu"]:
        cpu = (after["cpu"][name][0] - before["cpu"][name][0]) * per_min
        procs_cpu[name] = {"cpu_s_per_min": round(cpu, 1), "rss_mb": round(after["cpu"][name][1] / 2**20)}
    workers_cpu = sum(v["cpu_s_per_min"] for k, v in procs_cpu.items() if k.startswith("worker"))
    tpu_reads = sum(v for k, v in (after["tpu"] - before["tpu"]).items() if k.startswith("GET"))
    gce_reads = sum(v for k, v in (after["gce"] - before["gce"]).items() if k.startswith("GET"))
    lines = [int(n) for n in out.decode().split()]
    # Streams i with i % followed < news follow the jobs with news (watched is round robin over followed).
    news_lines = [n for i, n in enumerate(lines) if i % args.followed < args.news]
    return {
        "jobs": args.jobs, "streams": args.streams, "followed": args.followed, "window_s": round(elapsed, 1),
        "ramp_s": round(ramp_s, 1), "ramp_started_to_window_s": round(before["t"] - ramp_started, 1),
        "cloud_reads_per_min": round((tpu_reads + gce_reads) * per_min),
        "tpu_per_min": rate(after["tpu"] - before["tpu"]), "gce_per_min": rate(after["gce"] - before["gce"]),
        "gcs_per_min_by_class": rate(by_class), "gcs_per_min_by_op": rate(by_op),
        "agent_writes_per_min": round(agent_writes * per_min),
        "gcs_status_reads_per_idle_job_per_10s": round(status_reads * per_min / 6 / (running_jobs - args.news), 2),
        "pg_per_min": pg, "processes": procs_cpu,
        "worker_cpu_ms_per_min_per_job": round(workers_cpu * 1000 / running_jobs, 1),
        "preemption_noticed_s": round((noticed - preempted_at).total_seconds(), 1) if noticed else None,
        "one_cancel_s": round(one_cancel_s, 2), "zones": dict(zones),
        "lines_per_stream_of_jobs_with_news_min_max": [min(news_lines), max(news_lines)],
        "lines_other_streams": sum(lines) - sum(news_lines), "tables_per_min": tables, "load_avg": os.getloadavg(),
    }


def _status(factory: Any, job_id: uuid.UUID) -> Any:
    from service.db.models import Job
    from service.db.session import transaction

    with transaction(factory) as s:
        job = s.get(Job, job_id)
        return job.status if job else None


def _running(tpu: Any, gce: Any) -> dict[str, int]:
    """The machines the fakes say run, as {job id's first 20 hex digits: attempt} (MachineRequest.name:
    tj-<20 hex>-a<attempt>[-<host>]): a preempted machine's agent is gone."""
    names = [m for m in tpu.node_names() if tpu.node_state(m) == "READY"]
    names += gce.instance_names(status="RUNNING")
    return {m.split("-")[1]: int(m.split("-")[2][1:]) for m in names}


def _zones(tpu: Any, gce: Any) -> dict[str, int]:
    """Machines by product and zone, as the fakes hold them."""
    found: Counter[str] = Counter()
    for m in tpu.node_names():
        found["tpu " + str((tpu.node(m) or {}).get("name", "?")).split("/locations/")[-1].split("/")[0]] += 1
    for m in gce.instance_names():
        found["gce " + str((gce.instance(m) or {}).get("zone", "?")).rsplit("/", 1)[-1]] += 1
    return dict(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--followed", type=int, default=50)
    parser.add_argument("--news", type=int, default=5, help="followed jobs whose agent progresses and logs")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=20.0)
    parser.add_argument("--ramp-timeout", type=float, default=600.0)
    args = parser.parse_args()
    # A timeout's SIGTERM unwinds run(), whose finally stops the processes it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
