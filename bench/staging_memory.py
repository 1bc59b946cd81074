"""Staging's memory with a hostile cell, and what the staging child costs a job (issue 36, finding 3).

1. Peak memory of staging the review's file (1,000 rows, one 131,000-character text cell, under 1.4
   KB of gzip) against the same file with that cell as short as the others: the staging child's peak
   resident memory above what it started with (VmHWM - VmRSS at its start, /proc/self/status).
2. The time one staging takes in a child (GcsStager, as the worker runs it) against the same staging
   in this process (stage_job, the function the child runs), on scikit-learn's iris as it ships:
   alternating, each in a fresh bucket (a full staging: read, shard, upload), and again with the
   dataset already staged (the reuse path most of a demo's jobs take). Also: what a fresh interpreter
   pays to import staging (the cost "spawn" would add to every call) and the fork server's one start.

Against an in-memory GCS emulator this process starts. Nothing here asserts a time.
Run: .venv/bin/python bench/staging_memory.py [--runs 10]
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BUCKET = "staging-bench"
ROWS, LONG_CELL = 1000, 131_000


def review_file(folder: Path, long_cell: bool) -> Path:
    lines = ["a,b,c,d,e,note,label"]
    for r in range(ROWS):
        note = ("word " * (LONG_CELL // 5)).strip() if r == 0 and long_cell else f"a short note {r % 7}"
        lines.append(",".join(str(r * k % 10) for k in (1, 3, 7, 9, 11)) + f",{note},{r % 2}")
    target = folder / ("hostile.csv.gz" if long_cell else "plain.csv.gz")
    target.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=9))
    return target


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def staged_peak_mib(source: str, work: str, bucket: str) -> tuple[float, float]:
    """In the staging child: (its resident memory at start, its peak above that), in MiB."""
    from trainjobs.source_rules import DataAccessRules
    from trainjobs.spec import DatasetSpec
    from worker.staging import stage_dataset

    start = _status_kib("VmRSS")
    rules = DataAccessRules(host_dirs=(Path(source).parent,))
    stage_dataset(DatasetSpec(source=source), project_id="bench", work_dir=Path(work), bucket=bucket, rules=rules)
    return start / 1024, (_status_kib("VmHWM") - start) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()

    from stack.embedded import start_gcs_emulator, use_emulator
    from trainjobs import storage
    from trainjobs.source_rules import DataAccessRules
    from trainjobs.spec import JobSpec
    from worker.staging.budget import StagingLimits
    from worker.staging_adapter import GcsStager, stage_job
    from worker.staging_child import run_in_child

    emulator = start_gcs_emulator(None, bucket=BUCKET)
    use_emulator(emulator, BUCKET)
    tmp = Path(tempfile.mkdtemp(prefix="staging-bench-"))
    try:
        started = time.monotonic()
        run_in_child(os.getpid, memory_mb=2048, timeout_s=600)  # the first call waits for the fork server
        fork_server_s = time.monotonic() - started
        started = time.monotonic()
        for _ in range(args.runs):
            run_in_child(os.getpid, memory_mb=2048, timeout_s=600)
        empty_call_ms = (time.monotonic() - started) / args.runs * 1000
        code = "import worker.staging_adapter, google.cloud.storage.transfer_manager, sklearn.datasets"
        started = time.monotonic()
        subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])
        spawn_imports_s = time.monotonic() - started

        print("1. peak memory of one staging, in its child (MiB above its start)")
        peaks: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(3):
            for long_cell in (True, False):
                source = review_file(tmp, long_cell)
                bucket = f"b-{uuid.uuid4().hex[:10]}"
                storage.ensure_bucket(bucket)
                base, peak = run_in_child(staged_peak_mib, str(source), str(tmp / "work"), bucket,
                                          memory_mb=2048, timeout_s=600)
                peaks[long_cell].append(peak)
        hostile, plain = statistics.median(peaks[True]), statistics.median(peaks[False])
        print(f"   child starts at {base:.0f} MiB resident; hostile file +{hostile:.1f} MiB, without the long cell "
              f"+{plain:.1f} MiB: ratio {hostile / plain:.2f}x (sizes {review_file(tmp, True).stat().st_size} B "
              f"and {review_file(tmp, False).stat().st_size} B of gzip)")

        print("2. one staging of sklearn:iris: in a child vs in this process (median of %d each)" % args.runs)
        spec = JobSpec.model_validate({"name": "b", "dataset": {"source": "sklearn:iris"}, "model": {"name": "mlp"},
                                       "accelerator": {"type": "cpu", "replicas": 1}, "training": {"epochs": 1}})
        rules, limits = DataAccessRules.from_env(), StagingLimits.from_env()
        times: dict[str, list[float]] = {k: [] for k in ("child", "in-process", "child reused", "in-process reused")}
        for i in range(args.runs):
            for where in ("child", "in-process") if i % 2 == 0 else ("in-process", "child"):
                bucket = f"b-{uuid.uuid4().hex[:10]}"
                storage.ensure_bucket(bucket)
                for label in (where, f"{where} reused"):  # a fresh bucket, then the same again: reused
                    started = time.monotonic()
                    if where == "child":
                        GcsStager(tmp / "stager", bucket=bucket)(spec, f"j{i}", project_id="bench")
                    else:
                        stage_job(spec, f"j{i}", "bench", rules, limits, tmp / "stager", bucket)
                    times[label].append(time.monotonic() - started)
        med = {k: statistics.median(v) * 1000 for k, v in times.items()}
        print(f"   full staging: child {med['child']:.0f} ms, in-process {med['in-process']:.0f} ms: "
              f"ratio {med['child'] / med['in-process']:.2f}x (+{med['child'] - med['in-process']:.0f} ms)")
        print(f"   already staged: child {med['child reused']:.0f} ms, in-process {med['in-process reused']:.0f} ms: "
              f"ratio {med['child reused'] / med['in-process reused']:.2f}x "
              f"(+{med['child reused'] - med['in-process reused']:.0f} ms)")
        print(f"   a child that does nothing: {empty_call_ms:.0f} ms a call; once per worker, the fork server's "
              f"start: {fork_server_s:.2f} s (GcsStager starts it in the background)")
        print(f"   a fresh interpreter importing staging: {spawn_imports_s:.2f} s, what 'spawn' would add to every call")
        print(f"   ({os.cpu_count()} CPUs, Python {sys.version.split()[0]})")
    finally:
        emulator.stop()


if __name__ == "__main__":
    main()
