"""The local provisioner's side of the agent zygote (agent/zygote.py, which says why and how):
start it, ask it for agents, and fall back to plain processes when it cannot serve.

Requests and replies travel over a unix socketpair, not pipes (issue 18). A pipe the worker holds can
be opened again by any process of the worker's user through /proc/<worker pid>/fd/N (the worker is
dumpable): a job's code could write spawn requests (an agent with any environment, the emulator's own
address included) or forge replies (a pid the worker would later signal as its agent's). A socket
cannot be opened through /proc at all (open(2) answers ENXIO, to root too), so the channel reaches
only the two processes that were handed its ends. Root can still take a copy of the fd with
pidfd_getfd(2) or ptrace the worker: against root, the local stand-in has no boundary.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO
from trainjobs.module_command import module_command

log = logging.getLogger("trainjobs.worker")

READY = "ready"  # the zygote's first line, once its imports are done (agent/zygote.py)


class ZygoteUnavailable(RuntimeError):
    pass


class Zygote:
    """The provisioner's side: start the zygote process, ask it for agents. Thread-safe."""

    def __init__(self, env: Mapping[str, str], log_path: Path, ready_timeout_s: float = 300.0):
        self._lock = threading.Lock()
        self._ready_timeout_s = ready_timeout_s
        self._ready = False
        self.forked = 0  # agents started through it
        self._broken: str | None = None
        self._log = log_path.open("ab")
        self._channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # The zygote's end is its stdin and stdout: it reads requests and writes replies as lines.
            self._proc = subprocess.Popen(
                module_command("agent.zygote"), env={**env, "OPENBLAS_NUM_THREADS": "1"},
                stdin=theirs.fileno(), stdout=theirs.fileno(), stderr=self._log, start_new_session=True)
        except BaseException:
            self._channel.close()
            self._log.close()
            raise
        finally:
            theirs.close()  # else the zygote would not see EOF when this end closes
        self._replies: IO[bytes] = self._channel.makefile("rb")

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def usable(self) -> bool:
        """Whether it may still serve: not broken, its process not ended."""
        return self._broken is None and self._proc.poll() is None

    @property
    def request_fd(self) -> int:
        """The descriptor, in this process, that requests are written to."""
        return self._channel.fileno()

    def spawn(self, args: Sequence[str], env: Mapping[str, str], log_path: Path) -> int:
        """The pid of a new agent process running `python -m agent ARGS` with `env`, its output
        appended to `log_path`. Waits for the zygote's imports the first time. ZygoteUnavailable if
        the zygote cannot (the caller starts the agent as a process of its own instead)."""
        with self._lock:
            if self._broken is not None:
                raise ZygoteUnavailable(self._broken)
            try:
                if not self._ready:
                    self._read_line(self._ready_timeout_s, expect=READY)
                    self._ready = True
                request = {"args": list(args), "env": dict(env), "log": str(log_path)}
                self._channel.sendall(json.dumps(request).encode() + b"\n")
                reply = json.loads(self._read_line(60.0))
            except (OSError, ValueError, ZygoteUnavailable) as exc:
                self._break(f"the agent zygote stopped answering: {exc}")
                raise ZygoteUnavailable(self._broken) from exc
            if "pid" not in reply:
                raise ZygoteUnavailable(f"the agent zygote could not fork: {reply.get('error')}")
            self.forked += 1
            return int(reply["pid"])

    def _read_line(self, timeout_s: float, expect: str | None = None) -> str:
        """The zygote's next line; ZygoteUnavailable if it exits or says nothing within timeout_s."""
        replies = self._replies
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append(replies.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        if reader.is_alive():
            raise ZygoteUnavailable(f"no answer within {timeout_s:.0f}s")
        line = got[0].decode().strip() if got else ""
        if not line:
            raise ZygoteUnavailable(f"it exited ({self._proc.wait()})")
        if expect is not None and line != expect:
            raise ZygoteUnavailable(f"it said {line[:200]!r}")
        return line

    def _break(self, reason: str) -> None:
        log.warning("%s; local agents start as processes of their own from now on", reason)
        self._broken = reason
        self.close()

    def close(self) -> None:
        """Ends the zygote (not the agents it forked)."""
        end_server(self._channel, self._proc, socket.SHUT_WR)
        self._replies.close()
        self._channel.close()
        self._log.close()


def end_server(channel: socket.socket, proc: subprocess.Popen[bytes], how: int) -> None:
    """Ends a server whose requests come over `channel` (the zygote, or the test suite's agent fork
    server): EOF on its end, then at most 10 s for it to exit before SIGKILL. What it forked runs on."""
    try:
        channel.shutdown(how)
    except OSError:
        pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
