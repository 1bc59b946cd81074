"""How often a driver reads a running job's status.json (issue 25).

Every read is a GCS request, and a thousand jobs read every second cost about $35 a day to learn that
nothing changed. A report that brings something new (state, phase, progress, metrics, runtime: what
a user sees, not the heartbeat) is followed by a read at the next poll, so a job's steps and its end
are seen at once; each read that brings nothing new doubles the wait, up to `idle_polls` polls
(10 s at the driver's 1 s: the agent's own heartbeat period, far inside the 120 s a silent agent is
given). A cancel does not wait for this: the driver still looks at its row every poll.
"""

from __future__ import annotations

import time

from trainjobs.messages import AgentReport


class StatusCadence:
    def __init__(self, poll_s: float, idle_polls: int):
        self.poll_s, self.idle_polls = poll_s, max(1, idle_polls)
        self._polls = 1  # polls to wait after the last read
        self._next = 0.0  # monotonic time of the next read
        self._seen: object = None  # what a user sees of the last report

    def due(self) -> bool:
        return time.monotonic() >= self._next

    def read(self, report: AgentReport | None) -> None:
        """After a read: soon again if it brought news, else later."""
        seen = None if report is None else report.model_dump(exclude={"heartbeat_at"})
        self._polls = 1 if seen != self._seen else min(self._polls * 2, self.idle_polls)
        self._seen = seen
        # A little short of the whole wait: the driver wakes every poll_s and a read due a moment after
        # a wake would otherwise wait one more poll.
        self._next = time.monotonic() + (self._polls - 0.5) * self.poll_s
