"""Following a real job: a line the agent writes reaches a following client. The streams themselves:
tests/integration/test_streaming.py."""

from __future__ import annotations

import re
from datetime import datetime

import pytest

from tests.support.jobs import digits_spec
from tests.support import scaled
from tests.support.streams import Follower
from tests.support.streams import queued_jobs_polled_like_running_ones  # noqa: F401 - an autouse fixture


LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")



@pytest.mark.tf
def test_a_line_the_agent_writes_reaches_a_following_client_within_2_seconds(api, local_stack):
    """The delay is measured per line: the time the client got it minus the time in the line, which
    the agent's logging stamped as it wrote it (same clock). Lines the agent wrote before the client
    was following are left out: those measure when the test connected, not the stream."""
    spec = digits_spec(model={"name": "mlp"}, strategy="default", accelerator={"type": "cpu"},
                       training={"epochs": 12})
    job = api.post("/v1/jobs", json=spec).json()
    follower = Follower(api, f"/v1/jobs/{job['id']}/logs?follow=true")
    events = follower.until("end", timeout=300)
    assert events[-1].data == {"status": "SUCCEEDED"}
    lines = [e for e in events if e.name == "log"]
    assert any("epoch 12/12" in e.data["line"] for e in lines)
    connected = events[0].received
    delays = []
    for event in lines:
        if match := LOG_TIME.match(event.data["line"]):
            written = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if written > connected + 0.5:
                delays.append(event.received - written)
    epoch_lines = [e for e in lines if "epoch " in e.data["line"] and LOG_TIME.match(e.data["line"])]
    assert len(delays) >= 10 and epoch_lines, f"too few lines written while following: {len(delays)}"
    delays.sort()
    median, p90 = delays[len(delays) // 2], delays[len(delays) * 9 // 10]
    summary = f"over {len(delays)} lines: median {median:.2f} s, p90 {p90:.2f} s, max {delays[-1]:.2f} s"
    print("line delay " + summary)
    # By design a line waits at most one log flush (1 s) and one poll (0.5 s) plus two storage round
    # trips. Nine lines in ten must make 2 s; the slowest may have lost the CPU for a while, as it does
    # when the suite's three processes share two cores (2.31 s seen in a CI run), but a stream that
    # stalls (a missed poll, a flush that waits for the epoch) still shows here.
    assert p90 <= scaled(2.0), summary
    assert delays[-1] <= scaled(5.0), summary
