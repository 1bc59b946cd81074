"""An agent run as the worker and staging would set it up, without them: a staged dataset, a job
directory, and `python -m agent` in its own process with TRAINJOBS_LOCAL_DEVICES=2, forked as the
local provisioner forks it (from a process that has imported TensorFlow: tests/support/agent_forker.py;
TRAINJOBS_TEST_AGENT_FORK=0 starts each as a process of its own)."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tests.support import eventually, scaled
from trainjobs import storage
from trainjobs.job_paths import DATASET_SHARDS, JobPaths, dataset_file, dataset_manifest, dataset_uri
from trainjobs.spec import JobSpec
from worker.local.zygote_client import end_server

REPO = Path(__file__).resolve().parents[2]
AGENT_S = 240  # how long one agent run may take, before scaling
AGENT_TIMEOUT_S = scaled(AGENT_S)


def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    # Shuffled: sklearn orders digits by writer, and the last writers are unlike the first.
    order = np.random.default_rng(0).permutation(len(d.target))
    return d.data[order].reshape(-1, 8, 8, 1).astype(np.float32), d.target[order].astype(np.int64)


def write_dataset(bucket: str, tmp: Path, x: np.ndarray, y: np.ndarray, num_classes: int, val: int, shards: int = 2,
                  task: str = "classification", strings: np.ndarray | None = None,
                  columns: list[dict[str, Any]] | None = None) -> str:
    """Write manifest + TFRecord shards the way staging does; return the dataset URI. A regression's y
    are float targets (num_classes is ignored), with the training split's mean and std. `strings` [n, k]
    and `columns` (the manifest's feature.columns, vocabularies included) make it a CSV's named columns."""
    import tensorflow as tf

    sha = uuid.uuid4().hex * 2
    uri = dataset_uri(sha, bucket)
    splits = {"train": (x[:-val], y[:-val], np.arange(len(y))[:-val]),
              "validation": (x[-val:], y[-val:], np.arange(len(y))[-val:])}
    regression = task == "regression"
    label: dict[str, Any] = {"key": "y", "dtype": "int64"}
    if regression:
        label = {"key": "y", "dtype": "float32", "shape": [1], "names": ["target"],
                 "mean": [float(np.mean(y[:-val]))], "std": [float(np.std(y[:-val]))]}
    manifest: dict[str, Any] = {
        "format_version": 1, "sha256": sha, "task": task, "num_classes": 0 if regression else num_classes,
        "class_names": [] if regression else [str(i) for i in range(num_classes)],
        "feature": {"key": "x", "shape": list(x.shape[1:]), "dtype": "float32",
                    **({"strings_key": "xs", "columns": columns} if columns else {})},
        "label": label, "splits": {},
    }
    for name, (xs, ys, at) in splits.items():
        n = shards if name == "train" else 1
        paths = [f"{DATASET_SHARDS}/{name}-{i:05d}-of-{n:05d}.tfrecord" for i in range(n)]
        for i, rel in enumerate(paths):
            local = tmp / rel
            local.parent.mkdir(parents=True, exist_ok=True)
            with tf.io.TFRecordWriter(str(local)) as w:
                for xi, yi, row in zip(xs[i::n], ys[i::n], at[i::n]):
                    feature = {
                        "x": tf.train.Feature(float_list=tf.train.FloatList(value=xi.ravel())),
                        "y": (tf.train.Feature(float_list=tf.train.FloatList(value=[float(yi)])) if regression
                              else tf.train.Feature(int64_list=tf.train.Int64List(value=[int(yi)]))),
                    }
                    if strings is not None:
                        feature["xs"] = tf.train.Feature(bytes_list=tf.train.BytesList(
                            value=[str(v).encode() for v in strings[row]]))
                    w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
            storage.blob(dataset_file(uri, rel)).upload_from_filename(str(local))
        manifest["splits"][name] = {"examples": len(ys), "shards": paths}
    storage.write_json(dataset_manifest(uri), manifest)
    return uri


def make_job(bucket: str, spec: dict[str, Any], dataset_uri: str, attempt: int = 1, job_id: str | None = None) -> str:
    job_id = job_id or str(uuid.uuid4())
    paths = JobPaths.for_job(job_id, bucket)
    validated = JobSpec.model_validate(spec)
    storage.write_json(paths.spec, {"job_id": job_id, "attempt": attempt, "spec": validated.model_dump(mode="json"),
                                    "dataset_uri": dataset_uri})
    return paths.root


def agent_env() -> dict[str, str]:
    return {**os.environ, "TRAINJOBS_LOCAL_DEVICES": "2", "TRAINJOBS_HEARTBEAT_S": "1", "PYTHONPATH": str(REPO)}


def start_agent(job_dir: str, **env: str) -> subprocess.Popen[bytes] | ForkedAgent:
    """`python -m agent --job-dir JOB_DIR`, its output (stdout and stderr) on `.stdout`."""
    args, full_env = ["--job-dir", job_dir], {**agent_env(), **env}
    if (forker := _shared_forker()) is not None:
        try:
            return forker.spawn(args, full_env, str(REPO))
        except ForkerUnavailable:
            pass
    return subprocess.Popen([sys.executable, "-m", "agent", *args], cwd=REPO, env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def run_agent(job_dir: str) -> tuple[int, str]:
    proc = start_agent(job_dir)
    out, _ = proc.communicate(timeout=AGENT_TIMEOUT_S)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


class ForkerUnavailable(RuntimeError):
    pass


class ForkedAgent:
    """What start_agent hands back for an agent the fork server started: the part of subprocess.Popen
    the tests use. Its output is drained as it comes, so an agent never blocks on a
    full pipe; `communicate` returns all of it."""

    def __init__(self, pid: int, output: int, ended: threading.Event, status: list[int]):
        self.pid, self.args = pid, ["agent", f"pid {pid}"]
        self.returncode: int | None = None
        self._ended, self._status = ended, status
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._drain, args=(output,), daemon=True)
        self._reader.start()

    def _drain(self, fd: int) -> None:
        with os.fdopen(fd, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                self._chunks.append(chunk)

    def poll(self) -> int | None:
        if self.returncode is None and self._ended.is_set():
            self.returncode = self._status[0]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.poll()  # type: ignore[return-value]

    def communicate(self, timeout: float | None = None) -> tuple[bytes, None]:
        self.wait(timeout)
        self._reader.join(timeout)  # EOF once the agent and whatever it started have closed the pipe
        if self._reader.is_alive():
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return b"".join(self._chunks), None

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: never signal a pid that may name another process by now
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class AgentForker:
    """The test process's side of tests/support/agent_forker.py: start it, ask it for agents, hear of
    their ends. Thread-safe."""

    def __init__(self, log_path: Path):
        self._lock = threading.Lock()
        self._replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self._ends: dict[int, tuple[threading.Event, list[int]]] = {}
        self._ready = False
        self._broken: str | None = None
        self._channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with log_path.open("ab") as log:
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "tests.support.agent_forker"], cwd=REPO,
                    env={**agent_env(), "OPENBLAS_NUM_THREADS": "1"}, stdin=theirs.fileno(), stdout=log, stderr=log)
            finally:
                theirs.close()
        threading.Thread(target=self._listen, daemon=True).start()

    @property
    def usable(self) -> bool:
        return self._broken is None and self._proc.poll() is None

    def _listen(self) -> None:
        while True:
            try:
                data = self._channel.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                self._replies.put({"error": "the agent fork server closed its channel"})
                return
            message = json.loads(data)
            if "exit" in message:  # always after its "pid": the server answers a fork before it reaps
                ended, status = self._ends[message["exit"]]
                status.append(int(message["rc"]))
                ended.set()
            else:
                if "pid" in message:  # new, even where the pid names an agent that ended before
                    self._ends[message["pid"]] = (threading.Event(), [])
                self._replies.put(message)

    def _reply(self, timeout: float) -> dict[str, Any]:
        try:
            return self._replies.get(timeout=timeout)
        except queue.Empty:
            raise ForkerUnavailable(f"no answer within {timeout:.0f}s") from None

    def spawn(self, args: list[str], env: dict[str, str], cwd: str) -> ForkedAgent:
        with self._lock:
            if not self.usable:
                raise ForkerUnavailable(self._broken or "the agent fork server exited")
            try:
                if not self._ready:
                    if "ready" not in (first := self._reply(AGENT_TIMEOUT_S)):
                        raise ForkerUnavailable(f"the agent fork server did not start: {first}")
                    self._ready = True
                read, write = os.pipe()
                try:
                    socket.send_fds(self._channel, [json.dumps({"args": args, "env": env, "cwd": cwd}).encode()],
                                    [write])
                finally:
                    os.close(write)
                reply = self._reply(60.0)
            except (OSError, ForkerUnavailable) as exc:
                self._broken = str(exc)
                raise ForkerUnavailable(self._broken) from exc
            if "pid" not in reply:
                os.close(read)
                raise ForkerUnavailable(f"the agent fork server could not fork: {reply.get('error')}")
            ended, status = self._ends[reply["pid"]]
            return ForkedAgent(reply["pid"], read, ended, status)

    def close(self) -> None:
        end_server(self._channel, self._proc, socket.SHUT_RDWR)  # its agents run on
        self._channel.close()


_forker: AgentForker | None = None
_forker_lock = threading.Lock()


def _shared_forker() -> AgentForker | None:
    """This test process's fork server, started at its first agent; a new one if the last broke."""
    global _forker
    if os.environ.get("TRAINJOBS_TEST_AGENT_FORK", "1") == "0":
        return None
    with _forker_lock:
        if _forker is None or not _forker.usable:
            if _forker is not None:
                _forker.close()
            _forker = AgentForker(Path(tempfile.gettempdir()) / "agent-forker.log")
        return _forker


def close_shared_forker() -> None:
    global _forker
    with _forker_lock:
        if _forker is not None:
            _forker.close()
            _forker = None


def read(uri: str) -> Any:
    """A JSON object the agent wrote (None if it has not): `uri` is one of its job's JobPaths."""
    return storage.read_json(uri)


def wait_for(predicate: Callable[[], Any], proc: subprocess.Popen[bytes], timeout: float = AGENT_S) -> None:
    """Until `predicate()` holds, the agent process still running."""

    def seen() -> Any:
        assert proc.poll() is None, f"agent exited ({proc.returncode}) before the awaited moment"
        return predicate()

    eventually(seen, timeout, "the awaited moment of the agent", every=0.1)


def spec(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "digits",
        "accelerator": {"type": "cpu", "replicas": 2},
        "dataset": {"source": "sklearn:digits"},
        "model": {"name": "mlp"},
        "training": {"epochs": 2, "per_replica_batch_size": 32, "learning_rate": 0.003},
    }
    return {**base, **overrides}


def train_on_two_workers(job_dir: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two agents of one job, one CPU device each, under TF_CONFIG as a multi-worker machine starts them;
    their last statuses (chief, the other) once both have exited 0."""
    from trainjobs.loopback import free_port

    cluster = {"worker": [f"localhost:{free_port()}", f"localhost:{free_port()}"]}
    procs = [start_agent(job_dir, TRAINJOBS_LOCAL_DEVICES="1",
                         TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}))
             for i in range(2)]
    outs = [p.communicate(timeout=AGENT_TIMEOUT_S)[0].decode(errors="replace") for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    return read(JobPaths(job_dir).status), read(JobPaths(job_dir).status_of(1))
