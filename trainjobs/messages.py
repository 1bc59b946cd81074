"""What the worker and the agent say to each other, as the objects in a job's directory.

    spec.json    AgentAssignment: written by the worker before a machine boots, read by every agent host
    status.json  AgentReport: written by the chief agent (status-<task>.json by the others), read by the
                 worker to judge the attempt, and by the other hosts to know when the chief is done

Both sides import these models, so a field renamed on one side is renamed on the other. Unknown
fields are kept out of the way (`extra="ignore"`): an agent of a newer version can report more than
an older worker reads, and a rolling upgrade keeps working.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trainjobs.spec import JobSpec, parse_stored
from trainjobs.str_enum import StrEnum


class AgentState(StrEnum):
    STARTING = "starting"  # the process is up, reading spec.json
    RUNNING = "running"  # downloading, building, training or exporting (phase says which)
    SUCCEEDED = "succeeded"  # artifacts written
    FAILED = "failed"  # error says why
    TERMINATED = "terminated"  # stopped by a signal (preemption, a delete) before finishing

    @property
    def finished(self) -> bool:
        return self in (AgentState.SUCCEEDED, AgentState.FAILED, AgentState.TERMINATED)


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")


class AgentAssignment(_Message):
    """spec.json: what one attempt of a job is to do."""

    job_id: str
    attempt: int
    spec: JobSpec
    dataset_uri: str

    @field_validator("spec", mode="before")
    @classmethod
    def _accepted_spec(cls, v: Any) -> Any:
        # The worker copies the spec the API stored: read it as stored, not as submitted (trainjobs/spec/job.py, parse_stored).
        return parse_stored(v) if isinstance(v, dict) else v


class AgentError(_Message):
    type: str = "Error"
    message: str = "the agent failed without a message"
    logs: list[str] = Field(default_factory=list)  # the last log lines before the failure
    # The attempt failed for the machine's reason, not the job's (its program killed by a signal: the
    # kernel's out-of-memory killer, say): the worker starts another within limits.max_retries, as for a
    # lost machine. An older worker ignores it and fails the job, as it always did.
    retry: bool = False

    def summary(self) -> str:
        return f"{self.type}: {self.message}"


class AgentReport(_Message):
    """status.json: one agent host's latest word on one attempt."""

    state: AgentState
    heartbeat_at: datetime
    # None only when the agent could not even read spec.json, so it does not know its attempt.
    attempt: int | None = None
    job_id: str | None = None
    task_index: int = 0
    phase: str = "starting"  # starting | downloading | building | training | exporting | waiting_for_chief
    started_at: datetime | None = None
    epoch: int = 0
    epochs: int | None = None
    progress: float | None = None  # 0..1 of the requested epochs
    runtime: dict[str, Any] | None = None  # the plan the agent chose: strategy, replicas, precision, batch, lr
    metrics: dict[str, Any] | None = None  # the latest epoch's
    error: AgentError | None = None
    first_step_at: datetime | None = None  # when training's first step ended: the end of the wait for a machine
