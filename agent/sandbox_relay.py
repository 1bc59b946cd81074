"""`python -m agent.sandbox_relay PLAN`: the first process in a local machine's sandbox
(worker/local/sandbox.py). It starts the machine's agents and relays the loopback port their
STORAGE_EMULATOR_HOST names to the storage guard's unix socket, the sandbox's one way out.

PLAN is JSON: {"relay": {"port": P, "socket": PATH} or null, "agents": [{"args", "env", "log_fd"}]}.
Each agent runs `python -m agent ARGS` with ENV, its output on LOG_FD, a descriptor the provisioner
opened on the machine's log outside the sandbox and bubblewrap passed in. All `workers: K` of a machine
share one sandbox: they are one job, and MultiWorkerMirroredStrategy's peers reach each other on the
sandbox's own loopback.

The relay stays until every agent has ended (a stopping agent's last status write goes through it), so
SIGTERM, which the provisioner sends to the machine's whole process group, does not end it. Then it ends
whatever the job left running (a daemon its code started in a session of its own, say): bubblewrap's init
waits for every process in the sandbox, and the machine would look alive until the provisioner's delete
ran out of patience and killed it. Everything here is the job's own: its code may stop the relay, and
loses only its own storage.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

from trainjobs.module_command import module_command

CHUNK = 1 << 16


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(CHUNK):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def _serve(client: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def relay(port: int, path: str) -> socket.socket:
    """Listen on 127.0.0.1:port and carry each connection to the unix socket at `path`, in threads."""
    listener = socket.create_server(("127.0.0.1", port))

    def accept() -> None:
        while True:
            client, _ = listener.accept()
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=_serve, args=(client, path), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener


def start_agent(agent: dict[str, Any]) -> subprocess.Popen[bytes]:
    log_fd = int(agent["log_fd"])
    return subprocess.Popen(module_command("agent", *agent["args"]), env=agent["env"],
                            stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd)


def end_the_rest() -> None:
    """SIGKILL every other process of the sandbox. Only as the sandbox's first process (pid 2, bubblewrap's
    init being 1) of a PID namespace of its own (--unshare-all): kill(-1) anywhere else would reach every
    process of the user."""
    if os.getpid() != 2 or os.getppid() != 1:
        return
    try:
        os.kill(-1, signal.SIGKILL)  # in a PID namespace: all of its processes but init and this one
    except ProcessLookupError:
        pass  # none left


def main(argv: list[str] | None = None) -> int:
    plan = json.loads((argv if argv is not None else sys.argv[1:])[0])
    # A handler, not SIG_IGN: the agents start with the default action (an ignored signal would be
    # inherited through exec, and the job's own code would never see its SIGTERM).
    signal.signal(signal.SIGTERM, lambda *_: None)
    if plan.get("relay"):
        relay(int(plan["relay"]["port"]), plan["relay"]["socket"])
    agents = [start_agent(a) for a in plan["agents"]]
    for a in plan["agents"]:
        os.close(int(a["log_fd"]))
    codes = [p.wait() for p in agents]
    end_the_rest()  # does nothing unless it is the first process of a PID namespace of its own
    return next((c for c in codes if c != 0), 0) & 0xFF


if __name__ == "__main__":
    sys.exit(main())
