"""How much CPU the processes outside a benchmark use while it runs (Linux, from /proc).

On a small shared machine a neighbour's burst halves a MirroredStrategy step (its replicas run in
lockstep, so one stolen core stalls both) and a throughput median turns into noise. The monitor
samples the whole machine's busy time and the benchmark's own process tree (this process and its
descendants) and keeps the difference, so each timed interval can be judged by what ran beside it.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

SAMPLE_S = 0.25
_TICKS = os.sysconf("SC_CLK_TCK")


def _machine_busy_s() -> float:
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / _TICKS


def _tree_cpu_s(root: int) -> float:
    """CPU seconds of root and its live descendants (all their threads)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # exited while we looked
            continue
        rest = stat[stat.rindex(")") + 2:].split()  # the command name may hold spaces
        parents[int(entry.name)] = int(rest[1])
        times[int(entry.name)] = (int(rest[11]) + int(rest[12])) / _TICKS  # utime + stime
    ours, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in ours:
                ours.add(child)
                frontier.append(child)
    return sum(times.get(pid, 0.0) for pid in ours)


class NeighbourLoad:
    """Call start(), then share(t0, t1) for any wall-clock (time.time()) interval since."""

    def __init__(self) -> None:
        self.available = Path("/proc/stat").exists()
        self._samples: list[tuple[float, float]] = []  # (wall time, neighbours' cores over the last sample)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="neighbour-load", daemon=True)

    def start(self) -> NeighbourLoad:
        if self.available:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def share(self, t0: float, t1: float) -> float | None:
        """Mean CPU cores the neighbours used between t0 and t1; None without samples."""
        inside = [cores for t, cores in list(self._samples) if t0 < t <= t1 + SAMPLE_S]
        return sum(inside) / len(inside) if inside else None

    def wait_for_quiet(self, below_cores: float, timeout_s: float) -> float:
        """Block until the neighbours used less than below_cores over a second; return the seconds waited."""
        began = time.time()
        while self.available and time.time() - began < timeout_s:
            time.sleep(1.0)
            recent = self.share(time.time() - 1.0, time.time())
            if recent is not None and recent < below_cores:
                break
        return time.time() - began

    def _run(self) -> None:
        me = os.getpid()
        last_t, last_busy, last_ours = time.time(), _machine_busy_s(), _tree_cpu_s(me)
        while not self._stop.wait(SAMPLE_S):
            t, busy, ours = time.time(), _machine_busy_s(), _tree_cpu_s(me)
            # A child that exited since the last sample takes its CPU time with it: clamp at 0.
            cores = max(0.0, (busy - last_busy) - max(0.0, ours - last_ours)) / max(t - last_t, 1e-3)
            self._samples.append((t, cores))
            last_t, last_busy, last_ours = t, busy, ours
