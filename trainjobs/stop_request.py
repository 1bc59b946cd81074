"""The worker's stop request to a job's agents: the one message that runs from the worker to the agent
while the job runs (the agent's runtime that acts on it is agent/watchdog.py).

The worker writes {"stop": true, "reason": "...", "attempt": N} into the job directory's control.json when the job
ended, was cancelled, or an attempt's machine was given up. Attempts up to N stop; a later attempt (the
driver's retry after a lost machine) shares the job directory and runs on.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from trainjobs import storage
from trainjobs.job_paths import JobPaths

DEFAULT_TERM_GRACE_S = 30.0


def term_grace_s(env: Mapping[str, str] = os.environ) -> float:
    """How long an agent's cleanup after SIGTERM may take before it exits anyway
    (TRAINJOBS_TERM_GRACE_S): the agent's own bound, and what the local provisioner's delete waits."""
    try:
        return max(0.0, float(env.get("TRAINJOBS_TERM_GRACE_S") or DEFAULT_TERM_GRACE_S))
    except ValueError:
        return DEFAULT_TERM_GRACE_S


def request_stop(job_dir: str, reason: str, attempt: int | None = None) -> None:
    """Worker side: tell the job's agents to stop (the job ended, was cancelled, or this attempt's machine
    was given up): those of attempts up to `attempt`, or all of them when it is None."""
    storage.write_json(JobPaths.of(job_dir).control, {"stop": True, "reason": reason, "attempt": attempt})
