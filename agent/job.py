"""What the worker handed this agent (spec.json) and where the agent keeps its files."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from trainjobs import storage
from trainjobs.job_paths import JobPaths
from trainjobs.messages import AgentAssignment, AgentReport
from trainjobs.spec import JobSpec


CHIEF_POLL_S = 1.0


class JobInputError(Exception):
    """spec.json is missing or unreadable."""


@dataclass(frozen=True)
class AgentJob:
    job_id: str
    attempt: int
    spec: JobSpec
    dataset_uri: str
    job_dir: str  # gs://bucket/jobs/<id>
    task_index: int

    @property
    def is_chief(self) -> bool:
        return self.task_index == 0

    @property
    def paths(self) -> JobPaths:
        return JobPaths(self.job_dir)

    @property
    def status_uri(self) -> str:
        return self.paths.status_of(self.task_index)

    @property
    def log_uri(self) -> str:
        return self.paths.log(self.attempt, self.task_index)


def load_job(job_dir: str, task_index: int) -> AgentJob:
    job_dir = job_dir.rstrip("/")
    raw = storage.read_json(JobPaths(job_dir).spec)
    if raw is None:
        raise JobInputError(f"no spec.json under {job_dir}")
    assignment = AgentAssignment.model_validate(raw)
    return AgentJob(
        job_id=assignment.job_id,
        attempt=assignment.attempt,
        spec=assignment.spec,
        dataset_uri=assignment.dataset_uri.rstrip("/"),
        job_dir=job_dir,
        task_index=task_index,
    )


def task_index_from_env() -> int:
    """TF_CONFIG's task index when the provisioner set one for multi-worker training, else 0."""
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    return int(config.get("task", {}).get("index", 0))


@dataclass(frozen=True)
class WorkDir:
    """The agent's local disk. TensorFlow only ever sees paths under here, never gs:// ones."""

    root: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    @property
    def user_model(self) -> Path:
        return self.root / "user_model"

    @property
    def program(self) -> Path:
        return self.root / "program"

    @property
    def log_file(self) -> Path:
        return self.root / "agent.log"


def wait_for_chief(job: AgentJob) -> None:
    """On a host other than the chief, once its part is done: until the chief reports this attempt
    finished. A chief that dies without a word stops the machine, and the worker's delete ends this
    wait with SIGTERM."""
    while True:
        raw = storage.read_json(job.paths.status)
        chief = AgentReport.model_validate(raw) if raw else None
        if chief is not None and chief.attempt == job.attempt and chief.state.finished:
            logging.getLogger("trainjobs.agent").info("chief %s; leaving", chief.state)
            return
        time.sleep(CHIEF_POLL_S)
