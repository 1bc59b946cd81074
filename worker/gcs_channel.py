"""The job channel over GCS: spec.json out, status.json and artifacts/metrics.json back.

The same objects a Cloud TPU VM's agent reads and writes, so the worker treats a local process and
a real VM alike. The job's own code can write every object it reads back, so each is read within a
cap on its size (storage.read_bounded): a status or manifest over it fails the job with a note that
says so, metrics over it are left out, and the worker never holds more than the cap in memory.

status.json is read with a download conditional on the generation read last (issue 25): while the
agent has written nothing since, GCS answers 304 and sends nothing, and the report read before stands.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from datetime import datetime, timezone
from typing import Any

from trainjobs import storage
from trainjobs.job_paths import JobPaths
from trainjobs.messages import AgentAssignment, AgentError, AgentReport, AgentState
from trainjobs.spec import JobSpec
from trainjobs.stop_request import request_stop

log = logging.getLogger("trainjobs.worker")

# The last status.json read of each job, for the conditional read. Bounded: a worker drives a few
# hundred jobs at most, and a status larger than this is read whole every time rather than kept.
REMEMBERED_STATUSES = 1024
REMEMBERED_STATUS_MAX_BYTES = 64 << 10


class GcsJobChannel:
    def __init__(self, bucket: str | None = None):
        self.bucket = bucket
        self._statuses: OrderedDict[str, tuple[int, Any]] = OrderedDict()  # uri -> (generation, parsed JSON)
        self._lock = threading.Lock()  # one channel serves every driver thread of the worker

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
            data = self._status_document(paths.status)
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

    def _status_document(self, uri: str) -> Any:
        """status.json parsed (None when there is none), downloaded only when its generation changed."""
        with self._lock:
            known = self._statuses.get(uri)
        fresh = storage.read_bounded_if_changed(uri, storage.STATUS_MAX_BYTES, known[0] if known else None)
        if isinstance(fresh, storage.Unchanged) and known is not None:
            return known[1]
        raw, generation = (None, None) if isinstance(fresh, storage.Unchanged) else fresh
        data = json.loads(raw) if raw else None
        with self._lock:
            self._statuses.pop(uri, None)
            if generation is not None and raw is not None and len(raw) <= REMEMBERED_STATUS_MAX_BYTES:
                self._statuses[uri] = (generation, data)
                while len(self._statuses) > REMEMBERED_STATUSES:
                    self._statuses.popitem(last=False)
        return data

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
