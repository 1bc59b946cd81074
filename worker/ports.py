"""The ports between the worker and the outside world. Imports no cloud SDK and nothing heavy.

- `Provisioner`: creates, inspects, lists and deletes the machine a job trains on (Cloud TPU VM,
  GPU VM, a local process, or memory in tests). Each cloud's own state names are mapped onto
  `MachineState` inside its module, and only there.
- `JobChannel`: how the worker hands a job to the agent on that machine and hears back from it
  (GCS objects in production and locally; memory in tests). The worker learns what training is
  doing only through this, never through a process handle, exactly as it would with a real VM.
- `Stager`: pushes a job's dataset to where the machine reads it; raises `DatasetError` for bad data.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any, Protocol

from trainjobs.messages import AgentReport
from trainjobs.spec import JobSpec
from trainjobs.vm_metadata import LABEL_ATTEMPT, LABEL_JOB, LABEL_MANAGED
from worker.boundary.access import JobBoundary



class MachineState(str, enum.Enum):
    CREATING = "CREATING"  # requested, booting
    READY = "READY"  # up; the agent runs on it
    PREEMPTED = "PREEMPTED"  # the cloud took it back (spot / preemptible)
    STOPPED = "STOPPED"  # exists but not running (agent exited, VM terminated or failed)
    DELETING = "DELETING"


@dataclass(frozen=True)
class MachineRequest:
    job_id: str
    attempt: int
    spec: JobSpec
    job_dir: str  # where the agent finds spec.json and writes status (gs://... or mem://...)
    # What the machine's code may reach in storage. The driver computes it from the job's row
    # (worker/boundary/access.job_boundary), never from anything the machine or the job wrote.
    boundary: JobBoundary | None = None
    # The job's project, from its row: whose tenant the machine's code is (a local host keeps projects
    # apart by it: worker/local/sandbox.py, host_claim.py). None for a machine asked for by hand.
    project_id: str | None = None

    @property
    def name(self) -> str:
        # Deterministic per (job, attempt): creating twice is idempotent, and a new owner finds it.
        return f"tj-{self.job_id.replace('-', '')[:20]}-a{self.attempt}"

    @property
    def labels(self) -> dict[str, str]:
        return {**self.spec.labels, LABEL_MANAGED: "true", LABEL_JOB: self.job_id, LABEL_ATTEMPT: str(self.attempt)}

    def storage_boundary(self) -> JobBoundary:
        """The boundary, for a provisioner that gives the machine storage access: a request without one
        gets none (no provisioner falls back to reading it from storage)."""
        if self.boundary is None:
            raise ValueError(f"the request for {self.name} carries no storage boundary")
        return self.boundary


@dataclass(frozen=True)
class MachineInfo:
    name: str
    state: MachineState
    labels: dict[str, str] = field(default_factory=dict)
    detail: str | None = None  # the provider's own words (e.g. a health description)
    # Queued until the cloud has capacity for it (a TPU queued resource): no boot clock runs yet; the
    # queue's own limit ends the wait.
    waiting_for_capacity: bool = False
    refused: str | None = None  # the cloud gave up on this machine for good (e.g. the capacity wait ran out): why


class Provisioner(Protocol):
    kind: str  # "memory", "local", "cloud-tpu", "compute-engine"

    def create(self, request: MachineRequest) -> MachineInfo:
        """Create the machine and start the agent on it. Idempotent for the same request.name."""
        ...

    def get(self, request: MachineRequest) -> MachineInfo | None:
        """The liveness of the request's machine, or None if it does not exist. A machine this process
        did not create (a dead worker's, adopted) gets what it needs from the request (its storage
        boundary), never from what the machine holds."""
        ...

    def delete(self, name: str) -> None:
        """Tear it down. Idempotent: deleting a missing machine is fine."""
        ...

    def list(self, labels: dict[str, str]) -> list[MachineInfo]:
        """Machines carrying all these labels."""
        ...


class JobChannel(Protocol):
    def job_dir(self, job_id: str) -> str: ...

    def prepare(self, job_id: str, attempt: int, spec: JobSpec, dataset_uri: str) -> None:
        """Write what the agent needs before the machine boots (spec.json)."""
        ...

    def read_status(self, job_id: str, attempt: int) -> AgentReport | None:
        """The agent's latest report for this attempt, or None if it has not reported yet."""
        ...

    def request_stop(self, job_id: str, attempt: int, reason: str) -> None:
        """Tell the agents of attempts up to `attempt` to stop, in case deleting their machine does not
        reach them (their watchdog reads this; agent/watchdog.py)."""
        ...

    def final_metrics(self, job_id: str) -> dict[str, Any] | None:
        """Metrics from the finished job's artifacts, if any."""
        ...

    def history(self, job_id: str) -> Any:
        """The epochs the agent recorded so far (metrics.json's `history`), as parsed: the job's code can
        write that file, so the caller checks every field (trainjobs/advice_facts.py). None if unreadable."""
        ...

    def artifact_manifest(self, job_id: str) -> list[dict[str, Any]] | None:
        """The finished job's artifact manifest (path, size, sha256 of each), if it wrote one."""
        ...


class MachineRefused(Exception):
    """The cloud refused the machine for a reason waiting will not fix (quota, permission, invalid
    request, capacity never came). The message is the cloud's own, for the job's error."""


class NoCapacity(Exception):
    """No machine can be had right now (quota, stockout, local slots busy); try again later."""


class RateLimited(Exception):
    """The cloud refused a call for the project's API rate quota (Compute Engine's 403 rateLimitExceeded,
    429 RESOURCE_EXHAUSTED per minute), still after the call's retries. Not the job's fault: the driver
    waits and tries again without counting it as the job's failure (issue 25)."""


class DatasetError(Exception):
    """The data is unusable; the message says why, for the user."""


class ProgramError(DatasetError):
    """A program job's code cannot run as its spec says (no entrypoint, say): found at staging, before
    any machine; the message names the field."""


class Stager(Protocol):
    def __call__(self, spec: JobSpec, job_id: str, *, project_id: str,
                 should_stop: Callable[[], bool] = lambda: False) -> str:
        """Stage the job's dataset; return its URI. Raise DatasetError for bad data. `project_id` is
        whose uploads `dataset:<sha>` may name; staging checks `should_stop` between files and chunks
        and gives up (raising StagingStopped) once it turns true (a cancel, the worker stopping)."""
        ...


class StagingStopped(Exception):
    """Staging gave up because should_stop() turned true."""
