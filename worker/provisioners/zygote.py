"""The local provisioner's side of the agent zygote (worker/agent/zygote.py, which says why and how):
start it, ask it for agents, and fall back to plain processes when it cannot serve."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

log = logging.getLogger("trainjobs.worker")

READY = "ready"  # the zygote's first line, once its imports are done (worker/agent/zygote.py)


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
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "worker.agent.zygote"], env={**env, "OPENBLAS_NUM_THREADS": "1"},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, start_new_session=True)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def spawn(self, args: Sequence[str], env: Mapping[str, str], log_path: Path) -> int:
        """The pid of a new agent process running `python -m worker.agent ARGS` with `env`, its output
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
                assert self._proc.stdin is not None
                self._proc.stdin.write(json.dumps(request).encode() + b"\n")
                self._proc.stdin.flush()
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
        assert self._proc.stdout is not None
        stdout: IO[bytes] = self._proc.stdout
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append(stdout.readline()), daemon=True)
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
        try:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._log.close()
