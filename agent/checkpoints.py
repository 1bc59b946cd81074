"""Checkpoints: written to local disk, mirrored to <job-dir>/checkpoints/, restored on the next attempt.

`latest.json` is uploaded only after the checkpoint's files, so an agent killed mid-upload leaves
it pointing at the previous complete checkpoint; a new attempt trusts nothing else. It says where
training stood when the checkpoint was taken:

    {"epoch": 2, "step": 40, "global_step": 912, "prefix": "step-000000912",
     "files": ["step-000000912.data-00000-of-00001", "step-000000912.index"],
     "attempt": 1, "written_at": "..."}

`epoch` epochs were done, then `step` steps of the next one (0 for a checkpoint taken at an
epoch's end); `global_step` counts every training step since the job began.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from trainjobs import storage
from trainjobs.spec import TrainingSpec
from agent.plan import RuntimePlan, TrainingPosition
from agent.publisher import Publisher
from agent.status import utc_now

log = logging.getLogger("trainjobs.agent")

LATEST = "latest.json"


class CheckpointStore:
    """`publisher`: upload off the training thread (the chief's; others never upload). `may_skip`: a
    save due while the previous one is still uploading is skipped rather than waited for. Only for a
    job of one task: in a multi-worker job every task takes part in each save (a collective write)
    and only the chief knows about uploads, so there the chief waits instead."""

    def __init__(self, local_dir: Path, remote: str, upload: bool, attempt: int, *,
                 publisher: Publisher | None = None, may_skip: bool = False):
        self.local_dir, self.remote, self.upload, self.attempt = local_dir, remote.rstrip("/"), upload, attempt
        self.publisher, self.may_skip = publisher, may_skip
        self._local_prefix: str | None = None

    def uploading(self) -> bool:
        return self.upload and self.publisher is not None and self.publisher.busy("checkpoint")

    def latest(self) -> dict[str, Any] | None:
        return storage.read_json(f"{self.remote}/{LATEST}")

    def restore(self, checkpoint: Any, steps_per_epoch: int) -> TrainingPosition:
        """Load the newest complete checkpoint into `checkpoint`; return where it was taken (the
        start, if there is none)."""
        latest = self.latest()
        if latest is None:
            return TrainingPosition()
        self.local_dir.mkdir(parents=True, exist_ok=True)
        for name in latest["files"]:
            storage.blob(f"{self.remote}/{name}").download_to_filename(str(self.local_dir / name))
        checkpoint.read(str(self.local_dir / latest["prefix"])).assert_existing_objects_matched()
        epoch = int(latest["epoch"])
        # An agent from before step schedules wrote neither: its checkpoints were all at epoch ends.
        step = int(latest.get("step", 0))
        at = TrainingPosition(epoch, step, int(latest.get("global_step", epoch * steps_per_epoch)))
        log.info("resumed from the checkpoint at epoch %d, step %d (global step %d) of attempt %s",
                 at.epoch, at.step, at.global_step, latest.get("attempt"))
        return at

    def save(self, checkpoint: Any, at: TrainingPosition, *, final: bool = False) -> bool:
        """Every task writes (MultiWorkerMirroredStrategy needs all of them to); only the chief uploads.
        False: skipped, the previous checkpoint still uploading (may_skip, and not the final one)."""
        if self.uploading():
            if self.may_skip and not final:
                log.info("checkpoint at epoch %d, step %d skipped: the previous one is still uploading",
                         at.epoch, at.step)
                return False
            assert self.publisher is not None
            self.publisher.wait("checkpoint")
        self.local_dir.mkdir(parents=True, exist_ok=True)
        prefix = f"step-{at.global_step:09d}"
        checkpoint.write(str(self.local_dir / prefix))
        previous_local, self._local_prefix = self._local_prefix, prefix
        if self.upload and self.publisher is not None:
            self.publisher.put("checkpoint", lambda: self._upload(prefix, at))
        elif self.upload:
            self._upload(prefix, at)
        # The previous checkpoint's upload is done (uploading() was false, or waited for): its local
        # files may go.
        if previous_local is not None and previous_local != prefix:
            for stale in self.local_dir.glob(f"{previous_local}.*"):
                stale.unlink()
        return True

    def _upload(self, prefix: str, at: TrainingPosition) -> None:
        files = sorted(p.name for p in self.local_dir.glob(f"{prefix}.*"))
        previous = self.latest()
        for name in files:
            storage.blob(f"{self.remote}/{name}").upload_from_filename(str(self.local_dir / name))
        storage.write_json(f"{self.remote}/{LATEST}", {
            "epoch": at.epoch, "step": at.step, "global_step": at.global_step, "prefix": prefix, "files": files,
            "attempt": self.attempt, "written_at": utc_now().isoformat(),
        })
        log.info("checkpoint at epoch %d, step %d (global step %d) uploaded to %s",
                 at.epoch, at.step, at.global_step, self.remote)
        if previous and previous["prefix"] != prefix:
            from google.api_core.exceptions import NotFound

            for name in previous["files"]:
                try:
                    storage.blob(f"{self.remote}/{name}").delete()
                except NotFound:  # a previous attempt died between upload and cleanup
                    pass


class CheckpointSchedule:
    """Saves at the end of every `checkpoint_every_epochs`-th epoch and of the last one, and with
    `checkpoint_every_steps` also after the train-function call that reaches each multiple of it
    in global steps. Nothing can be saved inside a call, so with steps_per_execution > 1 the save
    comes at the end of the first call at or past the multiple. A multiple reached by an epoch's
    last call is saved at that epoch's end, after its history entry, as an epoch-end checkpoint.

    Every task makes the same decisions from the same step counts, as the collective writes need.
    """

    def __init__(self, store: CheckpointStore, checkpoint: Any, training: TrainingSpec, plan: RuntimePlan):
        self.store, self.checkpoint = store, checkpoint
        self.every_epochs, self.every_steps = training.checkpoint_every_epochs, training.checkpoint_every_steps
        self.epochs, self.steps_per_epoch = plan.epochs, plan.steps_per_epoch
        self._saved_at = plan.initial_global_step
        self._skipped = False  # a due save was skipped (CheckpointStore.may_skip): take it when free

    def after_call(self, at: TrainingPosition) -> None:
        if at.step < self.steps_per_epoch and (self._steps_due(at) or self._skipped_and_free()):
            self._save(at)

    def after_epoch(self, at: TrainingPosition) -> None:
        final = at.epoch == self.epochs
        if at.epoch % self.every_epochs == 0 or final or self._steps_due(at) or self._skipped_and_free():
            self._save(at, final=final)

    def _skipped_and_free(self) -> bool:
        return self._skipped and not self.store.uploading()

    def _steps_due(self, at: TrainingPosition) -> bool:
        every = self.every_steps
        return every is not None and at.global_step // every > self._saved_at // every

    def _save(self, at: TrainingPosition, final: bool = False) -> None:
        self._skipped = not self.store.save(self.checkpoint, at, final=final)
        if not self._skipped:
            self._saved_at = at.global_step
