"""A client of the API's server-sent event streams (GET .../logs?follow=true, .../metrics?follow=true)."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.support import scaled


@dataclass
class Event:
    name: str
    data: dict
    id: str | None
    received: float  # time.time() when it arrived


def sse(response: httpx.Response) -> Iterator[Event]:
    name, data, event_id = "message", "", None
    for line in response.iter_lines():
        if line == "":
            if data:
                yield Event(name, json.loads(data), event_id, time.time())
            name, data, event_id = "message", "", None
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                name = value
            elif field == "data":
                data += value
            elif field == "id":
                event_id = value


class Follower:
    """A client following a stream on a thread; events arrive on a queue."""

    def __init__(self, api: httpx.Client, path: str, headers: dict[str, str] | None = None):
        self.events: queue.Queue[Event | BaseException] = queue.Queue()
        self.status_code: int | None = None
        self.content_type = ""

        def run() -> None:
            try:
                with api.stream("GET", path, headers=headers or {}, timeout=scaled(120)) as response:
                    self.status_code, self.content_type = response.status_code, response.headers["content-type"]
                    for event in sse(response):
                        self.events.put(event)
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                self.events.put(exc)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def next(self, timeout: float = 10) -> Event:
        item = self.events.get(timeout=scaled(timeout))
        if isinstance(item, BaseException):
            raise item
        return item

    def until(self, name: str, timeout: float = 10) -> list[Event]:
        seen = []
        while True:
            seen.append(self.next(timeout))
            if seen[-1].name == name:
                return seen


@pytest.fixture(autouse=True)
def queued_jobs_polled_like_running_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests follow queued jobs (no worker runs here) as if they ran; that a queued job's
    stream polls slowly is tests/integration/test_stream_limits.py's. The API runs in this process."""
    from service.routes import streams

    monkeypatch.setattr(streams, "QUEUED_POLL_S", streams.POLL_S)
