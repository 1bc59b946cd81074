"""A process that imports TensorFlow, Keras and the agent once, then forks each local agent from there.

Importing them is most of a small local job's start: 4.5-6 CPU-s of every agent process on this
machine's cores, before it reads its job. A forked agent starts with all of it loaded (tens of
milliseconds), which is also most of what the test suite's dozens of local agents cost.

Why forking is safe here: the zygote has one thread when it forks. It imports with
OPENBLAS_NUM_THREADS=1 (else OpenBLAS starts a thread pool as numpy loads), it never runs a
TensorFlow op (the runtime, its thread pools and gRPC start in the child, at its first op), and it
reaps nothing itself (SIGCHLD ignored: the kernel reaps its children). Each child makes itself a
session and process group of its own (the provisioner's delete signals the group), points stdin at
/dev/null and stdout/stderr at its machine's log (which also closes the zygote's request channel,
fds 0 and 1, in the child), replaces its environment with the machine's, and runs
`python -m agent`'s main.

Who can ask the zygote for an agent: only the worker. The channel is a unix socketpair, one end the
zygote's fds 0 and 1, the other held by the worker (worker/local/zygote_client.py). A socket cannot be
opened through /proc/<pid>/fd (open(2) answers ENXIO, to root too), unlike the pipes this used to be:
a job's code opened the worker's end of the request pipe that way and had agents started (issue 18).
The zygote is also not dumpable, so no process of its user can read its memory or attach to it. What
no local measure stops: root (pidfd_getfd(2), ptrace) — and the test suite's jobs run as root.

What a child has that a fresh process would not: the modules the zygote imported, as they were when
it started; environment variables that TensorFlow reads while importing (TF_CPP_MIN_LOG_LEVEL, say)
as they were in the zygote's environment, which is the agents' allow-listed one; OpenBLAS with one
thread; and numpy's global random state of the zygote (the agent seeds what it draws from the spec).
The zygote's environment is the allow-listed agent environment: it holds nothing of the worker's.

Protocol: one JSON object a line on the zygote's stdin ({"args", "env", "log"}), one reply a line on
its stdout ({"pid"} or {"error"}), both the socket; "ready" is the first line, once the imports are
done. EOF on stdin (its provisioner shut its end, or the worker died) ends the zygote; the agents it
forked run on.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

# What the zygote imports before it says it is ready: what every agent imports before its first step.
PRELOAD = ("tensorflow", "keras", "agent.__main__", "agent.run")
READY = "ready"  # its first line (worker/local/zygote_client.py waits for it)

PR_SET_DUMPABLE = 4


def _set_dumpable(on: bool) -> None:
    """Off in the zygote: other processes of the same user (its agents, running jobs' code) can then
    neither read its memory nor attach to it. Back on in each child."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, int(on), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def become_agent(args: list[str], env: dict[str, str], output: Callable[[], int],
                 prepare: Callable[[], None] = lambda: None) -> NoReturn:
    """In a forked child: run `python -m agent ARGS`'s main with `env` as the whole environment, stdin
    at /dev/null (it was the parent's request channel) and stdout and stderr on the descriptor `output()`
    gives; `prepare` first. Never returns: whatever happens, the child must not return into its
    parent's loop. Also tests/support/agent_forker.py's."""
    code = 1
    try:
        prepare()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        out = output()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # was the parent's request channel
        os.dup2(out, 1)  # was its reply channel, in the zygote
        os.dup2(out, 2)
        os.close(null)
        os.close(out)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = ["agent", *args]
        from agent.__main__ import main

        code = main(args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - whatever happens, the child must not return into its parent's loop
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _child(request: dict[str, Any]) -> NoReturn:
    """In the forked child: a session of its own, dumpable again, its output appended to the machine's log."""

    def detach() -> None:
        os.setsid()
        _set_dumpable(True)

    become_agent(request["args"], request["env"],
                 lambda: os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644), detach)


def main() -> int:
    import gc
    import importlib

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C for `trainjobs up` ends it by EOF, in order
    _set_dumpable(False)
    started = time.monotonic()
    if not os.path.isdir("/proc/self/task"):
        print("no /proc/self/task here: cannot tell whether forking is safe", flush=True)
        return 1
    for name in PRELOAD:
        importlib.import_module(name)
    if (threads := len(os.listdir("/proc/self/task"))) != 1:
        print(f"{threads} threads after the imports: forking is not safe", flush=True)
        return 1
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the agents
    # The imports' 335k objects never die: frozen, an agent's full collections skip them (each took
    # 0.14-0.21 s of an agent's start, measured here), and its pages stay shared with this process.
    gc.collect()
    gc.freeze()
    print(f"zygote {os.getpid()}: imports took {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)
    print(READY, flush=True)
    for line in sys.stdin:
        try:
            request = json.loads(line)
            pid = os.fork()
        except (ValueError, OSError) as exc:
            print(json.dumps({"error": str(exc)}), flush=True)
            continue
        if pid == 0:
            _child(request)
        print(json.dumps({"pid": pid}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
