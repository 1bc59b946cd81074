"""A fake VM's hosts: the startup script from the node's metadata, run as a local process group per host.

What differs from a real TPU VM is only in the environment: TRAINJOBS_SKIP_INSTALL (the agent comes from
this checkout, not the wheel), TRAINJOBS_METADATA_URL (the fake's metadata server for this host, in place
of metadata.google.internal), TRAINJOBS_LOCAL_DEVICES (CPU devices for the chips), and the storage
emulator the test or developer runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


class FakeHosts:
    def __init__(self, root: Path, script: str, hosts: int, devices_per_host: int, env: dict[str, str],
                 metadata_url: Callable[[int], str]):
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []
        root.mkdir(parents=True, exist_ok=True)
        (root / "startup-script").write_text(script)
        for task in range(hosts):
            disk = root / f"host-{task}"
            (disk / "tmp").mkdir(parents=True, exist_ok=True)
            host_env = {**os.environ, **env, "TRAINJOBS_SKIP_INSTALL": "1", "TRAINJOBS_METADATA_URL": metadata_url(task),
                        "TRAINJOBS_LOCAL_DEVICES": str(devices_per_host), "TRAINJOBS_PYTHON": sys.executable,
                        "TMPDIR": str(disk / "tmp"), "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
            host_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), host_env.get("PYTHONPATH")]))
            with (disk / "console.log").open("ab") as console:
                self.procs.append(subprocess.Popen(
                    ["bash", str(root / "startup-script")], cwd=disk, env=host_env, stdout=console,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))

    def signal(self, sig: int) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def stop(self, grace_s: float) -> None:
        """SIGTERM, as a VM shutdown sends, then SIGKILL after the grace period."""
        self.signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        self.signal(signal.SIGKILL)
        for p in self.procs:
            p.wait()
