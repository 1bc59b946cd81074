"""The job channel over GCS: spec.json out, status.json and artifacts/metrics.json back.

The same objects a Cloud TPU VM's agent reads and writes, so the worker treats a local process and
a real VM alike.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from trainjobs import storage
from trainjobs.spec import JobSpec
from worker.provisioner import AgentState, AgentStatus


class GcsJobChannel:
    def __init__(self, bucket: str | None = None):
        self.bucket = bucket

    def _paths(self, job_id: str) -> storage.JobPaths:
        return storage.JobPaths.for_job(job_id, self.bucket)

    def job_dir(self, job_id: str) -> str:
        return self._paths(job_id).root

    def prepare(self, job_id: str, attempt: int, spec: JobSpec, dataset_uri: str) -> None:
        storage.write_json(self._paths(job_id).spec, {
            "job_id": job_id, "attempt": attempt, "spec": spec.model_dump(mode="json"), "dataset_uri": dataset_uri,
        })

    def read_status(self, job_id: str, attempt: int) -> AgentStatus | None:
        data = storage.read_json(self._paths(job_id).status)
        # A status left by an earlier attempt says nothing about this one.
        if not data or int(data.get("attempt", -1)) != attempt:
            return None
        return parse_status(data)

    def final_metrics(self, job_id: str) -> dict[str, Any] | None:
        return storage.read_json(self._paths(job_id).key("artifacts/metrics.json"))  # type: ignore[no-any-return]


def parse_status(data: dict[str, Any]) -> AgentStatus:
    return AgentStatus(
        state=AgentState(data["state"]),
        attempt=int(data["attempt"]),
        heartbeat_at=datetime.fromisoformat(data["heartbeat_at"]),
        progress=data.get("progress"),
        metrics=data.get("metrics"),
        runtime=data.get("runtime"),
        error=data.get("error"),
    )
