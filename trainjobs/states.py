"""A job's status as the API shows it, and the groups every rule about statuses is written in. The
values are the client's vocabulary too; which moves between them are allowed, and the only code that
makes them, is service/db/jobstate.py.

The groups are named here once: the state table, the claim and quota SQL (service/db/), the reaper, the
client and the dashboard (served from here, service/routes/dashboard.py) are built from them.
"""

from __future__ import annotations

from trainjobs.str_enum import StrEnum


class JobStatus(StrEnum):
    # The order is the job_status enum's in PostgreSQL (migration 0001): HOLDING must stay one run of it.
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

# Under way: a worker drives the job toward its end. A lost machine or a dead worker moves it to
# RECOVERING, and a cancel to CANCELLING, from any of these.
ACTIVE = frozenset({JobStatus.STAGING, JobStatus.PROVISIONING, JobStatus.RUNNING, JobStatus.RECOVERING})
# The job holds a machine, or may: from the claim until it ends, a half-done teardown included. It
# counts against its project's quotas, and a worker's lease on it can be taken over.
HOLDING = ACTIVE | {JobStatus.CANCELLING}
# A cancel acts on it: a queued job ends at once, an active one goes CANCELLING.
CANCELLABLE = ACTIVE | {JobStatus.QUEUED}
# Over: nothing moves it again, and it holds nothing.
TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})

GROUPS: dict[str, frozenset[JobStatus]] = {
    "ACTIVE": ACTIVE, "HOLDING": HOLDING, "CANCELLABLE": CANCELLABLE, "TERMINAL": TERMINAL}


def in_order(group: frozenset[JobStatus]) -> list[JobStatus]:
    """The group's statuses in the enum's order (for SQL, and for anything shown)."""
    return [s for s in JobStatus if s in group]


def sql_list(group: frozenset[JobStatus]) -> str:
    """The group as the items of a SQL IN list: 'STAGING', 'PROVISIONING', ..."""
    return ", ".join(f"'{s.value}'" for s in in_order(group))


class SweepStatus(StrEnum):
    """A sweep's status (issue 22): RUNNING while it asks for trials or any runs; CANCELLING once a cancel
    was asked for, until every trial's job has ended."""

    RUNNING = "RUNNING"
    CANCELLING = "CANCELLING"
    SUCCEEDED = "SUCCEEDED"  # every trial ended and at least one completed: it has a best trial
    FAILED = "FAILED"  # every trial ended and none completed
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in (SweepStatus.SUCCEEDED, SweepStatus.FAILED, SweepStatus.CANCELLED)


# A cancel acts on it (service/db/sweeps.py request_cancel; the dashboard's cancel button): a sweep already
# CANCELLING or ended is left as it is.
SWEEP_CANCELLABLE = frozenset({SweepStatus.RUNNING})


class TrialState(StrEnum):
    """A sweep trial's state, as Optuna's study records it too."""

    RUNNING = "RUNNING"  # its job is queued or under way
    COMPLETE = "COMPLETE"  # its job succeeded with the objective's value
    PRUNED = "PRUNED"  # behind the others: its job was cancelled "pruned by the sweep"
    FAIL = "FAIL"  # its job failed or was cancelled, or reported no value of the objective
