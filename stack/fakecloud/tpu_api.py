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
from pathlib import Path
from typing import Any

from stack.fakecloud.hosts import FakeHosts
from stack.fakecloud.metadata_server import HostView
from stack.fakecloud.server import ApiError, FakeGoogleApi, Route
from stack.fakecloud.tpu_inventory import Machine, Timing, TpuInventory, devices_per_host
from trainjobs.vm_metadata import HOST_KEY, STARTUP_SCRIPT_KEY

_LOC = r"projects/[^/]+/locations/[^/]+"
ROUTES: list[Route] = [
    ("POST", re.compile(rf"^/v2/({_LOC})/nodes$"), "create_node"),
    ("GET", re.compile(rf"^/v2/({_LOC})/nodes$"), "list_nodes"),
    ("GET", re.compile(rf"^/v2/({_LOC}/nodes/[^/:]+)$"), "get_node"),
    ("DELETE", re.compile(rf"^/v2/({_LOC}/nodes/[^/:]+)$"), "delete_node"),
    ("PATCH", re.compile(rf"^/v2/({_LOC}/nodes/[^/:]+)$"), "update_node"),
    ("POST", re.compile(rf"^/v2/({_LOC}/nodes/[^/:]+):getGuestAttributes$"), "get_guest_attributes"),
    ("POST", re.compile(rf"^/v2/({_LOC})/queuedResources$"), "create_queued"),
    ("GET", re.compile(rf"^/v2/({_LOC})/queuedResources$"), "list_queued"),
    ("GET", re.compile(rf"^/v2/({_LOC}/queuedResources/[^/:]+)$"), "get_queued"),
    ("DELETE", re.compile(rf"^/v2/({_LOC}/queuedResources/[^/:]+)$"), "delete_queued"),
    ("GET", re.compile(rf"^/v2/({_LOC}/operations/[^/:]+)$"), "get_operation"),
]


class FakeTpuApi(FakeGoogleApi):
    routes = ROUTES
    domain = "tpu.googleapis.com"

    def __init__(self, *, sandbox: Path | None = None, env: dict[str, str] | None = None, boot: bool = True,
                 local_devices: int = 2, timing: Timing | None = None, host: str = "127.0.0.1", port: int = 0):
        self.sandbox = sandbox or Path(tempfile.mkdtemp(prefix="fake-tpu-"))
        self.world = TpuInventory(timing or Timing(), local_devices, boot, dict(env or {}))
        super().__init__(self.world.lock, host, port)

    def on_stop(self) -> None:
        with self.world.lock:
            machines = list(self.world.machines.values())
        for m in machines:
            if m.hosts is not None:
                m.hosts.stop(grace_s=2.0)

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

    def guest_attributes(self, node_id: str, host: int = 0) -> dict[str, str]:
        """What a host of the node has written as guest attributes ("namespace/key" -> value)."""
        with self.world.lock:
            return dict(self.world.machines[self._node_name(node_id)].guest.get(host, {}))

    def node(self, node_id: str) -> dict[str, Any] | None:
        with self.world.lock:
            m = self.world.machines.get(self._node_name(node_id))
            return json.loads(json.dumps(m.node)) if m else None

    def node_state(self, node_id: str) -> str | None:
        """The node's state (READY, PREEMPTED...), None if there is no such node; no copy of the node made."""
        with self.world.lock:
            return next((m.node["state"] for n, m in self.world.machines.items() if n.rsplit("/", 1)[-1] == node_id),
                        None)

    def node_names(self) -> list[str]:
        with self.world.lock:
            return sorted(n.rsplit("/", 1)[-1] for n in self.world.machines)

    def queued_names(self) -> list[str]:
        with self.world.lock:
            return sorted(n.rsplit("/", 1)[-1] for n in self.world.queued)

    def _node_name(self, node_id: str) -> str:
        matches = [n for n in self.world.machines if n.rsplit("/", 1)[-1] == node_id]
        if not matches:
            raise KeyError(f"no node {node_id}")
        return matches[0]

    # --- the API ---

    def tick(self) -> None:
        self.world.tick(self._boot)

    def _boot(self, machine: Machine) -> FakeHosts | None:
        node = machine.node
        script = (node.get("metadata") or {}).get(STARTUP_SCRIPT_KEY)
        if not script:
            return None
        node_id = node["name"].rsplit("/", 1)[-1]
        return FakeHosts(self.sandbox / node_id, script, hosts=len(node["networkEndpoints"]),
                         devices_per_host=min(self.world.local_devices, devices_per_host(node["acceleratorType"])),
                         env=self.world.env, metadata_url=lambda host: self.metadata_url(node_id, host))

    def host_metadata(self, machine: str, host: int) -> HostView | None:
        """A TPU VM host sees its node's metadata as instance attributes, its own worker number, and its own
        guest attributes (each host of a slice has its own)."""
        found = next((m for n, m in self.world.machines.items() if n.rsplit("/", 1)[-1] == machine), None)
        if found is None or not 0 <= host < len(found.node["networkEndpoints"]):
            return None
        attributes = {**(found.node.get("metadata") or {}), HOST_KEY: str(host)}
        return HostView(attributes, found.node["name"].split("/")[1], found.guest.setdefault(host, {}))

    def dispatch(self, action: str, name: str, query: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
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
            case "update_node":
                return w.update_node(name, query.get("updateMask", ""), body)
            case "get_guest_attributes":
                return w.guest_attributes(name, str(body.get("queryPath") or ""),
                                          [str(i) for i in body.get("workerIds") or []])
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
