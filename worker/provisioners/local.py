"""The local provisioner: the fake cloud. A "machine" is one agent process per worker host, started
with the same entry point a Cloud TPU VM runs, on CPU devices standing in for the accelerators.

Stand-in hardware: a request for N accelerators per host (a TPU slice's replicas, N GPUs, or N CPU
replicas) becomes N logical CPU devices (TRAINJOBS_LOCAL_DEVICES), capped at `devices`, so the
agent trains the requested strategy as MirroredStrategy over them. `workers: K` starts K processes
with TF_CONFIG on loopback ports: real MultiWorkerMirroredStrategy.

The inventory is a JSON file per machine under `root`, carrying labels like a cloud's: any worker
process on this host can list, adopt or delete what another (even a dead one) created.
"""

from __future__ import annotations

import builtins
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from trainjobs.ports import free_port
from worker.provisioner import MachineInfo, MachineRequest, MachineState, NoCapacity

REPO_ROOT = Path(__file__).resolve().parents[2]


class LocalProvisioner:
    kind = "local"

    def __init__(self, root: Path, devices: int = 8, slots: int = 2):
        self.root, self.devices, self.slots = root, devices, slots
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def create(self, request: MachineRequest) -> MachineInfo:
        with self._lock:
            if (existing := self._read(request.name)) is not None:
                return self._info(existing)
            busy = sum(1 for r in self._records() if self._alive(r))
            if busy >= self.slots:
                raise NoCapacity(f"all {self.slots} local machine slots are busy")
            record = self._launch(request)
            self._path(request.name).write_text(json.dumps(record))
            return self._info(record)

    def _launch(self, request: MachineRequest) -> dict:
        spec = request.spec
        devices = max(1, min(spec.replicas_per_worker, self.devices))
        hosts = spec.workers
        ports = [free_port() for _ in range(hosts)] if hosts > 1 else []
        logs = self.root / request.name
        logs.mkdir(exist_ok=True)
        pids = []
        for task in range(hosts):
            env = {**os.environ, "TRAINJOBS_LOCAL_DEVICES": str(devices), "PYTHONUNBUFFERED": "1",
                   "TF_CPP_MIN_LOG_LEVEL": "2"}
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
            if ports:
                env["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                                               "task": {"type": "worker", "index": task}})
            with (logs / f"task-{task}.log").open("ab") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "worker.agent", "--job-dir", request.job_dir, "--task-index", str(task),
                     "--work-dir", str(logs / f"disk-{task}")],
                    env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True,  # its own process group: delete kills the whole machine
                )
            pids.append(proc.pid)
            threading.Thread(target=proc.wait, daemon=True).start()  # reap, so an exited agent is not a zombie
        return {"name": request.name, "labels": request.labels, "pids": pids, "devices": devices,
                "created": time.time(), "logs": str(logs)}

    def get(self, name: str) -> MachineInfo | None:
        record = self._read(name)
        return self._info(record) if record else None

    def delete(self, name: str) -> None:
        record = self._read(name)
        if record is None:
            return
        for pid in record["pids"]:
            _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10  # the agent's grace period to flush its status
        while any(_pid_alive(p) for p in record["pids"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in record["pids"]:
            _signal_group(pid, signal.SIGKILL)
        self._path(name).unlink(missing_ok=True)
        shutil.rmtree(record["logs"], ignore_errors=True)  # the machine's disk goes with it, as a VM's does

    def list(self, labels: dict[str, str]) -> builtins.list[MachineInfo]:
        return [self._info(r) for r in self._records() if labels.items() <= r["labels"].items()]

    # --- inventory ---

    def _path(self, name: str) -> Path:
        return self.root / f"{name}.json"

    def _read(self, name: str) -> dict | None:
        try:
            record: dict = json.loads(self._path(name).read_text())
            return record
        except FileNotFoundError:
            return None

    def _records(self) -> builtins.list[dict]:
        out = []
        for p in self.root.glob("*.json"):
            try:
                out.append(json.loads(p.read_text()))
            except (OSError, ValueError):
                continue  # being written or deleted right now
        return out

    def _alive(self, record: dict) -> bool:
        return all(_pid_alive(p) for p in record["pids"])

    def _info(self, record: dict) -> MachineInfo:
        # A local machine is "up" while its agent processes run; once they exit it is STOPPED, like a
        # VM whose startup script ended. The worker reads success or failure from GCS, not from here.
        state = MachineState.READY if self._alive(record) else MachineState.STOPPED
        return MachineInfo(record["name"], state, record["labels"], detail=f"logs in {record['logs']}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
