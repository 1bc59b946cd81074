"""What one staging may cost, and whether it should stop.

A source that is a huge tree fails while it is being walked or listed, at the first file past
max_files or the first byte past max_bytes, not after it was read. Cancel (the driver's
should_stop) is checked between files and between chunks, so a long staging gives up promptly.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from worker.ports import StagingStopped
from worker.staging.errors import DatasetError

MAX_FILES_ENV = "TRAINJOBS_STAGING_MAX_FILES"
MAX_BYTES_ENV = "TRAINJOBS_STAGING_MAX_BYTES"
FETCH_TIMEOUT_ENV = "TRAINJOBS_FETCH_TIMEOUT_S"
MEMORY_ENV = "TRAINJOBS_STAGING_MEMORY_MB"
TIMEOUT_ENV = "TRAINJOBS_STAGING_TIMEOUT_S"


@dataclass(frozen=True)
class StagingLimits:
    max_files: int = 100_000
    max_bytes: int = 10 << 30  # staging converts in memory: far past this it could not finish anyway
    fetch_timeout_s: float = 900.0  # one URL download, redirects included
    max_redirects: int = 5
    # One staging's process (worker/staging_child.py): its memory, the libraries it starts with included,
    # and its time, downloads included; past either the job fails at STAGING and the worker goes on.
    memory_mb: int = 2048
    timeout_s: float = 3600.0

    @classmethod
    def from_env(cls) -> StagingLimits:
        d = cls()
        return cls(
            max_files=int(os.environ.get(MAX_FILES_ENV, d.max_files)),
            max_bytes=int(os.environ.get(MAX_BYTES_ENV, d.max_bytes)),
            fetch_timeout_s=float(os.environ.get(FETCH_TIMEOUT_ENV, d.fetch_timeout_s)),
            memory_mb=int(_positive(MEMORY_ENV, d.memory_mb)),
            timeout_s=_positive(TIMEOUT_ENV, d.timeout_s),
        )


def _positive(name: str, default: float) -> float:
    """A positive number from the environment; a bad one is refused naming its variable."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ValueError(f"{name} must be a positive number, not {text!r}")
    return value


class StagingBudget:
    """Counts the files and bytes one source holds, as they are found; checks for a stop."""

    def __init__(self, limits: StagingLimits, should_stop: Callable[[], bool] = lambda: False):
        self.limits, self.should_stop = limits, should_stop
        self.files = self.bytes = 0

    def check_stop(self) -> None:
        if self.should_stop():
            raise StagingStopped("staging stopped: the job was cancelled or the worker is stopping")

    def count(self, size: int, source: str) -> None:
        """One more file of `size` bytes in `source`; DatasetError once the source is over a limit."""
        self.check_stop()
        self.files += 1
        self.bytes += size
        if self.files > self.limits.max_files:
            raise DatasetError(f"{source} holds more than {self.limits.max_files} files, the most one dataset may have")
        self.check_bytes(self.bytes, source)

    def check_bytes(self, total: int, source: str) -> None:
        if total > self.limits.max_bytes:
            raise DatasetError(f"{source} holds more than {self.limits.max_bytes} bytes, the most one dataset may have")
