"""The driver against races between what it reads and what it sees of the machine, played in a fixed
order by a stand-in cloud (no timing involved)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.support.worker import make_worker, path, submit, wait_for
from trainjobs.messages import AgentError, AgentReport, AgentState
from trainjobs.spec import JobSpec
from trainjobs.states import TERMINAL
from trainjobs.vm_metadata import LABEL_JOB
from worker.ports import MachineInfo, MachineRequest, MachineState


@dataclass
class AgentEndsBetweenLooks:
    """A Provisioner and JobChannel whose agent ends (writes its last status and exits, so its machine
    stops, as a local agent's process does) right after the driver, watching the running job, has read
    its status 'running' and before the driver looks at the machine."""

    ends_as: AgentState
    kind: str = "memory"
    running_reads: int = 0  # the first is the provisioning step's, the second the watching step's
    ended: bool = False
    machines: dict[str, MachineRequest] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def create(self, request: MachineRequest) -> MachineInfo:
        with self.lock:
            self.machines[request.name] = request
            return self._info(request)

    def get(self, request: MachineRequest) -> MachineInfo | None:
        with self.lock:
            if request.name not in self.machines:
                return None
            if self.running_reads >= 2:
                self.ended = True
            return self._info(request)

    def _info(self, request: MachineRequest) -> MachineInfo:
        return MachineInfo(request.name, MachineState.STOPPED if self.ended else MachineState.READY, request.labels)

    def delete(self, name: str) -> None:
        with self.lock:
            self.machines.pop(name, None)

    def list(self, labels: dict[str, str]) -> list[MachineInfo]:
        with self.lock:
            return [self._info(r) for r in self.machines.values() if labels.items() <= r.labels.items()]

    def job_dir(self, job_id: str) -> str:
        return f"mem://jobs/{job_id}"

    def prepare(self, job_id: str, attempt: int, spec: JobSpec, dataset_uri: str) -> None:
        pass

    def read_status(self, job_id: str, attempt: int) -> AgentReport | None:
        now = datetime.now(UTC)
        with self.lock:
            if self.ended:
                error = AgentError(type="RuntimeError", message="the model diverged") \
                    if self.ends_as == AgentState.FAILED else None
                return AgentReport(state=self.ends_as, attempt=attempt, heartbeat_at=now, progress=1.0, error=error)
            self.running_reads += 1
            return AgentReport(state=AgentState.RUNNING, attempt=attempt, heartbeat_at=now, progress=0.5)

    def request_stop(self, job_id: str, attempt: int, reason: str) -> None:
        pass

    def final_metrics(self, job_id: str) -> dict[str, Any] | None:
        return {"val_accuracy": 0.99}

    def artifact_manifest(self, job_id: str) -> list[dict[str, Any]] | None:
        return None


@dataclass
class AgentEndsBeforeItIsSeenRunning(AgentEndsBetweenLooks):
    """A short job: the machine is created, the agent has not reported yet, and by the driver's next
    provisioning step it has trained, written its last status and exited (its machine stopped): the
    driver never sees it running."""

    def create(self, request: MachineRequest) -> MachineInfo:
        with self.lock:
            self.machines[request.name] = request
            return MachineInfo(request.name, MachineState.CREATING, request.labels)

    def get(self, request: MachineRequest) -> MachineInfo | None:
        with self.lock:
            if request.name not in self.machines:
                return None
            self.ended = True  # the first look after create: the agent is done
            return self._info(request)

    def read_status(self, job_id: str, attempt: int) -> AgentReport | None:
        with self.lock:
            if not self.ended:
                return None  # the create step's read: nothing reported yet
        return super().read_status(job_id, attempt)


@pytest.mark.parametrize("ends_as", [AgentState.SUCCEEDED, AgentState.FAILED], ids=lambda s: s.value)
def test_an_agent_that_ends_before_the_driver_sees_it_running_ends_the_job_as_it_said(db, database_url,
                                                                                      running_workers, ends_as):
    """The same race one step earlier: the provisioning step found the machine stopped and moved the job
    to RECOVERING without reading the agent's last status (the job then recovered to SUCCEEDED, with a
    second machine and RECOVERING in its path)."""
    cloud = AgentEndsBeforeItIsSeenRunning(ends_as)
    w = make_worker(database_url, cloud, "w1")
    running_workers.append(w)
    w.start()
    [job_id] = submit(db)
    job = wait_for(db, job_id, TERMINAL)
    assert cloud.ended, "the race was played"
    if ends_as == AgentState.SUCCEEDED:
        # PROVISIONING -> SUCCEEDED is no transition: the job passes RUNNING, where the watch reads the end
        assert path(db, job_id) == ["QUEUED", "STAGING", "PROVISIONING", "RUNNING", "SUCCEEDED"]
    else:
        assert path(db, job_id) == ["QUEUED", "STAGING", "PROVISIONING", "FAILED"]
        assert "the model diverged" in (job.error or "")
    assert job.attempt == 1 and cloud.list({LABEL_JOB: str(job_id)}) == []


@pytest.mark.parametrize("ends_as", [AgentState.SUCCEEDED, AgentState.FAILED], ids=lambda s: s.value)
def test_an_agent_that_ends_as_its_machine_is_looked_at_ends_the_job_as_it_said(db, database_url, running_workers,
                                                                                ends_as):
    """The flake seen in CI: the status read said running, the machine (the agent's process) had stopped
    by the time the driver looked, and the job went RECOVERING before it SUCCEEDED."""
    cloud = AgentEndsBetweenLooks(ends_as)
    w = make_worker(database_url, cloud, "w1")
    running_workers.append(w)
    w.start()
    [job_id] = submit(db)
    job = wait_for(db, job_id, TERMINAL)
    assert cloud.ended, "the race was played"
    assert path(db, job_id) == ["QUEUED", "STAGING", "PROVISIONING", "RUNNING", ends_as.value.upper()]
    assert job.attempt == 1 and cloud.list({LABEL_JOB: str(job_id)}) == []
    if ends_as == AgentState.FAILED:
        assert "the model diverged" in (job.error or "")
