"""An in-memory cloud for tests: machines boot, "train" on a timer and report like an agent would.

Tests steer it: `fail_next`, `killed_next`, `preempt(name)`, and timings. It is both the Provisioner and the
JobChannel, because its fake agents live inside it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from trainjobs.messages import AgentError, AgentReport, AgentState
from trainjobs.spec import JobSpec
from worker.ports import MachineInfo, MachineRequest, MachineState


@dataclass
class _FakeMachine:
    request: MachineRequest
    created: float
    state: MachineState = MachineState.CREATING
    fail: str | None = None
    retry: bool = False  # its failure is one the agent reports for the machine's reason


@dataclass
class MemoryCloud:
    boot_s: float = 0.05
    train_s: float = 0.2
    kind: str = "memory"
    fail_next: list[str] = field(default_factory=list)  # error messages for the next agents
    # ... for the next agents whose program a signal killed (reported with AgentError.retry), taken first
    killed_next: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)  # every machine name ever created, in order
    stop_requests: list[tuple[str, int, str]] = field(default_factory=list)  # (job, up to attempt, reason)
    _machines: dict[str, _FakeMachine] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # --- Provisioner ---
    def create(self, request: MachineRequest) -> MachineInfo:
        with self._lock:
            if request.name not in self._machines:
                retry = bool(self.killed_next)
                fail = self.killed_next.pop(0) if retry else self.fail_next.pop(0) if self.fail_next else None
                self._machines[request.name] = _FakeMachine(request, time.monotonic(), fail=fail, retry=retry)
                self.created.append(request.name)
            return self._info(self._machines[request.name])

    def get(self, request: MachineRequest) -> MachineInfo | None:
        with self._lock:
            m = self._machines.get(request.name)
            return self._info(m) if m else None

    def delete(self, name: str) -> None:
        with self._lock:
            self._machines.pop(name, None)

    def list(self, labels: dict[str, str]) -> list[MachineInfo]:
        with self._lock:
            return [self._info(m) for m in self._machines.values() if labels.items() <= m.request.labels.items()]

    def preempt(self, name: str) -> None:
        with self._lock:
            self._machines[name].state = MachineState.PREEMPTED

    def _info(self, m: _FakeMachine) -> MachineInfo:
        if m.state == MachineState.CREATING and time.monotonic() - m.created >= self.boot_s:
            m.state = MachineState.READY
        return MachineInfo(m.request.name, m.state, m.request.labels)

    # --- JobChannel ---
    def job_dir(self, job_id: str) -> str:
        return f"mem://jobs/{job_id}"

    def prepare(self, job_id: str, attempt: int, spec: JobSpec, dataset_uri: str) -> None:
        pass

    def read_status(self, job_id: str, attempt: int) -> AgentReport | None:
        with self._lock:
            m = next((m for m in self._machines.values()
                      if m.request.job_id == job_id and m.request.attempt == attempt), None)
            if m is None:
                return None
            self._info(m)
            if m.state != MachineState.READY:
                return None
            elapsed = time.monotonic() - m.created - self.boot_s
            now = datetime.now(UTC)
            if m.fail:
                return AgentReport(state=AgentState.FAILED, attempt=attempt, heartbeat_at=now,
                                   error=AgentError(type="ProgramKilled" if m.retry else "RuntimeError",
                                                    message=m.fail, retry=m.retry))
            if elapsed < self.train_s:
                return AgentReport(state=AgentState.RUNNING, attempt=attempt, heartbeat_at=now,
                                   progress=elapsed / self.train_s,
                                   runtime={"strategy": m.request.spec.resolved_strategy})
            return AgentReport(state=AgentState.SUCCEEDED, attempt=attempt, heartbeat_at=now, progress=1.0,
                               metrics={"val_accuracy": 0.99})

    def request_stop(self, job_id: str, attempt: int, reason: str) -> None:
        with self._lock:
            self.stop_requests.append((job_id, attempt, reason))

    def final_metrics(self, job_id: str) -> dict[str, Any] | None:
        return {"val_accuracy": 0.99}

    def artifact_manifest(self, job_id: str) -> None:
        return None

    def history(self, job_id: str) -> None:
        return None  # its fake agents record no epochs


def memory_stager(spec: JobSpec, job_id: str, *, project_id: str, should_stop: Callable[[], bool] = lambda: False) -> str:
    if spec.dataset is None:
        return ""  # a program job without data: nothing staged
    return f"mem://datasets/{abs(hash(spec.dataset.source))}"
