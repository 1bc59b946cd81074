"""One project per host where local machines run unsandboxed (issue 36, finding 10).

Without the sandbox (worker/local/sandbox.py) a job's code runs as the worker's user: it can read the
worker's environment (the database URL), other machines' disks and every upload, and plant code in another
project's requirements cache. No other project's job may then run on the host at all, before or after:
the first project to run a local job claims the provisioner's root for good, in a file every worker on
the host reads, and another project's machine is refused with the reason (its job fails, it does not wait:
a claim is never released by itself, so a waiting job would wait for ever). The operator releases a claim
by deleting the file, or trusts every project on the host with TRAINJOBS_LOCAL_TRUSTED=1.
"""

from __future__ import annotations

import os
from pathlib import Path

CLAIM_FILE = "project-claim"


class HostClaimed(Exception):
    """Another project holds this host; the message says which file to delete to release it."""


def claim_host(root: Path, project: str | None) -> None:
    """Claim `root` for `project` if nobody has, or check that `project` holds it; else HostClaimed."""
    path = root / CLAIM_FILE
    if project is None:
        raise HostClaimed("the machine request names no project, and this host runs one project's jobs only "
                          "(no sandbox; TRAINJOBS_LOCAL_TRUSTED=1 allows any)")
    mine = root / f"{CLAIM_FILE}.{os.getpid()}"
    mine.write_text(project)
    try:
        os.link(mine, path)  # whole, and exactly one project wins the race (link fails if the name exists)
    except FileExistsError:
        holder = path.read_text().strip()
        if holder != project:
            raise HostClaimed(
                f"this host runs local jobs unsandboxed (TRAINJOBS_LOCAL_SANDBOX, no bubblewrap) and belongs to "
                f"another project, whose jobs could read this job's files and credentials; the operator can run "
                f"jobs of more than one project here with a sandbox (bubblewrap), with TRAINJOBS_LOCAL_TRUSTED=1, "
                f"or by deleting {path}") from None
    finally:
        mine.unlink(missing_ok=True)
