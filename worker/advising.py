"""The advisor in the worker: the driver asks for a job's advice as it records progress and when the job
ends, and writes it only when it changed (trainjobs/advice.py has the rules).

metrics.json, where the epochs are, is read only when the agent reports a new epoch and once at the end,
not at every poll. Advice is a figure, not the job's outcome: anything that goes wrong computing it is
logged and leaves the stored advice as it was.
"""

from __future__ import annotations

import logging
from typing import Any

from trainjobs.advice import advise
from trainjobs.advice_facts import job_facts
from trainjobs.spec import JobSpec
from worker.ports import JobChannel

log = logging.getLogger("trainjobs.worker")


class JobAdvisor:
    """One job's advice, for its driver: what was last stored, and the epochs last read."""

    def __init__(self, channel: JobChannel, job_id: str, stored: list[dict[str, Any]] | None):
        self.channel, self.job_id, self.stored = channel, job_id, stored
        self._read_at: tuple[Any, Any] | None = None  # (attempt, epoch) of the last history read
        self._history: Any = None

    def changed(self, spec: JobSpec, *, runtime: Any, metrics: Any, machines: Any, attempts: int,
                final: bool) -> list[dict[str, Any]] | None:
        """The job's advice if it differs from what is stored (then it counts as stored), else None."""
        try:
            advice = [a.as_dict() for a in advise(job_facts(
                spec, runtime=runtime, history=self._epochs(metrics, final), metrics=metrics, machines=machines,
                attempts=attempts))]
        except Exception:
            log.warning("job %s: could not compute its advice", self.job_id, exc_info=True)
            return None
        if advice == self.stored:
            return None
        self.stored = advice
        return advice

    def _epochs(self, metrics: Any, final: bool) -> Any:
        latest = (metrics.get("attempt"), metrics.get("epoch")) if isinstance(metrics, dict) else (None, None)
        if final or latest != self._read_at:
            self._history, self._read_at = self.channel.history(self.job_id), latest
        if isinstance(self._history, list):
            return self._history
        return [metrics] if isinstance(metrics, dict) and "epoch" in metrics else []
