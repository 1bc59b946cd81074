"""One project per host where local machines run unsandboxed (issue 36, finding 10).

Without the sandbox (worker/local/sandbox.py) a job's code runs as the worker's user: it can read the
worker's environment (the database URL, and through the database every project), other machines' disks
and every upload, and plant code in another project's requirements cache. Whoever runs code there holds
the deployment, so the operator says whose code that is: the host runs the jobs of one project the
operator names (TRAINJOBS_LOCAL_PROJECT; `trainjobs up` names its own project), written here at start-up,
and refuses every other project's machine with the reason (its job fails: it would wait for ever). A job
never claims the host itself: the first project to submit would otherwise own it. With no project named,
no local job runs unsandboxed, unless the operator trusts every project with TRAINJOBS_LOCAL_TRUSTED=1.
"""

from __future__ import annotations

import os
from pathlib import Path

CLAIM_FILE = "project-claim"
PROJECT_ENV = "TRAINJOBS_LOCAL_PROJECT"


class HostClaimed(Exception):
    """This host runs another project's jobs, or none; the message says what the operator can do."""


def assign_host(root: Path, project_id: str) -> None:
    """The operator's choice: this host runs `project_id`'s local jobs only (written whole)."""
    root.mkdir(parents=True, exist_ok=True)
    partial = root / f"{CLAIM_FILE}.{os.getpid()}"
    partial.write_text(project_id)
    os.replace(partial, root / CLAIM_FILE)


def check_host(root: Path, project_id: str | None) -> None:
    """Nothing when `project_id` is the project this host runs; else HostClaimed."""
    path = root / CLAIM_FILE
    try:
        holder = path.read_text().strip()
    except FileNotFoundError:
        holder = None
    if holder is not None and project_id is not None and holder == project_id:
        return
    options = (f"the operator can run them in a sandbox (bubblewrap), name the one project this host runs "
               f"({PROJECT_ENV}), or trust every project with TRAINJOBS_LOCAL_TRUSTED=1")
    if holder is None:
        raise HostClaimed(f"this host runs local jobs unsandboxed (no bubblewrap sandbox) and no project is named "
                          f"for it, so no job's code runs here: {options}")
    raise HostClaimed(f"this host runs local jobs unsandboxed (no bubblewrap sandbox) for another project only, "
                      f"whose jobs could read this job's files and credentials: {options}")
