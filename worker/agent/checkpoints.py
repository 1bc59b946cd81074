"""Checkpoints: written to local disk, mirrored to <job-dir>/checkpoints/, restored on the next attempt.

`latest.json` is uploaded only after the checkpoint's files, so an agent killed mid-upload leaves
it pointing at the previous complete checkpoint; a new attempt trusts nothing else.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from trainjobs import storage
from worker.agent.status import utc_now

log = logging.getLogger("trainjobs.agent")

LATEST = "latest.json"


class CheckpointStore:
    def __init__(self, local_dir: Path, remote: str, upload: bool, attempt: int):
        self.local_dir, self.remote, self.upload, self.attempt = local_dir, remote.rstrip("/"), upload, attempt

    def latest(self) -> dict[str, Any] | None:
        return storage.read_json(f"{self.remote}/{LATEST}")

    def restore(self, checkpoint: Any) -> int:
        """Load the newest complete checkpoint into `checkpoint`; return its epoch, 0 if none."""
        latest = self.latest()
        if latest is None:
            return 0
        self.local_dir.mkdir(parents=True, exist_ok=True)
        for name in latest["files"]:
            storage.blob(f"{self.remote}/{name}").download_to_filename(str(self.local_dir / name))
        checkpoint.read(str(self.local_dir / latest["prefix"])).assert_existing_objects_matched()
        log.info("resumed from the checkpoint of epoch %d (attempt %s)", latest["epoch"], latest.get("attempt"))
        return int(latest["epoch"])

    def save(self, checkpoint: Any, epoch: int) -> None:
        """Every task writes (MultiWorkerMirroredStrategy needs all of them to); only the chief uploads."""
        self.local_dir.mkdir(parents=True, exist_ok=True)
        prefix = f"epoch-{epoch:06d}"
        checkpoint.write(str(self.local_dir / prefix))
        if not self.upload:
            return
        files = sorted(p.name for p in self.local_dir.glob(f"{prefix}.*"))
        previous = self.latest()
        for name in files:
            storage.blob(f"{self.remote}/{name}").upload_from_filename(str(self.local_dir / name))
        storage.write_json(f"{self.remote}/{LATEST}", {
            "epoch": epoch, "prefix": prefix, "files": files, "attempt": self.attempt, "written_at": utc_now(),
        })
        log.info("checkpoint of epoch %d uploaded to %s", epoch, self.remote)
        if previous and previous["prefix"] != prefix:
            from google.api_core.exceptions import NotFound

            for name in previous["files"]:
                try:
                    storage.blob(f"{self.remote}/{name}").delete()
                except NotFound:  # a previous attempt died between upload and cleanup
                    pass
            for stale in self.local_dir.glob(f"{previous['prefix']}.*"):
                stale.unlink()
