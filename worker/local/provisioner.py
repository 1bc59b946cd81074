"""The local provisioner: the fake cloud. A "machine" is one agent process per worker host, started
with the same entry point a Cloud TPU VM runs, on CPU devices standing in for the accelerators.

Stand-in hardware: a request for N accelerators per host (a TPU slice's replicas, N GPUs, or N CPU
replicas) becomes N logical CPU devices (TRAINJOBS_LOCAL_DEVICES), capped at `devices`, so the
agent trains the requested strategy as MirroredStrategy over them. `workers: K` starts K processes
with TF_CONFIG on loopback ports: real MultiWorkerMirroredStrategy.

The inventory is a JSON file per machine under `root`, carrying labels like a cloud's: any worker
process on this host can list, adopt or delete what another (even a dead one) created. The file is
written before anything of the machine starts and again as each process starts (its pid and start
time), so a worker killed halfway leaves a record that names what it started; delete also stops any
process still writing into the machine's directory, which covers the instant between a process's
start and the record of it, and signals a recorded pid only while it is the same process (its start
time), never one the kernel has since given the pid to.

Each machine runs in a bubblewrap sandbox of its own where the host allows it (worker/local/sandbox.py:
its own files, processes and storage guard only; TRAINJOBS_LOCAL_SANDBOX). Without the sandbox, agents are
forked from a zygote that has imported TensorFlow, Keras and the agent once (`agent/zygote.py`), or
started as processes of their own if it cannot serve (TRAINJOBS_LOCAL_ZYGOTE=0 turns it off), and the
host runs the jobs of the one project the operator names, unless it trusts them all (worker/local/host_claim.py).
Requirement environments (agent/requirements.py) are cached per project, never shared between projects.

What a job's code reaches: an environment built from an allow-list (`agent_environment`), and
storage only inside the job's boundary (`worker/boundary/access.py`): through a storage guard
process per machine in front of the emulator, or with a downscoped token the worker keeps fresh
in a file when the bucket is real. Both go when the machine is deleted. Unsandboxed, the processes
run as the worker's OS user; README "Security" says what that leaves open.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from trainjobs import storage
from trainjobs.loopback import free_port
from trainjobs.module_command import module_command
from trainjobs.source_rules import DataAccessRules
from trainjobs.stop_request import term_grace_s
from trainjobs.vm_metadata import LABEL_JOB
from worker.boundary import storage_guard
from worker.boundary.access import JobBoundary
from worker.boundary.tokens import TokenFileRefresher, downscoped_minter
from worker.boundary.guard_refusals import RefusalForwarder
from worker.ports import MachineInfo, MachineRefused, MachineRequest, MachineState, NoCapacity
from worker.local import sandbox
from worker.local.host_claim import HostClaimed, check_host
from worker.local.processes import pid_alive, same_process, signal_group, start_time, writing_into
from worker.local.sandbox import AgentLaunch, LocalIsolation
from worker.local.zygote_client import Zygote, ZygoteUnavailable

REPO_ROOT = Path(__file__).resolve().parents[2]
log = logging.getLogger("trainjobs.worker")

# What an agent inherits from the worker's environment. Everything else stays behind: the database
# URL, API keys, cloud credentials, whatever the worker was started with.
INHERITED = frozenset({"PATH", "HOME", "LANG", "TZ", "TRAINJOBS_HEARTBEAT_S", "TRAINJOBS_GCP_PROJECT",
                       "TRAINJOBS_WATCHDOG_EVERY_S", "TRAINJOBS_WATCHDOG_UNREACHABLE_S", "TRAINJOBS_TERM_GRACE_S"})
INHERITED_PREFIXES = ("LC_", "TF_")
NOT_INHERITED = frozenset({"TF_CONFIG"})  # the provisioner writes the cluster a machine is part of


DELETE_MARGIN_S = 5.0  # after the agents' own grace (trainjobs.stop_request.term_grace_s, which they inherit)


def agent_environment(worker_env: Mapping[str, str], **settings: str) -> dict[str, str]:
    """An agent's environment: the allow-listed part of the worker's, the repository on PYTHONPATH,
    and `settings` (the machine's devices, its storage endpoint or token file, TF_CONFIG)."""
    env = {k: v for k, v in worker_env.items()
           if (k in INHERITED or k.startswith(INHERITED_PREFIXES)) and k not in NOT_INHERITED}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), worker_env.get("PYTHONPATH")]))
    return {**env, **settings}


def start_agent_zygote(log_path: Path) -> Zygote:
    """A zygote for local agents, from this process's allow-listed environment (each agent gets its
    machine's own in its spawn request)."""
    return Zygote(agent_environment(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2",
                                    TRAINJOBS_METADATA_URL="off"), log_path)


class LocalProvisioner:
    kind = "local"

    def __init__(self, root: Path, devices: int = 8, slots: int = 2, zygote: Zygote | None = None,
                 isolation: LocalIsolation | None = None):
        """`zygote`: one that outlives this provisioner, which then neither starts one nor closes it (the
        test suite's processes share one across their stacks); by default each provisioner has its own.
        `isolation`: by default from TRAINJOBS_LOCAL_SANDBOX and TRAINJOBS_LOCAL_TRUSTED (probed here, once)."""
        self.root, self.devices, self.slots = root, devices, slots
        self.root.mkdir(parents=True, exist_ok=True)
        self.isolation = isolation if isolation is not None else LocalIsolation.from_env()
        self._lock = threading.Lock()
        self._tokens: dict[str, TokenFileRefresher] = {}  # machine name -> its token file's refresher
        self._zygote: Zygote | None = zygote  # started by start_zygote, or with the first machine
        self._owns_zygote = zygote is None
        self._forked = 0
        self._refusals = RefusalForwarder()  # the guards' refusals, into this worker's log

    def create(self, request: MachineRequest) -> MachineInfo:
        with self._lock:
            if (existing := self._read(request.name)) is not None:
                return self._info(existing)
            if not (self.isolation.sandbox or self.isolation.trusted):
                try:
                    check_host(self.root, request.project_id)
                except HostClaimed as exc:
                    raise MachineRefused(str(exc)) from None
            busy = sum(1 for r in self._records() if self._alive(r))
            if busy >= self.slots:
                raise NoCapacity(f"all {self.slots} local machine slots are busy")
            record = self._launch(request)
            return self._info(record)

    def _launch(self, request: MachineRequest) -> dict:
        spec = request.spec
        devices = max(1, min(spec.replicas_per_worker, self.devices))
        hosts = spec.workers
        ports = [free_port() for _ in range(hosts)] if hosts > 1 else []
        logs = self.root / request.name
        logs.mkdir(exist_ok=True)
        record: dict = {"name": request.name, "labels": request.labels, "devices": devices, "created": time.time(),
                        "logs": str(logs), "pids": [], "started": {}, "starting": True}
        self._save(record)  # before anything starts: a worker killed from here on leaves this to delete by
        try:
            storage_env = self._storage_access(request.name, request.storage_boundary(), logs, record)
            if "guard_pid" in record:
                self._note_started(record, record["guard_pid"])
            self._start_agents(request, devices, ports, logs, storage_env, record)
        except BaseException:
            for pid in record["pids"]:
                signal_group(pid, signal.SIGKILL)
            self._stop_storage_access(request.name, record)
            self._path(request.name).unlink(missing_ok=True)
            raise
        record["starting"] = False
        self._save(record)
        return record

    def project_cache(self, project_id: str | None) -> Path:
        """The requirements cache of one project's jobs on this host (issue 36, finding 7): a job runs an
        environment only its own project's jobs could have written (in the sandbox, the only cache it sees)."""
        tenant = hashlib.sha256((project_id or "").encode()).hexdigest()[:32]
        return self.root / "cache" / tenant

    def _start_agents(self, request: MachineRequest, devices: int, ports: list[int], logs: Path,
                      storage_env: dict[str, str], record: dict) -> None:
        cache = self.project_cache(request.project_id)
        cache.mkdir(parents=True, exist_ok=True)
        agents = []
        for task in range(request.spec.workers):
            # No metadata server here: the watchdog stops the process and has no node to delete.
            env = agent_environment(os.environ, TRAINJOBS_LOCAL_DEVICES=str(devices), PYTHONUNBUFFERED="1",
                                    TF_CPP_MIN_LOG_LEVEL="2", TRAINJOBS_METADATA_URL="off",
                                    TRAINJOBS_CACHE_DIR=str(cache), **storage_env)
            if ports:
                env["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                                               "task": {"type": "worker", "index": task}})
            disk = logs / f"disk-{task}"
            disk.mkdir(exist_ok=True)
            args = ["--job-dir", request.job_dir, "--task-index", str(task), "--work-dir", str(disk)]
            agents.append(AgentLaunch(args, env, logs / f"task-{task}.log", disk))
        if self.isolation.sandbox:
            self._start_sandbox(agents, logs, cache, record)
            return
        for agent in agents:
            if (pid := self._fork_agent(agent.args, agent.env, agent.log)) is not None:
                self._note_started(record, pid, agent=True)
                continue
            with agent.log.open("ab") as out:
                proc = subprocess.Popen(
                    module_command("agent", *agent.args),
                    env=agent.env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True,  # its own process group: delete kills the whole machine
                )
            self._note_started(record, proc.pid, agent=True)
            threading.Thread(target=proc.wait, daemon=True).start()  # reap, so an exited agent is not a zombie

    def _start_sandbox(self, agents: list[AgentLaunch], logs: Path, cache: Path, record: dict) -> None:
        """All of the machine's agents in one sandbox (one job: its workers share its loopback). With the
        emulator, the sandbox has no network but its storage guard's socket; a real bucket needs the
        internet, so there it shares the host's network (its files and processes stay its own)."""
        guard = None
        if "guard_port" in record:
            guard = (logs / storage_guard.UNIX_SOCKET, int(record["guard_port"]))
        readable = [Path(record["token_file"]).parent] if "token_file" in record else []
        # The host folders the operator lets every project name (a requirement's file:// wheel), read-only.
        readable += [d for d in DataAccessRules.from_env().host_dirs if d.is_dir()]
        if guard is not None:  # its agents reach nothing but the guard: pip asks no index (agent/requirements.py)
            for agent in agents:
                agent.env["TRAINJOBS_MACHINE_NETWORK"] = "storage-only"
        proc = sandbox.start_machine(agents, machine_dir=logs, writable=[*(a.disk for a in agents), cache],
                                     readable=readable, guard=guard, network=guard is None)
        self._note_started(record, proc.pid, agent=True)
        threading.Thread(target=proc.wait, daemon=True).start()

    def _fork_agent(self, args: list[str], env: dict[str, str], log_path: Path) -> int | None:
        """An agent forked by the zygote (zygote.py), which has imported TensorFlow already; None when
        there is none (TRAINJOBS_LOCAL_ZYGOTE=0, or it failed), and the agent starts on its own."""
        if (zygote := self.start_zygote()) is None:
            return None
        try:
            pid = zygote.spawn(args, env, log_path)
        except ZygoteUnavailable:
            return None
        self._forked += 1
        return pid

    def start_zygote(self) -> Zygote | None:
        """The zygote, started now if it is not yet (it imports in the background; the first spawn waits
        for it). `trainjobs up` and `worker` call this at start (issue 24): the imports then overlap the
        wait for a first job, its upload and staging, instead of adding 4-6 CPU-s to its machine's start."""
        if self.isolation.sandbox:
            return None  # a forked agent would run outside the sandbox: each machine starts a fresh one in it
        if self._zygote is None and os.environ.get("TRAINJOBS_LOCAL_ZYGOTE", "1") != "0":
            self._zygote = start_agent_zygote(self.root / "zygote.log")
        return self._zygote

    @property
    def forked_agents(self) -> int:
        """How many of this provisioner's agents the zygote started (the rest started as processes of their own)."""
        return self._forked

    def close(self) -> None:
        """Ends the zygote, if it started one; machines and their agents are left as they are."""
        self._refusals.close()
        if self._zygote is not None and self._owns_zygote:
            self._zygote.close()

    def _storage_access(self, name: str, boundary: JobBoundary, machine_dir: Path, record: dict) -> dict[str, str]:
        """Start what lets this machine reach its job's storage and nothing more; return the agent's
        environment for it. Notes in `record` what delete must stop."""
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        if emulator:
            pid, port = storage_guard.launch(boundary, emulator, machine_dir, env=agent_environment(os.environ),
                                             unix_socket=self.isolation.sandbox)
            record.update(guard_pid=pid, guard_port=port)
            self._refusals.watch(name, machine_dir, _job_of(record))
            return {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"}
        # In a directory of its own, which a sandbox binds read-only: the refresher replaces the file.
        (machine_dir / "credentials").mkdir(exist_ok=True)
        token_file = machine_dir / "credentials" / "storage-token.json"
        record.update(token_file=str(token_file), boundary=boundary.to_json())
        self._refresh_token(name, token_file, boundary)
        return {storage.TOKEN_FILE_ENV: str(token_file)}

    def _stop_storage_access(self, name: str, record: dict) -> None:
        if "guard_pid" in record:
            signal_group(record["guard_pid"], signal.SIGKILL)
        # What its guard refused, if it had one, into our log before the machine's directory goes.
        self._refusals.finish(name, Path(record["logs"]), _job_of(record))
        if (refresher := self._tokens.pop(name, None)) is not None:
            refresher.stop()

    def _refresh_token(self, name: str, token_file: Path, boundary: JobBoundary) -> None:
        refresher = TokenFileRefresher(token_file, downscoped_minter(boundary))
        refresher.start()
        self._tokens[name] = refresher

    def get(self, request: MachineRequest) -> MachineInfo | None:
        name = request.name
        record = self._read(name)
        if record and "token_file" in record and name not in self._tokens and self._alive(record):
            # Adopted from a worker that died: its token file has no one keeping it fresh. The boundary
            # is the request's (from the job's row), not one read back from the machine's record.
            with self._lock:
                if name not in self._tokens:
                    self._refresh_token(name, Path(record["token_file"]), request.storage_boundary())
        if record and "guard_pid" in record and not self._refusals.watching(name) and self._alive(record):
            self._refusals.watch(name, Path(record["logs"]), _job_of(record))  # adopted
        return self._info(record) if record else None

    def delete(self, name: str) -> None:
        record = self._read(name)
        if record is None:
            return
        guard = record.get("guard_pid")
        if guard is not None and not same_process(record, guard):
            del record["guard_pid"]  # gone, and its pid may be another process's by now
        # The recorded agents that are still themselves, and whatever else writes into the machine's
        # directory (an agent or guard started by a worker killed before it could record the pid).
        agents = {p for p in record["pids"] if same_process(record, p)}
        agents |= set(writing_into(Path(record["logs"]))) - {record.get("guard_pid")}
        started = {pid: start_time(pid) for pid in agents}
        for pid in agents:
            signal_group(pid, signal.SIGTERM)
        # As long as an agent gives its own cleanup (it exits by then whatever storage does), and a
        # little more: a fixed 10 s here used to cut a loaded agent off before its last status write.
        deadline = time.monotonic() + term_grace_s() + DELETE_MARGIN_S
        while any(pid_alive(p) for p in agents) and time.monotonic() < deadline:
            time.sleep(0.1)
        if left := sorted(p for p in agents if pid_alive(p)):
            # An agent killed here may not have written its last status: say so, status.json cannot (issue 19).
            log.warning("machine %s: process(es) %s still running %.0fs after SIGTERM; killing them",
                        name, left, term_grace_s() + DELETE_MARGIN_S)
        for pid in agents:
            now = start_time(pid)
            if now is not None and now != started[pid]:
                continue  # it ended in the grace and its pid is another process's by now: not ours to kill
            signal_group(pid, signal.SIGKILL)
        self._stop_storage_access(name, record)  # after the agents' last words: their final status needs it
        self._path(name).unlink(missing_ok=True)
        _remove_tree(Path(record["logs"]))  # the machine's disk goes with it, as a VM's does

    def list(self, labels: dict[str, str]) -> builtins.list[MachineInfo]:
        return [self._info(r) for r in self._records() if labels.items() <= r["labels"].items()]

    # --- inventory ---

    def _path(self, name: str) -> Path:
        return self.root / f"{name}.json"

    def _save(self, record: dict) -> None:
        # Whole or not at all (a reader never sees half a record): written aside, then renamed over.
        path = self._path(record["name"])
        partial = path.with_suffix(".json.partial")
        partial.write_text(json.dumps(record))
        os.replace(partial, path)

    def _note_started(self, record: dict, pid: int, agent: bool = False) -> None:
        """Record a process of the machine the moment it has started, with its start time."""
        record["started"][str(pid)] = start_time(pid)
        if agent:
            record["pids"].append(pid)
        self._save(record)

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
        # A machine whose start was cut off (its worker died) never runs its job: not alive.
        return not record.get("starting") and all(pid_alive(p) and same_process(record, p) for p in record["pids"])

    def _info(self, record: dict) -> MachineInfo:
        # A local machine is "up" while its agent processes run; once they exit it is STOPPED, like a
        # VM whose startup script ended. The worker reads success or failure from GCS, not from here.
        state = MachineState.READY if self._alive(record) else MachineState.STOPPED
        return MachineInfo(record["name"], state, record["labels"], detail=f"logs in {record['logs']}")


def _remove_tree(path: Path) -> None:
    """rmtree, and `rm -rf` where a job's folders nest deeper than Python 3.11's recursive rmtree can go
    (a few thousand levels raise RecursionError, which ignore_errors does not catch): the disk never stays."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    except RecursionError:
        subprocess.run(["rm", "-rf", "--", str(path)], check=False, stdin=subprocess.DEVNULL, timeout=600)


def _job_of(record: dict) -> str:
    """The job a machine runs, as the worker labelled it (a machine made by hand: its name)."""
    return str(record["labels"].get(LABEL_JOB, record["name"]))
