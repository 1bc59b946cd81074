"""The reaper's judgement, over any provisioner's machines: which machines no live job uses."""

from __future__ import annotations

import uuid

from trainjobs.vm_metadata import LABEL_ATTEMPT, LABEL_JOB, LABEL_MANAGED
from worker.ports import MachineInfo, MachineState
from worker.reaper import orphans

LIVE, ENDED = uuid.uuid4(), uuid.uuid4()


def machine(name: str, job: object, attempt: str) -> MachineInfo:
    return MachineInfo(name, MachineState.READY, {LABEL_MANAGED: "true", LABEL_JOB: str(job), LABEL_ATTEMPT: attempt})


def test_only_machines_of_a_live_jobs_current_attempt_are_kept() -> None:
    machines = [
        machine("current", LIVE, "2"),
        machine("earlier-attempt", LIVE, "1"),
        machine("ended-job", ENDED, "1"),
        machine("not-a-job", "not-a-uuid", "1"),
        machine("no-attempt-label", LIVE, ""),
    ]
    in_use = {LIVE: 2}  # the data layer's answer: ENDED has ended, so it is not there
    assert [m.name for m in orphans(machines, in_use)] == ["earlier-attempt", "ended-job", "not-a-job"]
