"""The job channel over GCS: spec.json out, status.json and artifacts/metrics.json back.

The same objects a Cloud TPU VM's agent reads and writes, so the worker treats a local process and
a real VM alike.
"""

from __future__ import annotations

from typing import Any

from trainjobs import storage
from trainjobs.messages import AgentAssignment, AgentReport
from trainjobs.spec import JobSpec
from trainjobs.watchdog import request_stop


class GcsJobChannel:
    def __init__(self, bucket: str | None = None):
        self.bucket = bucket

    def _paths(self, job_id: str) -> storage.JobPaths:
        return storage.JobPaths.for_job(job_id, self.bucket)

    def job_dir(self, job_id: str) -> str:
        return self._paths(job_id).root

    def prepare(self, job_id: str, attempt: int, spec: JobSpec, dataset_uri: str) -> None:
        assignment = AgentAssignment(job_id=job_id, attempt=attempt, spec=spec, dataset_uri=dataset_uri)
        storage.write_json(self._paths(job_id).spec, assignment.model_dump(mode="json"))

    def read_status(self, job_id: str, attempt: int) -> AgentReport | None:
        data = storage.read_json(self._paths(job_id).status)
        report = AgentReport.model_validate(data) if data else None
        # A status left by an earlier attempt says nothing about this one.
        return report if report is not None and report.attempt == attempt else None

    def request_stop(self, job_id: str, attempt: int, reason: str) -> None:
        request_stop(self.job_dir(job_id), reason, attempt)

    def final_metrics(self, job_id: str) -> dict[str, Any] | None:
        metrics = storage.read_json(self._paths(job_id).key("artifacts/metrics.json"))
        return metrics if isinstance(metrics, dict) else None

    def artifact_manifest(self, job_id: str) -> list[dict[str, Any]] | None:
        """Only well-formed entries: the job's code could have written this file as well as the agent."""
        raw = storage.read_json(self._paths(job_id).artifact_manifest)
        if not isinstance(raw, list):
            return None
        return [{"path": e["path"], "size": e["size"], "sha256": e["sha256"]} for e in raw
                if isinstance(e, dict) and isinstance(e.get("path"), str) and isinstance(e.get("size"), int)
                and isinstance(e.get("sha256"), str) and len(e["sha256"]) == 64]
