"""The fake Cloud TPU API v2 over HTTP: the REST paths google-cloud-tpu's REST transport calls
(google/cloud/tpu_v2/services/tpu/transports/rest_base.py), camelCase JSON, long-running operations and
google.rpc error bodies. Tests import it; `trainjobs fake-cloud` serves it.

    with FakeTpuApi(sandbox=tmp_path, env={"STORAGE_EMULATOR_HOST": ...}) as api:
        os.environ["TRAINJOBS_TPU_API_ENDPOINT"] = api.url
        api.stock_out("us-central1-a"); api.preempt("tj-...-a1"); api.requests  # what the client sent
"""

from __future__ import annotations

import json
import re
import tempfile
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

from stack.fakecloud.hosts import FakeHosts
from stack.fakecloud.tpu_inventory import ApiError, Machine, Timing, TpuInventory, devices_per_host

_LOC = r"projects/[^/]+/locations/[^/]+"
ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("POST", re.compile(rf"^/v2/({_LOC})/nodes$"), "create_node"),
    ("GET", re.compile(rf"^/v2/({_LOC})/nodes$"), "list_nodes"),
    ("GET", re.compile(rf"^/v2/({_LOC}/nodes/[^/:]+)$"), "get_node"),
    ("DELETE", re.compile(rf"^/v2/({_LOC}/nodes/[^/:]+)$"), "delete_node"),
    ("POST", re.compile(rf"^/v2/({_LOC})/queuedResources$"), "create_queued"),
    ("GET", re.compile(rf"^/v2/({_LOC})/queuedResources$"), "list_queued"),
    ("GET", re.compile(rf"^/v2/({_LOC}/queuedResources/[^/:]+)$"), "get_queued"),
    ("DELETE", re.compile(rf"^/v2/({_LOC}/queuedResources/[^/:]+)$"), "delete_queued"),
    ("GET", re.compile(rf"^/v2/({_LOC}/operations/[^/:]+)$"), "get_operation"),
]
# Each fake host's metadata server: /metadata/<node id>/<host number>/computeMetadata/v1/<path>.
METADATA_PATH = re.compile(r"^/metadata/([^/]+)/(\d+)/computeMetadata/v1/(.+)$")


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


class FakeTpuApi:
    def __init__(self, *, sandbox: Path | None = None, env: dict[str, str] | None = None, boot: bool = True,
                 local_devices: int = 2, timing: Timing | None = None, host: str = "127.0.0.1", port: int = 0):
        self.sandbox = sandbox or Path(tempfile.mkdtemp(prefix="fake-tpu-"))
        self.world = TpuInventory(timing or Timing(), local_devices, boot, dict(env or {}))
        self.requests: list[RecordedRequest] = []
        self._injected: list[_Injected] = []
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeTpuApi:
        for target in (self._server.serve_forever, self._tick_loop):
            t = threading.Thread(target=target, daemon=True, name=f"fake-tpu-{target.__name__}")
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        with self.world.lock:
            machines = list(self.world.machines.values())
        for m in machines:
            if m.hosts is not None:
                m.hosts.stop(grace_s=2.0)

    def __enter__(self) -> FakeTpuApi:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # --- test hooks ---

    def stock_out(self, zone: str, out: bool = True) -> None:
        """The zone has (or again has) no capacity for any TPU type."""
        with self.world.lock:
            (self.world.stocked_out.add if out else self.world.stocked_out.discard)(zone)

    def set_quota(self, zone: str, chips: int) -> None:
        with self.world.lock:
            self.world.quota_chips[zone] = chips

    def preempt(self, node_id: str) -> None:
        """Google takes a spot node back: PREEMPTED, its hosts shut down; the node stays until deleted."""
        with self.world.lock:
            self.world.preempt(self._node_name(node_id))

    def fail_next(self, method: str, path_contains: str, http: int, status: str, message: str,
                  reason: str | None = None, times: int = 1) -> None:
        """The next `times` matching requests get this error (rate limits, 5xx, permission denied)."""
        with self.world.lock:
            self._injected.append(_Injected(method, path_contains, ApiError(http, status, message, reason), times))

    def node(self, node_id: str) -> dict[str, Any] | None:
        with self.world.lock:
            m = self.world.machines.get(self._node_name(node_id))
            return json.loads(json.dumps(m.node)) if m else None

    def node_names(self) -> list[str]:
        with self.world.lock:
            return sorted(n.rsplit("/", 1)[-1] for n in self.world.machines)

    def queued_names(self) -> list[str]:
        with self.world.lock:
            return sorted(n.rsplit("/", 1)[-1] for n in self.world.queued)

    def hosts_running(self, node_id: str) -> bool:
        with self.world.lock:
            m = self.world.machines.get(self._node_name(node_id))
            return bool(m and m.hosts and m.hosts.running())

    def _node_name(self, node_id: str) -> str:
        matches = [n for n in self.world.machines if n.rsplit("/", 1)[-1] == node_id]
        if not matches:
            raise KeyError(f"no node {node_id}")
        return matches[0]

    # --- serving ---

    def _tick_loop(self) -> None:
        while not self._stop.wait(0.05):
            with self.world.lock:
                self.world.tick(self._boot)

    def _boot(self, machine: Machine) -> FakeHosts | None:
        node = machine.node
        script = (node.get("metadata") or {}).get("startup-script")
        if not script:
            return None
        node_id = node["name"].rsplit("/", 1)[-1]
        return FakeHosts(self.sandbox / node_id, script, hosts=len(node["networkEndpoints"]),
                         devices_per_host=min(self.world.local_devices, devices_per_host(node["acceleratorType"])),
                         env=self.world.env,
                         metadata_url=lambda host: f"{self.url}/metadata/{node_id}/{host}/computeMetadata/v1")

    def handle(self, method: str, raw_path: str, body: dict[str, Any] | None) -> tuple[int, bytes]:
        """(HTTP status, JSON body); serialised under the lock, as the world moves on between requests."""
        with self.world.lock:
            status, payload = self._respond(method, raw_path, body)
            return status, json.dumps(payload).encode()

    def metadata(self, node_id: str, host: int, path: str, flavor: str | None) -> tuple[int, bytes]:
        """The metadata server a host of node_id sees (computeMetadata/v1/...): the node's metadata as
        instance attributes, the host's worker number, a token for the VM's service account."""
        if flavor != "Google":  # as on GCE: refused without the header, so SSRF through a proxy fails
            return 403, b"Missing Metadata-Flavor:Google header."
        with self.world.lock:
            machine = next((m for n, m in self.world.machines.items() if n.rsplit("/", 1)[-1] == node_id), None)
            if machine is None:
                return 404, b"not found"
            attributes = {**(machine.node.get("metadata") or {}), "agent-worker-number": str(host)}
            project = machine.node["name"].split("/")[1]
        if path.startswith("instance/attributes/") and (key := path.removeprefix("instance/attributes/")) in attributes:
            return 200, attributes[key].encode()
        if path == "instance/service-accounts/default/token":
            return 200, json.dumps({"access_token": f"fake-token-{node_id}", "expires_in": 3599,
                                    "token_type": "Bearer"}).encode()
        if path == "project/project-id":
            return 200, project.encode()
        return 404, b"not found"

    def _respond(self, method: str, raw_path: str, body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        url = urlsplit(raw_path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        with self.world.lock:
            self.requests.append(RecordedRequest(method, url.path, query, body))
            try:
                for injected in self._injected:
                    if injected.times > 0 and injected.method == method and injected.path_contains in url.path:
                        injected.times -= 1
                        raise injected.error
                for verb, pattern, action in ROUTES:
                    if verb == method and (m := pattern.match(url.path)):
                        return 200, self._dispatch(action, m.group(1), query, body or {})
                raise ApiError(404, "NOT_FOUND", f"no route for {method} {url.path}")
            except ApiError as exc:
                error: dict[str, Any] = {"code": exc.http, "message": exc.message, "status": exc.status}
                if exc.reason:
                    error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": exc.reason,
                                         "domain": "tpu.googleapis.com"}]
                return exc.http, {"error": error}

    def _dispatch(self, action: str, name: str, query: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        w = self.world
        match action:
            case "create_node":
                if not query.get("nodeId"):
                    raise ApiError(400, "INVALID_ARGUMENT", "nodeId is required")
                return w.create_node(name, query["nodeId"], body)
            case "list_nodes":
                return {"nodes": [m.node for n, m in w.machines.items() if n.startswith(name + "/")]}
            case "get_node":
                return w.get_node(name)
            case "delete_node":
                return w.delete_node(name)
            case "create_queued":
                if not query.get("queuedResourceId"):
                    raise ApiError(400, "INVALID_ARGUMENT", "queuedResourceId is required")
                return w.create_queued(name, query["queuedResourceId"], body)
            case "list_queued":
                return {"queuedResources": [q for n, q in w.queued.items() if n.startswith(name + "/")]}
            case "get_queued":
                return w.get_queued(name)
            case "delete_queued":
                return w.delete_queued(name, force=query.get("force") == "true")
            case "get_operation":
                if name not in w.operations:
                    raise ApiError(404, "NOT_FOUND", f"Operation '{name}' was not found")
                return w.operations[name]
        raise AssertionError(action)


def _handler(api: FakeTpuApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if m := METADATA_PATH.match(urlsplit(self.path).path):
                status, data = api.metadata(m.group(1), int(m.group(2)), m.group(3), self.headers.get("Metadata-Flavor"))
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
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PATCH = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
