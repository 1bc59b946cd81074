"""How many follow-streams (`?follow=true`) one API key, and one API process, hold at once.

Each stream polls the database and storage for as long as its job runs: 1,500 streams from one key
raised another project's list latency from 12 to 263 ms (issue 18). A key may hold
TRAINJOBS_STREAMS_PER_KEY (20) and a process TRAINJOBS_STREAMS_PER_PROCESS (500); a stream over
either is answered 429 with Retry-After before it starts. The limits are read at each request, so
an operator's change needs no restart.
"""

from __future__ import annotations

import os
import threading

from service.db.quotas import env_int

PER_KEY_ENV = "TRAINJOBS_STREAMS_PER_KEY"
PER_PROCESS_ENV = "TRAINJOBS_STREAMS_PER_PROCESS"
DEFAULT_PER_KEY = 20
DEFAULT_PER_PROCESS = 500
RETRY_AFTER_S = 10  # streams last as long as jobs run: a client retrying sooner finds the same


class TooManyStreams(Exception):
    """The message is for the client."""


def _limit(env: str, default: int) -> int:
    """env_int (the settings' one parser), and at least 1: a cap of 0 streams would refuse them all."""
    if (value := env_int(env, default)) < 1:
        raise ValueError(f"{env}={os.environ.get(env)!r} must be at least 1")
    return value


class Slot:
    """One stream's place; released once, when the stream ends (release is idempotent)."""

    def __init__(self, slots: StreamSlots, key: bytes):
        self._slots, self._key, self._held = slots, key, True

    def release(self) -> None:
        with self._slots.lock:
            if not self._held:
                return
            self._held = False
            self._slots.release(self._key)


class StreamSlots:
    def __init__(self) -> None:
        self.lock = threading.Lock()  # routes take slots on worker threads, streams free them on the loop
        self._per_key: dict[bytes, int] = {}
        self._total = 0

    def in_use(self) -> int:
        with self.lock:
            return self._total

    def take(self, key: bytes) -> Slot:
        """A slot for one more stream of `key` (a key's hash), or TooManyStreams."""
        per_key, per_process = _limit(PER_KEY_ENV, DEFAULT_PER_KEY), _limit(PER_PROCESS_ENV, DEFAULT_PER_PROCESS)
        with self.lock:
            if self._per_key.get(key, 0) >= per_key:
                raise TooManyStreams(f"this API key already follows {per_key} streams, the most one key may; "
                                     "close one (or poll GET /v1/jobs/{id}) and try again")
            if self._total >= per_process:
                raise TooManyStreams(f"this server already serves {per_process} streams, the most it takes; "
                                     "try again shortly")
            self._per_key[key] = self._per_key.get(key, 0) + 1
            self._total += 1
        return Slot(self, key)

    def release(self, key: bytes) -> None:
        """Called by Slot.release, with the lock held."""
        left = self._per_key.get(key, 0) - 1
        if left > 0:
            self._per_key[key] = left
        else:
            self._per_key.pop(key, None)
        self._total -= 1


SLOTS = StreamSlots()  # one per process: the per-process limit is this process's
