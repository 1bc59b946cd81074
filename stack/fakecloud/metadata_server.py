"""Each fake host's metadata server: the part of computeMetadata/v1 the startup script, the agent and its
watchdog use, answered as metadata.google.internal answers it.

  GET  instance/attributes/KEY                      one attribute's value (text)
  GET  instance/attributes/?recursive=true          all of them as JSON, with an ETag; with
       &wait_for_change=true&last_etag=E&timeout_sec=N  it answers once they differ from E, or after N s
  PUT  instance/guest-attributes/NAMESPACE/KEY      the VM writes a guest attribute (only from inside: the
  GET  instance/guest-attributes/NAMESPACE/KEY      cloud APIs can read them, never write them), refused
                                                    unless metadata has enable-guest-attributes=TRUE
  GET  instance/service-accounts/default/token      a fake access token
  GET  project/project-id

Requests without `Metadata-Flavor: Google` are refused, as on Google's, so SSRF through a proxy fails.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from trainjobs.vm_metadata import GUEST_ATTRIBUTES_KEY

MAX_WAIT_S = 300.0  # longest wait_for_change the fake holds a request open
POLL_S = 0.05


@dataclass
class HostView:
    """What one host's metadata server knows, read under the fake API's lock."""

    attributes: dict[str, str]
    project: str
    guest: dict[str, str] = field(default_factory=dict)  # "namespace/key" -> value: the world's own dict


Answer = tuple[int, bytes, dict[str, str]]  # status, body, extra headers


def etag(attributes: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(attributes, sort_keys=True).encode()).hexdigest()[:16]


def answer(lock: threading.RLock, read: Callable[[], HostView | None], method: str, path: str,
           query: dict[str, str], body: bytes, flavor: str | None) -> Answer:
    """`read` gives the host's state (None: no such machine or host); it is called under `lock`."""
    if flavor != "Google":
        return 403, b"Missing Metadata-Flavor:Google header.", {}

    def view() -> HostView | None:
        with lock:
            return read()

    if path.startswith("instance/guest-attributes/"):
        with lock:  # a write to the world's own dict
            known = read()
            return (404, b"not found", {}) if known is None else _guest_attribute(
                known, method, path.removeprefix("instance/guest-attributes/"), body)
    known = view()
    if known is None:
        return 404, b"not found", {}
    if method != "GET":
        return 405, b"Method not allowed", {}
    if path in ("instance/attributes/", "instance/attributes") and query.get("recursive") == "true":
        return _all_attributes(view, known, query)
    if path.startswith("instance/attributes/") and (key := path.removeprefix("instance/attributes/")) in known.attributes:
        return 200, known.attributes[key].encode(), {}
    if path == "instance/service-accounts/default/token":
        return 200, json.dumps({"access_token": "fake-vm-token", "expires_in": 3599, "token_type": "Bearer"}).encode(), {}
    if path == "project/project-id":
        return 200, known.project.encode(), {}
    return 404, b"not found", {}


def _all_attributes(view: Callable[[], HostView | None], known: HostView, query: dict[str, str]) -> Answer:
    if query.get("wait_for_change") == "true":
        try:
            timeout = min(MAX_WAIT_S, float(query.get("timeout_sec") or MAX_WAIT_S))
        except ValueError:
            return 400, b"timeout_sec must be a number", {}
        last, deadline = query.get("last_etag", ""), time.monotonic() + timeout
        # Without last_etag the real server waits for the next change; the fake compares with now's.
        last = last or etag(known.attributes)
        while etag(known.attributes) == last and time.monotonic() < deadline:
            time.sleep(POLL_S)  # outside the lock: the world moves on meanwhile
            if (again := view()) is None:
                return 404, b"not found", {}
            known = again
    return 200, json.dumps(known.attributes).encode(), {"ETag": etag(known.attributes)}


def _guest_attribute(known: HostView, method: str, key: str, body: bytes) -> Answer:
    if known.attributes.get(GUEST_ATTRIBUTES_KEY, "").upper() != "TRUE":
        return 403, b"Guest attributes endpoint access is disabled.", {}
    if key.count("/") != 1 or not all(key.split("/")):
        return 400, b"a guest attribute is NAMESPACE/KEY", {}
    if method == "PUT":
        known.guest[key] = body.decode()
        return 200, b"", {}
    if method == "GET" and key in known.guest:
        return 200, known.guest[key].encode(), {}
    return 404, b"not found", {}
