"""The reaper: deletes machines that no live job owns, so nothing bills after its job ended.

Drivers delete their own machines; this catches what they cannot: a worker killed between create and
record, a delete that failed, a machine of an attempt the job has moved past, a job row removed. It
runs in every worker (deletes are idempotent) every few minutes.
"""

from __future__ import annotations

import logging
import threading
import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.db.models import Job
from service.db.session import transaction
from trainjobs.states import TERMINAL
from worker import metrics
from trainjobs.vm_metadata import LABEL_ATTEMPT, LABEL_JOB, LABEL_MANAGED
from worker.ports import MachineInfo, Provisioner

log = logging.getLogger("trainjobs.worker")


def _job_id(machine: MachineInfo) -> uuid.UUID | None:
    try:
        return uuid.UUID(machine.labels.get(LABEL_JOB, ""))
    except ValueError:
        return None


def orphans(machines: list[MachineInfo], jobs: dict[uuid.UUID, Job]) -> list[MachineInfo]:
    """Machines whose job is terminal, unknown, or past the machine's attempt."""
    out = []
    for m in machines:
        job = jobs.get(job_id) if (job_id := _job_id(m)) is not None else None
        attempt = m.labels.get(LABEL_ATTEMPT, "")
        if job is None or job.status in TERMINAL or (attempt.isdigit() and int(attempt) < max(job.attempt, 1)):
            out.append(m)
    return out


def reap_orphans(provisioner: Provisioner, factory: sessionmaker[Session]) -> int:
    """Delete every orphaned machine; return how many."""
    machines = provisioner.list({LABEL_MANAGED: "true"})
    ids = {i for m in machines if (i := _job_id(m)) is not None}
    with transaction(factory) as session:
        jobs = {j.id: j for j in session.scalars(select(Job).where(Job.id.in_(ids)))} if ids else {}
    doomed = orphans(machines, jobs)
    for m in doomed:
        log.info("reaping %s (job %s, %s)", m.name, m.labels.get(LABEL_JOB), m.state.value)
        provisioner.delete(m.name)
        metrics.MACHINES_REAPED.inc()
    if doomed:
        log.warning("reaper deleted %d orphaned machine(s): %s", len(doomed), ", ".join(m.name for m in doomed))
    return len(doomed)


def run_reaper(provisioner: Provisioner, factory: sessionmaker[Session], stop: threading.Event,
               every_s: float = 300.0) -> None:
    """Reap every `every_s` until `stop` is set (a worker thread's target)."""
    while not stop.wait(every_s):
        try:
            reap_orphans(provisioner, factory)
        except Exception:
            log.exception("reaper pass failed; trying again in %.0fs", every_s)
