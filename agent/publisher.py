"""What each epoch produces for the outside world (metrics.json, the checkpoint, status.json,
TensorBoard events), uploaded by one background thread so that training does not wait on storage
(issue 12: a 60-epoch iris job spent 28 s training and 94 s between epochs).

Each kind of object has one slot, and a newer upload replaces an older one still waiting in it: only
the newest metrics.json or status.json matters, and several small objects waiting together go out in
one pass. A pass takes the slots in ORDER, so metrics.json for an epoch is always uploaded before
that epoch's checkpoint (a resumed run truncates its history to the checkpoint; the other order could
lose an epoch's entry). A failed upload is logged and the next one of its kind retries with newer
contents; drain() raises if the last upload of any kind failed, so a job never ends with an
incomplete final checkpoint or metrics.json.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("trainjobs.agent")

ORDER = ("metrics", "checkpoint", "status", "tensorboard")


class Publisher:
    def __init__(self) -> None:
        self._slots: dict[str, Callable[[], None]] = {}
        self._busy: set[str] = set()  # waiting in a slot or uploading now
        self._failed: dict[str, BaseException] = {}
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="publisher", daemon=True)
        self._thread.start()

    def put(self, kind: str, upload: Callable[[], None]) -> None:
        assert kind in ORDER, kind
        with self._cond:
            self._slots[kind] = upload
            self._busy.add(kind)
            self._cond.notify_all()

    def busy(self, kind: str) -> bool:
        with self._cond:
            return kind in self._busy

    def wait(self, kind: str) -> None:
        with self._cond:
            while kind in self._busy:
                self._cond.wait()

    def drain(self) -> None:
        """Until everything put so far is uploaded; raises the error of any kind whose last upload failed."""
        with self._cond:
            while self._busy:
                self._cond.wait()
            failed = dict(self._failed)
        if failed:
            error = next(iter(failed.values()))
            raise RuntimeError(f"could not upload the job's {', '.join(failed)}: {error}") from error

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._slots:
                    self._cond.wait()
                batch = [(kind, self._slots.pop(kind)) for kind in ORDER if kind in self._slots]
            for kind, upload in batch:
                try:
                    upload()
                    error: BaseException | None = None
                except Exception as exc:  # the next upload of this kind retries with newer contents
                    log.warning("uploading the %s failed (the next one retries): %s", kind, exc)
                    error = exc
                with self._cond:
                    if error is None:
                        self._failed.pop(kind, None)
                    else:
                        self._failed[kind] = error
                    if kind not in self._slots:
                        self._busy.discard(kind)
                    self._cond.notify_all()
