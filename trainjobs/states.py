"""A job's status as the API shows it. The values are the client's vocabulary too; which moves
between them are allowed, and the only code that makes them, is service/db/jobstate.py."""

from __future__ import annotations

from trainjobs.str_enum import StrEnum


class JobStatus(StrEnum):
    QUEUED = "QUEUED"  # stored, waiting for a worker
    STAGING = "STAGING"  # claimed; dataset being validated and pushed to GCS
    PROVISIONING = "PROVISIONING"  # machine being created, agent starting
    RUNNING = "RUNNING"  # agent reports training
    RECOVERING = "RECOVERING"  # machine lost, preempted or its worker died; being adopted or re-provisioned
    CANCELLING = "CANCELLING"  # user asked to cancel; machine being torn down
    SUCCEEDED = "SUCCEEDED"  # artifacts written (terminal)
    FAILED = "FAILED"  # error recorded (terminal)
    CANCELLED = "CANCELLED"  # torn down after a cancel (terminal)

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
