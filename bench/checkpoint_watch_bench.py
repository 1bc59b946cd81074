"""What watching a program's checkpoint directory costs the agent (issue 37): the CPU of
`CheckpointWatch.turn`, called at every 0.2 s turn of the agent's loop over a directory that holds N files
and does not change (the steady state between saves, when nothing is uploaded), against the timer it
replaced, which listed and stat'ed the directory (storage.local_files) once every TRAINJOBS_PROGRAM_SYNC_S
(60 s). Both as a share of one core, in one run on the same directory.

- watch: `turn()` every 0.2 s for --seconds of wall time; its process CPU over that time.
- timer: one pass of the old sync's scan (local_files, then a stat per file), its CPU spread over 60 s.

The watch looks at a large directory less often (its scans kept under SCAN_COST_SHARE of a core), so its
share stays bounded however many files there are; the timer's is lower but its uploads wait a minute.

Usage: python bench/checkpoint_watch_bench.py [--seconds 10] [--files 10 1000 10000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import agent.checkpoint_sync as watching  # noqa: E402
from agent.checkpoint_sync import CheckpointWatch, Scan, scan  # noqa: E402
from trainjobs import storage  # noqa: E402

TIMER_S = 60.0
TURN_S = 0.2


def _directory(root: Path, n: int) -> None:
    """n files as a CheckpointManager's shards and BackupAndRestore's files lie, 100 to a folder."""
    for i in range(n):
        path = root / f"shard-{i // 100:04d}" / f"ckpt-{i:06d}.data-00000-of-00001"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 64)


def _watch_share(root: Path, seconds: float) -> tuple[float, int]:
    watch = CheckpointWatch(root, "gs://bench/jobs/j/checkpoints", upload=True, attempt=1, committed=None)
    # As after its first upload: storage holds what the directory holds, so a turn uploads nothing.
    watch._stored = {rel: (*state, f"sets/a1-000001/{rel}") for rel, state in scan(root).files.items()}
    scans = 0

    def counted(path: Path) -> Scan:
        nonlocal scans
        scans += 1
        return scan(path)

    watching.scan = counted  # the module's own name, which turn() calls
    try:
        cpu, end = time.process_time(), time.monotonic() + seconds
        while time.monotonic() < end:
            watch.turn()
            time.sleep(TURN_S)
        return (time.process_time() - cpu) / seconds, scans
    finally:
        watching.scan = scan


def _timer_share(root: Path) -> float:
    cpu = time.process_time()
    for path in storage.local_files(root):  # the old CheckpointSync's pass
        path.relative_to(root).as_posix()
        path.stat()
    return (time.process_time() - cpu) / TIMER_S


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--files", type=int, nargs="+", default=[10, 1000, 10000])
    args = parser.parse_args()
    print("| files | watch: scans/s | watch: % of a core | timer: % of a core | watch / timer |")
    print("|---|---|---|---|---|")
    for n in args.files:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            _directory(root, n)
            _timer_share(root)  # warm the directory's inodes for both
            timer = min(_timer_share(root) for _ in range(3))
            watch, scans = _watch_share(root, args.seconds)
            print(f"| {n} | {scans / args.seconds:.1f} | {100 * watch:.3f} | {100 * timer:.4f} | "
                  f"{watch / timer if timer else float('inf'):.0f}x |")


if __name__ == "__main__":
    main()
