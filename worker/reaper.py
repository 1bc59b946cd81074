"""The reaper: deletes machines that no live job owns, so nothing bills after its job ended.

Drivers delete their own machines; this catches what they cannot: a worker killed between create and
record, a delete that failed, a machine of an attempt the job has moved past, a job row removed. It
runs in every worker (deletes are idempotent) every few minutes, over whatever Provisioner the worker
has: machines are found by the labels every provisioner sets (trainjobs/vm_metadata.py), and which
jobs still use them is the data layer's query (service/db/machines.py).
"""

from __future__ import annotations

import logging
import threading
import uuid

from sqlalchemy.orm import Session, sessionmaker

from service.db.machines import attempts_in_use
from service.db.session import transaction
from trainjobs.vm_metadata import LABEL_ATTEMPT, LABEL_JOB, LABEL_MANAGED
from worker import prometheus
from worker.ports import MachineInfo, Provisioner

log = logging.getLogger("trainjobs.worker")


def _job_id(machine: MachineInfo) -> uuid.UUID | None:
    try:
        return uuid.UUID(machine.labels.get(LABEL_JOB, ""))
    except ValueError:
        return None


def orphans(machines: list[MachineInfo], in_use: dict[uuid.UUID, int]) -> list[MachineInfo]:
    """Machines whose job is over or unknown (not in `in_use`), or past the machine's attempt."""
    out = []
    for m in machines:
        attempt = in_use.get(job_id) if (job_id := _job_id(m)) is not None else None
        label = m.labels.get(LABEL_ATTEMPT, "")
        if attempt is None or (label.isdigit() and int(label) < attempt):
            out.append(m)
    return out


def reap_orphans(provisioner: Provisioner, factory: sessionmaker[Session]) -> int:
    """Delete every orphaned machine; return how many."""
    machines = provisioner.list({LABEL_MANAGED: "true"})
    ids = {i for m in machines if (i := _job_id(m)) is not None}
    with transaction(factory) as session:
        in_use = attempts_in_use(session, ids)
    doomed = orphans(machines, in_use)
    for m in doomed:
        log.info("reaping %s (job %s, %s)", m.name, m.labels.get(LABEL_JOB), m.state.value)
        provisioner.delete(m.name)
        prometheus.MACHINES_REAPED.inc()
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
