"""The job channel over GCS: spec.json out, status.json and artifacts/metrics.json back.

The same objects a Cloud TPU VM's agent reads and writes, so the worker treats a local process and
a real VM alike. The job's own code can write every object it reads back, so each is read within a
cap on its size (storage.read_bounded): a status or manifest over it fails the job with a note that
says so, metrics over it are left out, and the worker never holds more than the cap in memory.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

from trainjobs import storage
from trainjobs.job_paths import JobPaths
from trainjobs.messages import AgentAssignment, AgentError, AgentReport, AgentState
from trainjobs.spec import JobSpec
from trainjobs.stop_request import request_stop

log = logging.getLogger("trainjobs.worker")


class GcsJobChannel:
    def __init__(self, bucket: str | None = None):
        self.bucket = bucket

    def _paths(self, job_id: str) -> JobPaths:
        return JobPaths.for_job(job_id, self.bucket)

    def job_dir(self, job_id: str) -> str:
        return self._paths(job_id).root

    def prepare(self, job_id: str, attempt: int, spec: JobSpec, dataset_uri: str) -> None:
        assignment = AgentAssignment(job_id=job_id, attempt=attempt, spec=spec, dataset_uri=dataset_uri)
        storage.write_json(self._paths(job_id).spec, assignment.model_dump(mode="json"))

    def read_status(self, job_id: str, attempt: int) -> AgentReport | None:
        paths = self._paths(job_id)
        try:
            data = storage.read_json_bounded(paths.status, storage.STATUS_MAX_BYTES)
        except storage.ObjectTooLarge as exc:
            return _failed(attempt, exc)
        report = AgentReport.model_validate(data) if data else None
        # A status left by an earlier attempt says nothing about this one.
        if report is None or report.attempt != attempt:
            return None
        if report.state == AgentState.SUCCEEDED:
            # Judged now, before the job is SUCCEEDED: a manifest too large to list the artifacts by
            # would leave a success whose outputs nobody can download.
            manifest = storage.get_blob(paths.artifact_manifest)
            if manifest is not None and int(manifest.size or 0) > storage.MANIFEST_MAX_BYTES:
                return _failed(attempt, storage.ObjectTooLarge(paths.artifact_manifest, int(manifest.size),
                                                               storage.MANIFEST_MAX_BYTES))
        return report

    def request_stop(self, job_id: str, attempt: int, reason: str) -> None:
        request_stop(self.job_dir(job_id), reason, attempt)

    def final_metrics(self, job_id: str) -> dict[str, Any] | None:
        """None when the file is missing or over its cap: the driver keeps the last epoch's metrics
        from status.json instead."""
        uri = self._paths(job_id).final_metrics
        try:
            metrics = storage.read_json_bounded(uri, storage.STATUS_MAX_BYTES)
        except storage.ObjectTooLarge as exc:
            log.warning("job %s: final metrics left out: %s", job_id, exc)
            return None
        return metrics if isinstance(metrics, dict) else None

    def history(self, job_id: str) -> Any:
        try:
            doc = storage.read_json_bounded(self._paths(job_id).metrics, storage.METRICS_MAX_BYTES)
        except (storage.ObjectTooLarge, ValueError, RecursionError) as exc:  # too large, not JSON, nested too deep
            log.warning("job %s: metrics.json left out of its advice: %s", job_id, exc)
            return None
        return doc.get("history") if isinstance(doc, dict) else None

    def artifact_manifest(self, job_id: str) -> list[dict[str, Any]] | None:
        """Only well-formed entries: the job's code could have written this file as well as the agent."""
        raw = storage.read_json_bounded(self._paths(job_id).artifact_manifest, storage.MANIFEST_MAX_BYTES)
        if not isinstance(raw, list):
            return None
        return [{"path": e["path"], "size": e["size"], "sha256": e["sha256"]} for e in raw
                if isinstance(e, dict) and isinstance(e.get("path"), str) and isinstance(e.get("size"), int)
                and isinstance(e.get("sha256"), str) and len(e["sha256"]) == 64]


def _failed(attempt: int, exc: storage.ObjectTooLarge) -> AgentReport:
    """The report the worker acts on in place of one it will not read: the attempt failed, saying why."""
    return AgentReport(state=AgentState.FAILED, heartbeat_at=datetime.now(timezone.utc), attempt=attempt,
                       error=AgentError(type="ObjectTooLarge", message=f"{exc}; the job's code must not write it"))
