"""Cloud reads of a fleet of running jobs (issue 25): N jobs on one worker against the fake Cloud TPU and
Compute Engine APIs, counted by the fakes themselves, with each job reading its own machine every
driver step ("before": no MachineWatch, the code path of main) and with one shared listing per zone
("after": WatchConfig's defaults, as `trainjobs worker --provisioner gcp` wires it: with --workers 2, one
listing for the fleet; "per-worker": the same watch, but each worker lists for itself).

Per product and way: the jobs are submitted and driven to RUNNING (the ramp's reads are reported per
job), then for --seconds the fake's requests are counted by method while one spot job's machine is
preempted (the time until its driver notices, from the preemption to its RECOVERING event) and, half
way, another job is cancelled (the time from the request to CANCELLED); then every job is cancelled at
once (the time until the last is CANCELLED). The agents are stand-ins
(tests/support/fleet.py): they report like an agent while their machine runs, through an in-memory
channel, so the driver's status reads cost no storage requests and the count is the clouds' alone.

    TRAINJOBS_TEST_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/fleet_bench.py --jobs 40 --seconds 60 [--products tpu gpu] [--ways before after] \\
        [--workers 1 2]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import bench_db  # noqa: E402
from service.db import jobs as jobdata  # noqa: E402
from service.db.models import Job, JobEvent  # noqa: E402
from service.db.session import get_engine, session_factory, transaction  # noqa: E402
from sqlalchemy import select, text  # noqa: E402
from stack.fakecloud import FakeTpuApi  # noqa: E402
from stack.fakecloud.server import RecordedRequest  # noqa: E402
from tests.support.fleet import Fleet, fleet  # noqa: E402
from trainjobs.states import JobStatus  # noqa: E402
from trainjobs.vm_metadata import LABEL_MACHINE  # noqa: E402
from worker.gcp.machine_watch import WatchConfig  # noqa: E402


def method(r: RecordedRequest, routes: list[Any]) -> str:
    """The request's method as the fake routes it; Compute Engine's list split by what it asks for."""
    action = next((a for verb, pattern, a in routes if verb == r.method and pattern.match(r.path)), r.path)
    if action == "list" and r.method == "GET":
        return "GET instances.list (one job's machine)" if LABEL_MACHINE in r.query.get("filter", "") \
            else "GET instances.list (all ours)"
    return f"{r.method} {action}"


def statuses(f: Fleet) -> Counter[str]:
    with transaction(f.factory) as s:
        return Counter(str(j.status.value) for j in s.scalars(select(Job)))


def wait(what: str, condition: Any, timeout: float, every: float = 0.5) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)
    return time.monotonic() - started


def run(url: str, product: str, way: str, jobs: int, seconds: float, workers: int = 1) -> dict[str, Any]:
    factory = session_factory(get_engine(url))
    with transaction(factory) as s:
        s.execute(text("TRUNCATE jobs, machine_listings CASCADE"))  # the previous run's jobs and listing
    watch = WatchConfig() if way != "before" else None
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as sandbox, \
            fleet(url, factory, product, Path(sandbox), jobs=-(-jobs // workers), train_s=10 * 3600, watch=watch,
                  workers=workers, share_listing=way == "after") as f:
        ids = f.submit(product, jobs, spot=True)
        ramp_s = wait(f"{jobs} jobs RUNNING", lambda: statuses(f)["RUNNING"] == jobs, 600)
        ramp_reads = f.reads()
        time.sleep(5)  # the last creates' follow-up looks settle (after: the listing that takes them in)
        start, started = len(f.fake.requests), time.monotonic()
        victim = ids[0]
        name = next(m for m in (f.fake.node_names() if isinstance(f.fake, FakeTpuApi) else f.fake.instance_names())
                    if victim.hex[:20] in m)
        preempted_at = datetime.now(UTC)
        f.fake.preempt(name)
        time.sleep(seconds / 2)
        with transaction(f.factory) as s:  # one user's cancel, in the middle of the window
            jobdata.request_cancel(s, s.get(Job, ids[1]).project_id, ids[1])
        one_cancel_s = wait("a job CANCELLED", lambda: statuses(f)["CANCELLED"] == 1, 600, every=0.05)
        time.sleep(max(0.0, seconds - (time.monotonic() - started)))
        window = f.fake.requests[start:]
        elapsed = time.monotonic() - started
        with transaction(f.factory) as s:
            noticed = s.scalars(select(JobEvent.at).where(
                JobEvent.job_id == victim, JobEvent.to_status == JobStatus.RECOVERING)).first()
        by_method = Counter(method(r, f.fake.routes) for r in window)
        # Which machines were read one by one, most first (the preempted job's recovery, in steady state).
        own = Counter(r.query.get("filter", r.path).rsplit(" ", 1)[-1].strip('"').rsplit("/", 1)[-1]
                      for r in window if "one job's" in method(r, f.fake.routes) or method(r, f.fake.routes) in (
                          "GET get_node", "GET get_queued"))
        with transaction(f.factory) as s:
            project = s.get(Job, victim).project_id
        cancelling = time.monotonic()
        for i in ids:  # one transaction each, as the API's: one holding every row deadlocked with the drivers
            with transaction(f.factory) as s:
                jobdata.request_cancel(s, project, i)
        wait("every job CANCELLED", lambda: statuses(f)["CANCELLED"] == jobs, 600, every=0.1)
        cancel_s = time.monotonic() - cancelling  # from the first request
    per_minute = {m: round(n * 60 / elapsed) for m, n in sorted(by_method.items())}
    reads = sum(n for m, n in by_method.items() if m.startswith("GET"))
    return {"product": product, "way": way, "jobs": jobs, "workers": workers, "window_s": round(elapsed, 1),
            "reads_per_minute": round(reads * 60 / elapsed), "per_minute_by_method": per_minute,
            "ramp_s": round(ramp_s, 1), "ramp_reads_per_job": round(ramp_reads / jobs, 1),
            "preemption_noticed_s": round((noticed - preempted_at).total_seconds(), 1) if noticed else None,
            "most_read_machines": own.most_common(3), "one_cancel_s": round(one_cancel_s, 2),
            "all_cancelled_s": round(cancel_s, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--products", nargs="+", default=["tpu", "gpu"], choices=["tpu", "gpu"])
    # per-worker: the watch, but each worker lists for itself (before the fleet's listing, issue 25).
    parser.add_argument("--ways", nargs="+", default=["before", "after"], choices=["before", "per-worker", "after"])
    # Several workers (a provisioner each, one database): with the watch they share one listing per zone.
    parser.add_argument("--workers", type=int, nargs="+", default=[1])
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    url = bench_db.fresh_database("trainjobs_fleet_bench")
    for product in args.products:
        for way in args.ways:
            for workers in args.workers:
                result = run(url, product, way, args.jobs, args.seconds, workers)
                print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
