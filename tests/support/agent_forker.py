"""The test suite's agent fork server: a process that imports TensorFlow, Keras and the agent once (as
agent/zygote.py does for the local provisioner) and forks each agent a test starts with
tests/support/agent.py's start_agent or run_agent.

The suite started some fifty agents as fresh `python -m agent` processes, each importing TensorFlow
again: about 6 CPU-s apiece on two cores, a sixth of the suite's CPU. A forked agent runs the same
`agent.__main__.main` with the same arguments, environment and working directory, in a process that
already holds the imports, exactly as the local provisioner's agents do.

What a test gets back behaves as the subprocess.Popen it used to (ForkedAgent in tests/support/agent.py):
its pid, its output (stdout and stderr on one pipe, as Popen's stdout=PIPE, stderr=STDOUT), its exit
status (a negative signal number when a signal ended it), signals. The product's zygote cannot give
an exit status (the kernel reaps its children, and the provisioner reads the agent's status instead);
this server is the agents' parent and reaps them itself, so it can.

Protocol, over a SOCK_SEQPACKET unix socket that is the server's stdin (fd 0), one JSON message per
packet: the server sends {"ready": pid} once its imports are done. A request is {"args", "env", "cwd"}
with one descriptor attached (the write end of the agent's output pipe); the answer is {"pid"} or
{"error"}. When an agent ends, the server sends {"exit": pid, "rc": status}. EOF ends the server; the
agents it forked run on.

Only the test process that started it holds the other end (a socketpair). Test-only: nothing of the
product starts it.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import selectors
import signal
import socket
import sys
from typing import Any, NoReturn

from agent.zygote import PRELOAD, become_agent


def _child(request: dict[str, Any], out: int, closing: list[int]) -> NoReturn:
    """In the forked child: become `python -m agent ARGS` in the request's directory, its output on `out`."""

    def prepare() -> None:
        signal.set_wakeup_fd(-1)
        for fd in closing:
            os.close(fd)
        os.chdir(request["cwd"])

    become_agent(request["args"], request["env"], lambda: out, prepare)


def _send(channel: socket.socket, message: dict[str, Any]) -> None:
    channel.send(json.dumps(message).encode())


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the test run ends it by EOF
    for name in PRELOAD:
        importlib.import_module(name)
    if (threads := len(os.listdir("/proc/self/task"))) != 1:
        print(f"{threads} threads after the imports: forking is not safe", file=sys.stderr, flush=True)
        return 1
    gc.collect()
    gc.freeze()
    channel = socket.socket(fileno=0)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd says a child ended
    selector = selectors.DefaultSelector()
    selector.register(channel, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    _send(channel, {"ready": os.getpid()})
    while True:
        for key, _ in selector.select():
            if key.fd == wake_r:
                while True:
                    try:
                        if not os.read(wake_r, 512):
                            break
                    except BlockingIOError:
                        break
                _reap(channel)
                continue
            data, fds, _, _ = socket.recv_fds(channel, 1 << 20, 1)
            if not data:
                return 0
            try:
                request = json.loads(data)
                if len(fds) != 1:
                    raise ValueError(f"a request carries one descriptor, not {len(fds)}")
                pid = os.fork()
            except (ValueError, OSError) as exc:
                for fd in fds:
                    os.close(fd)
                _send(channel, {"error": str(exc)})
                continue
            if pid == 0:
                _child(request, fds[0], [wake_r, wake_w])
            os.close(fds[0])
            _send(channel, {"pid": pid})
        _reap(channel)


def _reap(channel: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(channel, {"exit": pid, "rc": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    sys.exit(main())
