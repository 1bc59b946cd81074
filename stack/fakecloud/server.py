"""What every fake Google API here shares (the TPU API now, Compute Engine next): HTTP serving, a log of
the requests the real client sent and their counts by method, injected errors, a read-request rate
quota answered as the product answers it, google.rpc error bodies, a clock that moves the world along,
and a metadata server per fake host (metadata_server.py).

A subclass names its REST routes and answers them (`dispatch`), moves its world on (`tick`), and says
what a host's metadata server knows (`host_metadata`). Everything runs under one lock, so a response
is a consistent snapshot of the world.
"""

from __future__ import annotations

import json
import re
import time
from abc import ABC, abstractmethod
import threading
from collections import Counter, deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

from stack.fakecloud import metadata_server
from stack.fakecloud.metadata_server import Answer, HostView

# Each fake host's metadata server: /metadata/<machine>/<host number>/computeMetadata/v1/<path>.
METADATA_PATH = re.compile(r"^/metadata/([^/]+)/(\d+)/computeMetadata/v1/(.+)$")
# The fake's own counters (not a Google path): {"requests": {"GET list_nodes": n, ...}, "rate_limited": {...}}.
COUNTS_PATH = "/_fake/requests"
Route = tuple[str, re.Pattern[str], str]  # method, path (group 1: the resource name), action


def rfc3339_now() -> str:
    """Now, as Google's APIs write times (createTime, insertTime): RFC 3339 in UTC with a Z."""
    from datetime import UTC, datetime

    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class ApiError(Exception):
    """An error response: HTTP status, google.rpc code name, message, optional ErrorInfo reason and
    metadata, optional legacy `errors` entries (what Compute Engine's v1 API still sends)."""

    def __init__(self, http: int, status: str | None, message: str, reason: str | None = None,
                 errors: list[dict[str, str]] | None = None, info: dict[str, str] | None = None):
        super().__init__(message)
        self.http, self.status, self.message, self.reason = http, status, message, reason
        self.errors, self.info = errors, info


@dataclass
class ReadQuota:
    """The project's read-request rate quota (Google's "Read requests per minute"): at most `limit` GETs
    in any `window_s`; the rest are refused without being served."""

    limit: int
    window_s: float
    served: deque[float] = field(default_factory=deque)

    def admits(self, now: float) -> bool:
        while self.served and self.served[0] <= now - self.window_s:
            self.served.popleft()
        if len(self.served) >= self.limit:
            return False
        self.served.append(now)
        return True


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
        self.counts: Counter[str] = Counter()  # "METHOD action" -> requests served, errors included
        self.rate_limited: Counter[str] = Counter()  # "METHOD action" -> requests refused by the read quota
        self._injected: list[_Injected] = []
        self._read_quota: ReadQuota | None = None
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

    def rate_limit_error(self, quota: ReadQuota) -> ApiError:
        """What this product answers a read over the project's rate quota."""
        return ApiError(429, "RESOURCE_EXHAUSTED", quota_message(self.domain, quota), reason="RATE_LIMIT_EXCEEDED",
                        info=quota_info(self.domain, quota))

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

    def limit_reads(self, per_window: int | None, window_s: float = 60.0) -> None:
        """From now on at most `per_window` read requests (GETs) in any `window_s` are served; the rest get
        the product's rate-limit error (rate_limit_error). None lifts the quota."""
        with self.lock:
            self._read_quota = ReadQuota(per_window, window_s) if per_window is not None else None

    def request_counts(self) -> dict[str, int]:
        """Requests received so far by "METHOD action" (e.g. "GET list_nodes"), refused ones included."""
        with self.lock:
            return dict(self.counts)

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
            if method == "GET" and url.path == COUNTS_PATH:
                return 200, json.dumps({"requests": dict(self.counts), "rate_limited": dict(self.rate_limited)}).encode()
            self.requests.append(RecordedRequest(method, url.path, query, body))
            try:
                payload = self._route(method, url.path, query, body or {})
                return 200, json.dumps(payload).encode()
            except ApiError as exc:
                error: dict[str, Any] = {"code": exc.http, "message": exc.message}
                if exc.errors is not None:
                    error["errors"] = exc.errors
                if exc.status:
                    error["status"] = exc.status
                if exc.reason:
                    error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": exc.reason,
                                         "domain": self.domain, **({"metadata": exc.info} if exc.info else {})}]
                return exc.http, json.dumps({"error": error}).encode()

    def _route(self, method: str, path: str, query: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        for verb, pattern, action in self.routes:
            if verb == method and (m := pattern.match(path)):
                break
        else:
            raise ApiError(404, "NOT_FOUND", f"no route for {method} {path}")
        key = f"{method} {action}"
        self.counts[key] += 1
        if method == "GET" and self._read_quota is not None and not self._read_quota.admits(time.monotonic()):
            self.rate_limited[key] += 1
            raise self.rate_limit_error(self._read_quota)
        for injected in self._injected:
            if injected.times > 0 and injected.method == method and injected.path_contains in path:
                injected.times -= 1
                raise injected.error
        return self.dispatch(action, m.group(1), query, body)

    def metadata(self, machine: str, host: int, method: str, path: str, query: dict[str, str], body: bytes,
                 flavor: str | None) -> Answer:
        """What a host's metadata server answers (computeMetadata/v1/...)."""
        return metadata_server.answer(self.lock, lambda: self.host_metadata(machine, host), method, path, query,
                                      body, flavor)

    def metadata_url(self, machine: str, host: int) -> str:
        return f"{self.url}/metadata/{machine}/{host}/computeMetadata/v1"


def quota_message(service: str, quota: ReadQuota) -> str:
    # Google's words for a rate quota (the same on every API behind the Service Control quota system).
    return (f"Quota exceeded for quota metric 'Read requests' and limit 'Read requests per minute' of service "
            f"'{service}' for consumer 'project_number:123456789012'.")


def quota_info(service: str, quota: ReadQuota) -> dict[str, str]:
    return {"service": service, "consumer": "projects/123456789012", "quota_metric": f"{service}/read_requests",
            "quota_limit": "ReadRequestsPerMinutePerProject", "quota_limit_value": str(quota.limit)}


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
