"""What every fake Google API here shares (the TPU API now, Compute Engine next): HTTP serving, a log of
the requests the real client sent, injected errors, google.rpc error bodies, a clock that moves the
world along, and a metadata server per fake host (metadata_server.py).

A subclass names its REST routes and answers them (`dispatch`), moves its world on (`tick`), and says
what a host's metadata server knows (`host_metadata`). Everything runs under one lock, so a response
is a consistent snapshot of the world.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

from stack.fakecloud import metadata_server
from stack.fakecloud.metadata_server import Answer, HostView

# Each fake host's metadata server: /metadata/<machine>/<host number>/computeMetadata/v1/<path>.
METADATA_PATH = re.compile(r"^/metadata/([^/]+)/(\d+)/computeMetadata/v1/(.+)$")
Route = tuple[str, re.Pattern[str], str]  # method, path (group 1: the resource name), action


def rfc3339_now() -> str:
    """Now, as Google's APIs write times (createTime, insertTime): RFC 3339 in UTC with a Z."""
    from datetime import UTC, datetime

    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class ApiError(Exception):
    """An error response: HTTP status, google.rpc code name, message, optional ErrorInfo reason."""

    def __init__(self, http: int, status: str, message: str, reason: str | None = None):
        super().__init__(message)
        self.http, self.status, self.message, self.reason = http, status, message, reason


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    body: dict[str, Any] | None


@dataclass
class _Injected:
    method: str
    path_contains: str
    error: ApiError
    times: int


class FakeGoogleApi(ABC):
    routes: list[Route] = []
    domain = "googleapis.com"  # ErrorInfo.domain of injected errors
    tick_s = 0.05

    def __init__(self, lock: threading.RLock, host: str = "127.0.0.1", port: int = 0):
        self.lock = lock
        self.requests: list[RecordedRequest] = []
        self._injected: list[_Injected] = []
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        self._stopping = threading.Event()

    # --- to override ---

    @abstractmethod
    def dispatch(self, action: str, name: str, query: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        """The JSON answer to one routed request; raise ApiError for an error response."""

    def tick(self) -> None:
        """Move the world on; called every tick_s under the lock."""

    def host_metadata(self, machine: str, host: int) -> HostView | None:
        """What that host's metadata server knows (stack/fakecloud/metadata_server.py), or None if there is
        no such machine; called under the lock."""
        return None

    def on_stop(self) -> None:
        """Shut down whatever the fake machines run."""

    # --- lifecycle ---

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Self:
        threading.Thread(target=self._server.serve_forever, daemon=True, name="fake-api-http").start()
        threading.Thread(target=self._tick_loop, daemon=True, name="fake-api-clock").start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self.on_stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def fail_next(self, method: str, path_contains: str, http: int, status: str, message: str,
                  reason: str | None = None, times: int = 1) -> None:
        """The next `times` matching requests get this error (rate limits, 5xx, permission denied)."""
        with self.lock:
            self._injected.append(_Injected(method, path_contains, ApiError(http, status, message, reason), times))

    # --- serving ---

    def _tick_loop(self) -> None:
        while not self._stopping.wait(self.tick_s):
            with self.lock:
                self.tick()

    def handle(self, method: str, raw_path: str, body: dict[str, Any] | None) -> tuple[int, bytes]:
        """(HTTP status, JSON body), serialised under the lock: the world moves on between requests."""
        url = urlsplit(raw_path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        with self.lock:
            self.requests.append(RecordedRequest(method, url.path, query, body))
            try:
                payload = self._route(method, url.path, query, body or {})
                return 200, json.dumps(payload).encode()
            except ApiError as exc:
                error: dict[str, Any] = {"code": exc.http, "message": exc.message, "status": exc.status}
                if exc.reason:
                    error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": exc.reason,
                                         "domain": self.domain}]
                return exc.http, json.dumps({"error": error}).encode()

    def _route(self, method: str, path: str, query: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        for injected in self._injected:
            if injected.times > 0 and injected.method == method and injected.path_contains in path:
                injected.times -= 1
                raise injected.error
        for verb, pattern, action in self.routes:
            if verb == method and (m := pattern.match(path)):
                return self.dispatch(action, m.group(1), query, body)
        raise ApiError(404, "NOT_FOUND", f"no route for {method} {path}")

    def metadata(self, machine: str, host: int, method: str, path: str, query: dict[str, str], body: bytes,
                 flavor: str | None) -> Answer:
        """What a host's metadata server answers (computeMetadata/v1/...)."""
        return metadata_server.answer(self.lock, lambda: self.host_metadata(machine, host), method, path, query,
                                      body, flavor)

    def metadata_url(self, machine: str, host: int) -> str:
        return f"{self.url}/metadata/{machine}/{host}/computeMetadata/v1"


def _handler(api: FakeGoogleApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            headers: dict[str, str] = {}
            if m := METADATA_PATH.match(urlsplit(self.path).path):
                query = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
                status, data, headers = api.metadata(m.group(1), int(m.group(2)), self.command, m.group(3), query, raw,
                                                     self.headers.get("Metadata-Flavor"))
                content_type = "application/json" if data.startswith(b"{") else "application/text"
            else:
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = {"not json": raw.decode(errors="replace")}
                status, data = api.handle(self.command, self.path, body)
                content_type = "application/json"
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
