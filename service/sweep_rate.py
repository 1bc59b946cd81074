"""How many sweeps one API key may submit a minute (issue 36, 1).

Checking a sweep costs the API tens of milliseconds of CPU at most (trainjobs/spec/sweep.py bounds it),
but a key could still send them back to back and keep the parsing threads busy for everyone. A key may
submit TRAINJOBS_SWEEPS_PER_MINUTE (20) sweeps in any 60 s, refused ones included (their checks cost the
same); one more is answered 429 with Retry-After, the seconds until the oldest leaves the window, before
its body is validated. Read at each request, so an operator's change needs no restart; counted per server
process, like the stream limits (service/stream_slots.py).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable

from service.db.quotas import env_int

PER_MINUTE_ENV = "TRAINJOBS_SWEEPS_PER_MINUTE"
DEFAULT_PER_MINUTE = 20
WINDOW_S = 60.0
MAX_KEYS = 10_000  # keys remembered; only keys the database accepted are counted


class TooManySweeps(Exception):
    def __init__(self, per_minute: int, retry_after_s: int) -> None:
        super().__init__(f"this API key submitted {per_minute} sweeps in the last minute, the most one key may "
                         f"({PER_MINUTE_ENV}): try again in {retry_after_s} s")
        self.retry_after_s = retry_after_s


def per_minute() -> int:
    if (value := env_int(PER_MINUTE_ENV, DEFAULT_PER_MINUTE)) < 1:
        raise ValueError(f"{PER_MINUTE_ENV}={os.environ.get(PER_MINUTE_ENV)!r} must be at least 1")
    return value


class SweepRate:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._submits: dict[bytes, deque[float]] = {}

    def take(self, key: bytes) -> None:
        """Count one submit of `key` (a key's hash), or raise TooManySweeps when it has none left."""
        limit, now = per_minute(), self._clock()
        with self._lock:
            times = self._submits.setdefault(key, deque())
            while times and times[0] <= now - WINDOW_S:
                times.popleft()
            if len(times) >= limit:
                raise TooManySweeps(limit, max(1, math.ceil(times[0] + WINDOW_S - now)))
            times.append(now)
            if len(self._submits) > MAX_KEYS:  # forget keys with nothing in the window
                for idle in [k for k, t in self._submits.items() if not t or t[-1] <= now - WINDOW_S]:
                    del self._submits[idle]


RATE = SweepRate()  # one per process
