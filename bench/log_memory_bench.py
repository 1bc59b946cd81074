"""Memory of the API serving a job's 200 MB log (issue 18, finding 5): peak RSS of `trainjobs api`
for three GET /v1/jobs/{id}/logs, as a ratio to the same process's peak before them, for the code
before the fix (a checkout of --before, whose GET concatenates every log object in memory) and
after it (pages of at most a MiB), in the same run, against the same PostgreSQL and GCS emulator.

The log is written straight to the emulator, as the job's own code could write it. The peak is the
kernel's high-water mark of the server process (VmHWM in /proc/<pid>/status), so a spike between
two samples is not missed. "after, whole log" reads the log to its end three times, page by page,
as `trainjobs logs` does: the same bytes as the three GETs before.

Usage: python bench/log_memory_bench.py [--log-mb 200] [--before 5c7e1ba]
Uses TRAINJOBS_TEST_DATABASE_URL (or TRAINJOBS_DATABASE_URL), else an embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import bench_db  # noqa: E402
from bench.api_bench import start, stop  # noqa: E402
from trainjobs.loopback import free_port  # noqa: E402

BUCKET = "trainjobs-logbench"


def peak_rss_mb(pid: int) -> float:
    """The process's high-water mark of resident memory, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for {pid}")


def server_pid(proc: subprocess.Popen[bytes]) -> int:
    """`trainjobs api` with one worker serves in the process it starts."""
    return proc.pid


def checkout(revision: str) -> Path:
    """The tree of `revision`, unpacked from git (the working tree is not touched)."""
    target = Path(tempfile.mkdtemp(prefix="logbench-before-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def measure(repo: Path, env: dict[str, str], key: str, small_job: str,
            reads: Callable[[httpx.Client], None]) -> tuple[float, float]:
    """(peak RSS after start and warm-up requests, peak RSS after `reads`) of a fresh server from
    repo. The warm-up reads another job's small log: the route's code paths, not the big log."""
    port = free_port()
    proc = start([sys.executable, "-m", "stack.cli", "api", "--port", str(port)], f"http://127.0.0.1:{port}/healthz",
                 {**env, "PYTHONPATH": str(repo)}, cwd=repo)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"},
                          timeout=600) as client:
            assert client.get(f"/v1/jobs/{small_job}").status_code == 200
            assert client.get(f"/v1/jobs/{small_job}/logs").json()["text"].endswith("a small log\n")
            baseline = peak_rss_mb(server_pid(proc))
            reads(client)
            return baseline, peak_rss_mb(server_pid(proc))
    finally:
        stop(proc)


def three_gets(job_id: str) -> Callable[[httpx.Client], None]:
    def run(client: httpx.Client) -> None:
        for _ in range(3):
            r = client.get(f"/v1/jobs/{job_id}/logs")
            assert r.status_code == 200, r.text[:200]
            del r
    return run


def three_whole_reads(job_id: str, expect_bytes: int) -> Callable[[httpx.Client], None]:
    def run(client: httpx.Client) -> None:
        for _ in range(3):
            cursor, got = None, 0
            while True:
                page = client.get(f"/v1/jobs/{job_id}/logs", params={"cursor": cursor} if cursor else {}).json()
                got += len(page["text"].encode())
                if not (cursor := page.get("next_cursor")):
                    break
            assert got >= expect_bytes, (got, expect_bytes)
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log-mb", type=int, default=200)
    ap.add_argument("--before", default="5c7e1ba", help="the commit before issue 18's bounded reads")
    args = ap.parse_args()

    from service.db.projects import create_api_key
    from service.db.session import get_engine, session_factory, transaction
    from stack.embedded import start_gcs_emulator, use_emulator
    from trainjobs import storage
    from trainjobs.job_paths import JobPaths

    url = bench_db.fresh_database("trainjobs_logbench")
    emulator = start_gcs_emulator(None, bucket=BUCKET)
    use_emulator(emulator, BUCKET)
    before = checkout(args.before)
    try:
        with transaction(session_factory(get_engine(url))) as session:
            key = create_api_key(session, "logbench")
        env = {**os.environ, "TRAINJOBS_DATABASE_URL": url, "STORAGE_EMULATOR_HOST": emulator.url,
               "TRAINJOBS_BUCKET": BUCKET}
        port = free_port()
        api = start([sys.executable, "-m", "stack.cli", "api", "--port", str(port)],
                    f"http://127.0.0.1:{port}/healthz", {**env, "PYTHONPATH": str(ROOT)})
        try:
            job, small = (httpx.post(f"http://127.0.0.1:{port}/v1/jobs", headers={"Authorization": f"Bearer {key}"},
                                     json={"dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp"}}).json()
                          for _ in range(2))
        finally:
            stop(api)
        storage.blob(JobPaths.for_job(small["id"]).log(1, 0)).upload_from_string(b"a small log\n")
        line = b"%08d " + b"x" * 90 + b"\n"
        log = b"".join(line % i for i in range(args.log_mb * 10_000))  # 100 bytes a line
        started = time.monotonic()
        storage.blob(JobPaths.for_job(job["id"]).log(1, 0)).upload_from_string(log)
        print(f"wrote a {len(log) / 1e6:.0f} MB log for job {job['id']} in {time.monotonic() - started:.1f} s", flush=True)
        size = len(log)
        del log

        rows = [
            ("before: 3 GETs (whole log each)", before, three_gets(job["id"])),
            ("after: 3 GETs (a page each)", ROOT, three_gets(job["id"])),
            ("after: 3 whole reads, by pages", ROOT, three_whole_reads(job["id"], size)),
        ]
        print(f"{'':<34} {'peak before':>12} {'peak after':>11} {'ratio':>6}")
        for name, repo, reads in rows:
            started = time.monotonic()
            baseline, peak = measure(repo, env, key, small["id"], reads)
            print(f"{name:<34} {baseline:>9.0f} MB {peak:>8.0f} MB {peak / baseline:>5.2f}x"
                  f"   ({time.monotonic() - started:.0f} s)", flush=True)
    finally:
        emulator.stop()
        subprocess.run(["rm", "-rf", str(before)], check=False)


if __name__ == "__main__":
    main()
