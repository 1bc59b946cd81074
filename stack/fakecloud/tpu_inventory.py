"""The fake TPU API's world: nodes, queued resources and long-running operations, kept as the camelCase
JSON the API returns, moved along by time (tick) and by test hooks (preempt, capacity, quota)."""

from __future__ import annotations

import itertools
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stack.fakecloud.hosts import FakeHosts
from stack.fakecloud.server import ApiError
from stack.fakecloud.server import rfc3339_now as _now
from trainjobs.catalogue import TPU_GENERATIONS

NODE_TYPE = "type.googleapis.com/google.cloud.tpu.v2.Node"
QUEUED_TYPE = "type.googleapis.com/google.cloud.tpu.v2.QueuedResource"
EMPTY_TYPE = "type.googleapis.com/google.protobuf.Empty"
METADATA_TYPE = "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
_TYPE = re.compile(r"^(v2|v3|v4|v5p|v5litepod|v6e)-(\d+)$")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)s$")


@dataclass
class Timing:
    boot_s: float = 0.5  # CREATING -> READY
    delete_s: float = 0.2  # DELETING -> gone
    shutdown_grace_s: float = 5.0  # SIGTERM -> SIGKILL on delete or preemption


@dataclass
class Machine:
    node: dict[str, Any]
    ready_at: float
    gone_at: float | None = None
    hosts: FakeHosts | None = None
    waiting_ops: list[str] = field(default_factory=list)  # done when the node is READY (create) or gone (delete)
    guest: dict[int, dict[str, str]] = field(default_factory=dict)  # host -> "namespace/key" -> value


class TpuInventory:
    def __init__(self, timing: Timing, local_devices: int, boot: bool, env: dict[str, str]):
        self.timing, self.local_devices, self.boot, self.env = timing, local_devices, boot, env
        self.lock = threading.RLock()
        self.machines: dict[str, Machine] = {}  # full node name -> machine
        self.queued: dict[str, dict[str, Any]] = {}  # full queued resource name -> its JSON
        self.operations: dict[str, dict[str, Any]] = {}
        self.stocked_out: set[str] = set()  # zones with no capacity
        self.quota_chips: dict[str, int] = {}  # zone -> TPU chips the project may hold there
        self._deadline: dict[str, float | None] = {}  # queued resource -> when its queueing policy expires
        self._ids = itertools.count(1)

    # --- operations ---

    def operation(self, parent: str, verb: str, target: str, done: bool = False,
                  response: dict[str, Any] | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
        name = f"{parent}/operations/operation-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        op: dict[str, Any] = {"name": name, "done": done, "metadata": {
            "@type": METADATA_TYPE, "createTime": _now(), "target": target, "verb": verb, "apiVersion": "v2"}}
        if response is not None:
            op["response"] = response
        if error is not None:
            op["error"] = error
        self.operations[name] = op
        return op

    def _finish(self, op_name: str, response: dict[str, Any] | None = None, error: dict[str, Any] | None = None) -> None:
        op = self.operations[op_name]
        op["done"] = True
        if error is not None:
            op["error"] = error
        else:
            op["response"] = response or {"@type": EMPTY_TYPE}

    # --- nodes ---

    def create_node(self, parent: str, node_id: str, body: dict[str, Any], queued: str | None = None) -> dict[str, Any]:
        name = f"{parent}/nodes/{node_id}"
        zone = parent.rsplit("/", 1)[-1]
        if name in self.machines:
            raise ApiError(409, "ALREADY_EXISTS", f"Resource '{name}' already exists")
        tpu_type = self._check_node(body)
        if queued is None and (limit := self.quota_chips.get(zone)) is not None:
            held = sum(_chips(m.node["acceleratorType"]) for n, m in self.machines.items() if f"/{zone}/" in n)
            if held + _chips(tpu_type) > limit:
                raise ApiError(429, "RESOURCE_EXHAUSTED", f"Quota limit 'TPUS-per-project-per-zone' has been exceeded. "
                               f"Limit: {limit} in zone {zone}. Requested: {_chips(tpu_type)}, in use: {held}.",
                               reason="QUOTA_EXCEEDED")
        if queued is None and zone in self.stocked_out:
            return self.operation(parent, "create", name, done=True, error={
                "code": 8, "message": f'There is no more capacity in the zone "{zone}"; you can try in another zone '
                                      "where Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions) "
                                      f"[EID: 0x{uuid.uuid4().hex[:16]}]"})
        node = {**body, "name": name, "acceleratorType": tpu_type, "state": "CREATING", "createTime": _now(),
                "health": "HEALTHY", "apiVersion": "V2", "id": str(next(self._ids)),
                "networkEndpoints": [{"ipAddress": f"10.0.0.{i + 2}", "port": 8470} for i in range(_hosts(tpu_type))]}
        if queued is not None:
            node["queuedResource"] = queued
        machine = Machine(node, ready_at=time.monotonic() + self.timing.boot_s)
        self.machines[name] = machine
        op = self.operation(parent, "create", name)
        machine.waiting_ops.append(op["name"])
        return op

    def _check_node(self, body: dict[str, Any]) -> str:
        tpu_type = body.get("acceleratorType") or ""
        config = body.get("acceleratorConfig")
        if config and not tpu_type:
            generation = {"V2": "v2", "V3": "v3", "V4": "v4", "V5LITE_POD": "v5litepod", "V5P": "v5p", "V6E": "v6e",
                          2: "v2", 4: "v3", 7: "v4", 9: "v5litepod", 10: "v5p", 11: "v6e"}.get(config.get("type"))
            dims = [int(d) for d in str(config.get("topology", "")).split("x") if d.isdigit()]
            if generation is None or not dims:
                raise ApiError(400, "INVALID_ARGUMENT", f"Invalid acceleratorConfig {config}")
            chips = 1
            for d in dims:
                chips *= d
            tpu_type = f"{generation}-{chips * TPU_GENERATIONS[generation].units_per_chip}"
        if not _TYPE.match(tpu_type):
            raise ApiError(400, "INVALID_ARGUMENT", f'Accelerator type "{tpu_type}" is not supported')
        if not body.get("runtimeVersion"):
            raise ApiError(400, "INVALID_ARGUMENT", "Runtime version is required")
        return tpu_type

    def get_node(self, name: str) -> dict[str, Any]:
        if (machine := self.machines.get(name)) is None:
            raise ApiError(404, "NOT_FOUND", f"Resource '{name}' was not found")
        return machine.node

    # Node fields nodes.patch may change (UpdateNodeRequest.update_mask, google/cloud/tpu/v2/cloud_tpu.proto).
    UPDATABLE = ("description", "tags", "labels", "metadata", "networkConfig.enableExternalIps")

    def update_node(self, name: str, mask: str, body: dict[str, Any]) -> dict[str, Any]:
        machine = self.machines.get(name)
        if machine is None:
            raise ApiError(404, "NOT_FOUND", f"Resource '{name}' was not found")
        paths = [p.strip() for p in mask.split(",") if p.strip()]
        if not paths:
            raise ApiError(400, "INVALID_ARGUMENT", "update_mask is required")
        for path in paths:
            if path not in self.UPDATABLE:
                raise ApiError(400, "INVALID_ARGUMENT", f"Field '{path}' cannot be updated; updatable fields: "
                               f"{', '.join(self.UPDATABLE)}")
            if path == "networkConfig.enableExternalIps":
                machine.node.setdefault("networkConfig", {})["enableExternalIps"] = bool(
                    (body.get("networkConfig") or {}).get("enableExternalIps"))
            elif path in body:
                machine.node[path] = body[path]  # a map or list field is replaced whole, as the API does
            else:
                machine.node.pop(path, None)
        return self.operation(name.rsplit("/nodes/", 1)[0], "update", name, done=True,
                              response={"@type": NODE_TYPE, **machine.node})

    def guest_attributes(self, name: str, query_path: str, worker_ids: list[str]) -> dict[str, Any]:
        """nodes.getGuestAttributes: one GuestAttributes per worker asked for (all when none is)."""
        machine = self.machines.get(name)
        if machine is None:
            raise ApiError(404, "NOT_FOUND", f"Resource '{name}' was not found")
        hosts = len(machine.node["networkEndpoints"])
        if any(not w.isdigit() or int(w) >= hosts for w in worker_ids):
            raise ApiError(400, "INVALID_ARGUMENT", f"worker ids {worker_ids} are not all in 0..{hosts - 1}")
        workers = [int(w) for w in worker_ids] or list(range(hosts))
        return {"guestAttributes": [{"queryPath": query_path, "queryValue": {"items": guest_items(
            machine.guest.get(w, {}), query_path)}} for w in workers]}

    def delete_node(self, name: str) -> dict[str, Any]:
        machine = self.machines.get(name)
        if machine is None:
            raise ApiError(404, "NOT_FOUND", f"Resource '{name}' was not found")
        if machine.gone_at is None:
            machine.node["state"] = "DELETING"
            machine.gone_at = time.monotonic() + self.timing.delete_s
            self._shut_down(machine)
            for op_name in machine.waiting_ops:  # a create still in flight ends with the node gone
                self._finish(op_name, error={"code": 10, "message": f"Node {name} was deleted while being created"})
            machine.waiting_ops.clear()
        op = self.operation(name.rsplit("/nodes/", 1)[0], "delete", name)
        machine.waiting_ops.append(op["name"])
        return op

    def preempt(self, name: str) -> None:
        machine = self.machines[name]
        machine.node["state"] = "PREEMPTED"
        machine.node["health"] = "UNHEALTHY_MAINTENANCE"
        self._shut_down(machine)
        if (qr := self.queued.get(machine.node.get("queuedResource", ""))) is not None:
            qr["state"] = {"state": "SUSPENDED", "stateInitiator": "SERVICE"}

    def _shut_down(self, machine: Machine) -> None:
        hosts, machine.hosts = machine.hosts, None
        if hosts is not None:
            threading.Thread(target=hosts.stop, args=(self.timing.shutdown_grace_s,), daemon=True).start()

    # --- queued resources ---

    def create_queued(self, parent: str, qr_id: str, body: dict[str, Any]) -> dict[str, Any]:
        name = f"{parent}/queuedResources/{qr_id}"
        if name in self.queued:
            raise ApiError(409, "ALREADY_EXISTS", f"Resource '{name}' already exists")
        specs = (body.get("tpu") or {}).get("nodeSpec") or []
        if len(specs) != 1 or not specs[0].get("nodeId"):
            raise ApiError(400, "INVALID_ARGUMENT", "tpu.nodeSpec must name exactly one node")
        self._check_node(specs[0].get("node") or {})
        wait = (body.get("queueingPolicy") or {}).get("validUntilDuration")
        m = _DURATION.match(wait or "")
        qr = {**body, "name": name, "createTime": _now(), "state": {"state": "ACCEPTED"}}
        self.queued[name] = qr
        self._deadline[name] = time.monotonic() + float(m.group(1)) if m else None
        return self.operation(parent, "create", name, done=True, response={"@type": QUEUED_TYPE, **qr})

    def get_queued(self, name: str) -> dict[str, Any]:
        if (qr := self.queued.get(name)) is None:
            raise ApiError(404, "NOT_FOUND", f"Resource '{name}' was not found")
        return qr

    def delete_queued(self, name: str, force: bool) -> dict[str, Any]:
        qr = self.get_queued(name)
        spec = qr["tpu"]["nodeSpec"][0]
        node = f"{spec['parent']}/nodes/{spec['nodeId']}"
        if node in self.machines:
            if not force:
                raise ApiError(400, "FAILED_PRECONDITION", f"Queued resource {name} has a node; delete it with force")
            self.delete_node(node)
        del self.queued[name]
        return self.operation(name.rsplit("/queuedResources/", 1)[0], "delete", name, done=True,
                              response={"@type": EMPTY_TYPE})

    # --- time ---

    def tick(self, boot: Callable[[Machine], FakeHosts | None]) -> None:
        now = time.monotonic()
        for name, qr in list(self.queued.items()):
            state = qr["state"]["state"]
            spec = qr["tpu"]["nodeSpec"][0]
            zone = spec["parent"].rsplit("/", 1)[-1]
            if state in ("ACCEPTED", "WAITING_FOR_RESOURCES"):
                deadline = self._deadline.get(name)
                if zone not in self.stocked_out:
                    node = dict(spec["node"])
                    if "spot" in qr:
                        node["schedulingConfig"] = {"spot": True}
                    self.create_node(spec["parent"], spec["nodeId"], node, queued=name)
                    qr["state"] = {"state": "PROVISIONING"}
                elif deadline is not None and now >= deadline:
                    qr["state"] = {"state": "FAILED", "stateInitiator": "SERVICE", "failedData": {"error": {
                        "code": 8, "message": f"No capacity was available for {spec['node'].get('acceleratorType')} "
                                              f"in {zone} before the queueing policy's validUntil time"}}}
                else:
                    qr["state"] = {"state": "WAITING_FOR_RESOURCES"}
        for name, machine in list(self.machines.items()):
            node = machine.node
            if node["state"] == "CREATING" and now >= machine.ready_at:
                node["state"] = "READY"
                machine.hosts = boot(machine) if self.boot else None
                for op_name in machine.waiting_ops:
                    self._finish(op_name, response={"@type": NODE_TYPE, **node})
                machine.waiting_ops.clear()
                if (owner := self.queued.get(node.get("queuedResource", ""))) is not None:
                    owner["state"] = {"state": "ACTIVE"}
            elif machine.gone_at is not None and now >= machine.gone_at:
                del self.machines[name]
                for op_name in machine.waiting_ops:
                    self._finish(op_name)


def _chips(tpu_type: str) -> int:
    generation, n = tpu_type.rsplit("-", 1)
    return max(1, int(n) // TPU_GENERATIONS[generation].units_per_chip)


def _hosts(tpu_type: str) -> int:
    generation, n = tpu_type.rsplit("-", 1)
    g = TPU_GENERATIONS[generation]
    return max(1, int(n) // g.units_per_replica // g.replicas_per_host)


def devices_per_host(tpu_type: str) -> int:
    generation, n = tpu_type.rsplit("-", 1)
    g = TPU_GENERATIONS[generation]
    return max(1, min(g.replicas_per_host, int(n) // g.units_per_replica))


def guest_items(guest: dict[str, str], query_path: str) -> list[dict[str, str]]:
    """Guest attribute entries under a query path: '' or '/' (all), 'ns/' (a namespace), 'ns/key'."""
    path = query_path.strip("/")
    items = []
    for full, value in sorted(guest.items()):
        namespace, key = full.split("/", 1)
        if not path or path in (namespace, full):
            items.append({"namespace": namespace, "key": key, "value": value})
    return items
