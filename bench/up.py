"""`trainjobs up` as the benchmarks run it: a process of its own for the whole run, on a database and a
GCS emulator the benchmark made, so what is timed is the jobs, not the stack's start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trainjobs.client.api import Client  # noqa: E402
from trainjobs.loopback import free_port  # noqa: E402


class TrainjobsUp:
    """`trainjobs up --provisioner local --concurrency N` on database `url`, its client in `.client`."""

    def __init__(self, url: str, scratch: Path, concurrency: int = 1) -> None:
        self.data_dir = Path(tempfile.mkdtemp(dir=scratch))
        env = {**os.environ, "TRAINJOBS_DATABASE_URL": url, "TRAINJOBS_HOME": str(self.data_dir),
               "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
        self.port = free_port()
        self.up = subprocess.Popen([sys.executable, "-m", "stack.cli", "up", "--port", str(self.port), "--data-dir",
                                    str(self.data_dir), "--provisioner", "local", "--concurrency", str(concurrency)],
                                   cwd=REPO, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                                   start_new_session=True)
        assert self.up.stderr is not None
        said = []
        for line in self.up.stderr:
            said.append(line)
            if line.strip() == "ready":
                break
        else:
            raise RuntimeError(f"trainjobs up exited {self.up.wait()}: {''.join(said[-20:])}")
        threading.Thread(target=lambda: [None for _ in self.up.stderr or []], daemon=True).start()
        key = json.loads((self.data_dir / "config.json").read_text())["api_key"]
        self.client = Client(f"http://127.0.0.1:{self.port}", key)

    def stop(self) -> None:
        if self.up.poll() is None:
            os.killpg(self.up.pid, signal.SIGTERM)
            self.up.wait(60)
