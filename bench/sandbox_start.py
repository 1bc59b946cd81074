"""What a sandboxed local machine costs to start (issue 36, finding 10), against the zygote fork it replaces.

A sandboxed agent cannot be forked from the worker's zygote (it would run outside the sandbox), so each
sandboxed machine imports TensorFlow, Keras and the agent again in a fresh interpreter. Three ways to
reach an agent ready to run a job, each timed ROUNDS times in turns on the same host (median):

- fork: the zygote forks an agent that has everything imported (`--help`: it exits at once); wall time
  from the request to its exit. Its CPU is the zygote's child's and is not counted here (fork + exit).
- fresh: `python -c "import <agent.zygote.PRELOAD>"` as a plain process: wall and CPU seconds.
- sandboxed: the same inside the machine's bubblewrap sandbox (worker/local/sandbox.py): wall and CPU.

And bubblewrap's own cost: an empty interpreter in the sandbox against outside it.

    .venv/bin/python bench/sandbox_start.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.zygote import PRELOAD  # noqa: E402
from worker.local.provisioner import agent_environment, start_agent_zygote  # noqa: E402
from worker.local.sandbox import bwrap_command, probe  # noqa: E402

# Each timed interpreter says its own CPU seconds at its end: a sandboxed one is not this process's
# child (bubblewrap's init in its PID namespace reaps it), so RUSAGE_CHILDREN would not see it.
CPU = "import resource; u = resource.getrusage(resource.RUSAGE_SELF); print(u.ru_utime + u.ru_stime)"
IMPORTS = "import importlib; [importlib.import_module(m) for m in %r]; %s" % (PRELOAD, CPU)


def run(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s) of one interpreter to its exit."""
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{command[0]} exited {done.returncode}: {done.stderr[-1500:]}")
    return time.perf_counter() - started, float(done.stdout.split()[-1])


def sandboxed(command: list[str], disk: Path) -> list[str]:
    return bwrap_command(command=command, writable=[disk], readable=[], guard_socket=None, network=False, cwd=disk)


def fork_s(zygote, disk: Path, env: dict[str, str]) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    pid = zygote.spawn(["--help"], env, disk / "fork.log")
    while Path(f"/proc/{pid}").exists():
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except OSError:
            break
        time.sleep(0.002)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    if (problem := probe()) is not None:
        print(f"no sandbox on this host: {problem}")
        return 1
    env = agent_environment(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2", HOME="/tmp")
    with tempfile.TemporaryDirectory() as scratch:
        disk = Path(scratch)
        zygote = start_agent_zygote(disk / "zygote.log")
        zygote.spawn(["--help"], env, disk / "warm.log")  # waits for its imports
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in ("fork", "fresh", "sandboxed", "pass", "pass in sandbox")}
        for _ in range(rounds):  # in turns, so a load change touches every variant alike
            times["fork"].append((fork_s(zygote, disk, env), 0.0))
            times["fresh"].append(run([sys.executable, "-c", IMPORTS], env))
            times["sandboxed"].append(run(sandboxed([sys.executable, "-c", IMPORTS], disk), env))
            times["pass"].append(run([sys.executable, "-c", CPU], env))
            times["pass in sandbox"].append(run(sandboxed([sys.executable, "-c", CPU], disk), env))
        zygote.close()
    median = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in times.items()}
    print(f"{'start':<18}{'wall s':>8}{'CPU s':>8}   (median of {rounds}, {os.cpu_count()} CPUs)")
    for name, (wall, cpu) in median.items():
        print(f"{name:<18}{wall:>8.2f}{cpu:>8.2f}")
    print(f"sandboxed / fork wall: {median['sandboxed'][0] / median['fork'][0]:.1f}x; sandboxed / fresh wall: "
          f"{median['sandboxed'][0] / median['fresh'][0]:.2f}x, CPU {median['sandboxed'][1] / median['fresh'][1]:.2f}x; "
          f"bubblewrap's own: +{median['pass in sandbox'][0] - median['pass'][0]:.3f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
