"""The fake Compute Engine API's world: instances and zone operations, kept as the camelCase JSON the
API returns, moved along by time (tick) and by test hooks (stockouts, GPU quota, preemption).

What it checks on insert is what Compute Engine refuses (a GPU VM that would live-migrate, a spot VM
that restarts, a bundled machine type with different guest accelerators, no boot image), so a request
the provisioner gets wrong fails here as it would there.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stack.fakecloud.hosts import FakeHosts
from stack.fakecloud.server import ApiError
from stack.fakecloud.server import rfc3339_now as _now
from trainjobs.catalogue import GPU_TYPES, bundled_gpus

_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_FILTER_TERM = re.compile(r'^\(?\s*([a-zA-Z][\w.-]*)\s*=\s*"([^"]*)"\s*\)?$')


@dataclass
class ComputeTiming:
    op_s: float = 0.1  # an insert that fails (stockout, quota) fails this long after the request
    staging_s: float = 0.2  # PROVISIONING -> STAGING
    boot_s: float = 0.5  # -> RUNNING (the startup script starts)
    delete_s: float = 0.2  # STOPPING -> gone
    shutdown_grace_s: float = 5.0  # SIGTERM -> SIGKILL on delete or preemption


@dataclass
class Vm:
    instance: dict[str, Any]
    zone: str
    created_at: float
    gone_at: float | None = None
    hosts: FakeHosts | None = None
    waiting_ops: list[str] = field(default_factory=list)  # done when RUNNING (insert) or gone (delete)
    remove_when_gone: bool = True  # a preempted VM whose termination action is STOP stays TERMINATED
    guest: dict[str, str] = field(default_factory=dict)  # guest attributes the VM wrote: "namespace/key" -> value


@dataclass
class _FailingOp:
    name: str
    fails_at: float
    error: dict[str, Any]
    http: tuple[int, str]


class ComputeInventory:
    def __init__(self, base_url: Callable[[], str], timing: ComputeTiming, local_devices: int, boot: bool,
                 env: dict[str, str]):
        self.base_url, self.timing, self.local_devices, self.boot, self.env = base_url, timing, local_devices, boot, env
        self.lock = threading.RLock()
        self.vms: dict[str, Vm] = {}  # projects/P/zones/Z/instances/N -> VM
        self.operations: dict[str, dict[str, Any]] = {}  # projects/P/zones/Z/operations/N -> its JSON
        self.stocked_out: set[str] = set()  # zones with no capacity
        self.gpu_quota: dict[str, int] = {}  # zone -> GPUs the project may hold there
        self.images: dict[str, str] = {}  # "project/family" -> image name (default: family-v20250101)
        self._failing: list[_FailingOp] = []
        self._ids = itertools.count(1000)

    def link(self, path: str) -> str:
        return f"{self.base_url()}/compute/v1/{path}"

    # --- operations ---

    def operation(self, zone_path: str, kind: str, target: str, done: bool = False) -> dict[str, Any]:
        op_id = next(self._ids)
        name = f"operation-{op_id}-{kind.rsplit('.', 1)[-1]}"
        path = f"{zone_path}/operations/{name}"
        op = {"kind": "compute#operation", "id": str(op_id), "name": name, "zone": self.link(zone_path),
              "operationType": kind, "targetLink": self.link(target), "status": "DONE" if done else "RUNNING",
              "progress": 100 if done else 0, "insertTime": _now(), "startTime": _now(), "selfLink": self.link(path)}
        if done:
            op["endTime"] = _now()
        self.operations[path] = op
        return op

    def _finish(self, op_name: str, error: dict[str, Any] | None = None, http: tuple[int, str] | None = None) -> None:
        op = next(o for p, o in self.operations.items() if o["name"] == op_name)
        op.update(status="DONE", progress=100, endTime=_now())
        if error is not None:
            op["error"] = error
            op["httpErrorStatusCode"], op["httpErrorMessage"] = http or (400, "BAD REQUEST")

    def get_operation(self, path: str) -> dict[str, Any]:
        if (op := self.operations.get(path)) is None:
            raise ApiError(404, "NOT_FOUND", f"The resource '{path}' was not found")
        return op

    def list_operations(self, zone_path: str, filter_: str) -> dict[str, Any]:
        ops = [o for p, o in self.operations.items() if p.startswith(zone_path + "/") and matches(o, filter_)]
        return {"kind": "compute#operationList", "id": zone_path, "items": ops, "selfLink": self.link(zone_path)}

    # --- instances ---

    def insert(self, zone_path: str, body: dict[str, Any]) -> dict[str, Any]:
        name = str(body.get("name") or "")
        path = f"{zone_path}/instances/{name}"
        zone = zone_path.rsplit("/", 1)[-1]
        if not _NAME.match(name):
            raise ApiError(400, "INVALID_ARGUMENT", f"Invalid value for field 'resource.name': '{name}'. "
                           "Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'")
        if path in self.vms:
            raise ApiError(409, "ALREADY_EXISTS", f"The resource '{path}' already exists")
        gpus = self._check(zone, body)
        op = self.operation(zone_path, "insert", path)
        failure = self._refusal(zone_path, gpus)
        if failure is not None:
            error, http = failure
            self._failing.append(_FailingOp(op["name"], time.monotonic() + self.timing.op_s, error, http))
            return op
        vm_id = str(next(self._ids))
        instance = {
            **body, "kind": "compute#instance", "id": vm_id, "name": name, "zone": self.link(zone_path),
            "machineType": self.link(f"{zone_path}/machineTypes/{body['machineType'].rsplit('/', 1)[-1]}"),
            "metadata": _metadata((body.get("metadata") or {}).get("items") or []),
            "status": "PROVISIONING", "creationTimestamp": _now(), "selfLink": self.link(path),
            "cpuPlatform": "Unknown CPU Platform", "labelFingerprint": "42WmSpB8rSM=",
            "networkInterfaces": [{**nic, "name": f"nic{i}", "networkIP": "127.0.0.1",  # loopback: the VMs run here
                                   "fingerprint": "abc="} for i, nic in enumerate(body.get("networkInterfaces") or [{}])],
        }
        vm = Vm(instance, zone, created_at=time.monotonic())
        vm.waiting_ops.append(op["name"])
        self.vms[path] = vm
        return op

    def _check(self, zone: str, body: dict[str, Any]) -> int:
        """GPUs the instance would hold; ApiError for what Compute Engine refuses."""
        machine_type = str(body.get("machineType") or "").rsplit("/", 1)[-1]
        if not machine_type:
            raise ApiError(400, "INVALID_ARGUMENT", "Invalid value for field 'resource.machineType': ''.")
        attached = body.get("guestAccelerators") or []
        bundled = bundled_gpus(machine_type)
        gpus = sum(int(a.get("acceleratorCount") or 0) for a in attached)
        for a in attached:
            gpu_type = str(a.get("acceleratorType") or "").rsplit("/", 1)[-1]
            if gpu_type not in GPU_TYPES:
                raise ApiError(400, "INVALID_ARGUMENT", f"Invalid value for field 'resource.guestAccelerators[0]."
                               f"acceleratorType': '{a.get('acceleratorType')}'. Accelerator type not found.")
            if bundled is not None and (gpu_type, int(a.get("acceleratorCount") or 0)) != bundled:
                raise ApiError(400, "INVALID_ARGUMENT", f"Machine type {machine_type} comes with {bundled[1]} "
                               f"{bundled[0]} and does not take other guest accelerators.")
        if bundled is not None:
            gpus = bundled[1]
        elif attached and not machine_type.startswith("n1-"):
            raise ApiError(400, "INVALID_ARGUMENT", f"Machine type {machine_type} does not support guest accelerators.")
        scheduling = body.get("scheduling") or {}
        if gpus and scheduling.get("onHostMaintenance") != "TERMINATE":
            raise ApiError(400, "INVALID_ARGUMENT", "Instances with guest accelerators do not support live migration.")
        if scheduling.get("provisioningModel") == "SPOT" and scheduling.get("automaticRestart", True):
            raise ApiError(400, "INVALID_ARGUMENT", "Invalid value for field 'resource.scheduling.automaticRestart': "
                           "'true'. Spot VMs cannot be automatically restarted.")
        disks = body.get("disks") or []
        if not any(d.get("boot") and (d.get("initializeParams") or {}).get("sourceImage") for d in disks):
            raise ApiError(400, "INVALID_ARGUMENT", "Invalid value for field 'resource.disks': a boot disk with a "
                           "source image is required.")
        return gpus

    def _refusal(self, zone_path: str, gpus: int) -> tuple[dict[str, Any], tuple[int, str]] | None:
        zone = zone_path.rsplit("/", 1)[-1]
        if (limit := self.gpu_quota.get(zone)) is not None and gpus:
            held = sum(self._gpus(vm.instance) for vm in self.vms.values() if vm.zone == zone and vm.gone_at is None)
            if held + gpus > limit:
                region = zone.rsplit("-", 1)[0]
                return ({"errors": [{"code": "QUOTA_EXCEEDED", "message": f"Quota 'GPUS_PER_GPU_FAMILY' exceeded.  "
                                     f"Limit: {float(limit)} in region {region}."}]}, (403, "FORBIDDEN"))
        if zone in self.stocked_out:
            return ({"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": f"The zone '{zone_path}' does not have enough resources available to fulfill "
                                 "the request.  Try a different zone, or try again later."}]}, (503, "SERVICE UNAVAILABLE"))
        return None

    @staticmethod
    def _gpus(instance: dict[str, Any]) -> int:
        bundled = bundled_gpus(str(instance.get("machineType", "")).rsplit("/", 1)[-1])
        if bundled is not None:
            return bundled[1]
        return sum(int(a.get("acceleratorCount") or 0) for a in instance.get("guestAccelerators") or [])

    def get(self, path: str) -> dict[str, Any]:
        if (vm := self.vms.get(path)) is None:
            raise ApiError(404, "NOT_FOUND", f"The resource '{path}' was not found")
        return vm.instance

    def set_metadata(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """instances.setMetadata: the whole item list replaced, if the caller saw the current one (the
        fingerprint it read with the instance); 412 otherwise, so two writers cannot undo each other."""
        vm = self.vms.get(path)
        if vm is None:
            raise ApiError(404, "NOT_FOUND", f"The resource '{path}' was not found")
        current = vm.instance["metadata"]["fingerprint"]
        if not body.get("fingerprint"):
            raise ApiError(400, "INVALID_ARGUMENT", "Required field 'resource.fingerprint' not specified")
        if body["fingerprint"] != current:
            raise ApiError(412, "FAILED_PRECONDITION", "Supplied fingerprint does not match current metadata "
                           "fingerprint.", reason="conditionNotMet")
        vm.instance["metadata"] = _metadata(body.get("items") or [])
        return self.operation(path.rsplit("/instances/", 1)[0], "setMetadata", path, done=True)

    def guest_attributes(self, path: str, variable_key: str, query_path: str) -> dict[str, Any]:
        """instances.getGuestAttributes: one key's value (variableKey), or the entries under a query path."""
        vm = self.vms.get(path)
        if vm is None:
            raise ApiError(404, "NOT_FOUND", f"The resource '{path}' was not found")
        out: dict[str, Any] = {"kind": "compute#guestAttributes", "selfLink": self.link(path) + "/getGuestAttributes"}
        if variable_key:
            if variable_key not in vm.guest:
                raise ApiError(404, "NOT_FOUND", f"The resource '{path}/guestAttributes/{variable_key}' was not found")
            return {**out, "variableKey": variable_key, "variableValue": vm.guest[variable_key]}
        prefix = query_path.strip("/")
        items = [{"namespace": k.split("/", 1)[0], "key": k.split("/", 1)[1], "value": v}
                 for k, v in sorted(vm.guest.items()) if not prefix or prefix in (k.split("/", 1)[0], k)]
        if not items:
            raise ApiError(404, "NOT_FOUND", f"The resource '{path}/guestAttributes/{prefix}' was not found")
        return {**out, "queryPath": query_path, "queryValue": {"items": items}}

    def list(self, zone_path: str, filter_: str) -> dict[str, Any]:
        items = [vm.instance for p, vm in self.vms.items() if p.startswith(zone_path + "/") and matches(vm.instance, filter_)]
        out: dict[str, Any] = {"kind": "compute#instanceList", "id": zone_path, "selfLink": self.link(zone_path)}
        if items:  # as the real API: no "items" key when nothing matches
            out["items"] = items
        return out

    def delete(self, path: str) -> dict[str, Any]:
        if (vm := self.vms.get(path)) is None:
            raise ApiError(404, "NOT_FOUND", f"The resource '{path}' was not found")
        op = self.operation(path.rsplit("/instances/", 1)[0], "delete", path)
        if vm.gone_at is None or not vm.remove_when_gone:
            vm.instance["status"] = "STOPPING"
            vm.gone_at = time.monotonic() + self.timing.delete_s
            vm.remove_when_gone = True
            self._shut_down(vm)
            for op_name in vm.waiting_ops:  # an insert still in flight ends with the VM gone
                self._finish(op_name, {"errors": [{"code": "RESOURCE_NOT_FOUND", "message": f"{path} was deleted"}]})
            vm.waiting_ops.clear()
        vm.waiting_ops.append(op["name"])
        return op

    def preempt(self, path: str) -> None:
        """Google takes a spot VM back: a preempted operation, STOPPING, then deleted or TERMINATED by
        its instanceTerminationAction."""
        vm = self.vms[path]
        self.operation(path.rsplit("/instances/", 1)[0], "compute.instances.preempted", path, done=True)
        vm.instance["status"] = "STOPPING"
        vm.gone_at = time.monotonic() + self.timing.delete_s
        vm.remove_when_gone = (vm.instance.get("scheduling") or {}).get("instanceTerminationAction") == "DELETE"
        self._shut_down(vm)

    def _shut_down(self, vm: Vm) -> None:
        hosts, vm.hosts = vm.hosts, None
        if hosts is not None:
            threading.Thread(target=hosts.stop, args=(self.timing.shutdown_grace_s,), daemon=True).start()

    def image(self, project: str, family: str) -> dict[str, Any]:
        name = self.images.get(f"{project}/{family}", f"{family}-v20250101")
        if not name:
            raise ApiError(404, "NOT_FOUND", f"The resource 'projects/{project}/global/images/family/{family}' was not found")
        path = f"projects/{project}/global/images/{name}"
        return {"kind": "compute#image", "id": str(abs(hash(path)) % 10**12), "name": name, "family": family,
                "status": "READY", "selfLink": self.link(path), "creationTimestamp": _now(), "diskSizeGb": "50"}

    # --- time ---

    def tick(self, boot: Callable[[Vm], FakeHosts | None]) -> None:
        now = time.monotonic()
        for failing in [f for f in self._failing if now >= f.fails_at]:
            self._failing.remove(failing)
            self._finish(failing.name, failing.error, failing.http)
        for path, vm in list(self.vms.items()):
            status = vm.instance["status"]
            if vm.gone_at is not None:
                if now >= vm.gone_at:
                    for op_name in vm.waiting_ops:
                        self._finish(op_name)
                    vm.waiting_ops.clear()
                    if vm.remove_when_gone:
                        del self.vms[path]
                    else:
                        vm.instance["status"] = "TERMINATED"
                continue
            if status == "PROVISIONING" and now >= vm.created_at + self.timing.staging_s:
                vm.instance["status"] = "STAGING"
            elif status == "STAGING" and now >= vm.created_at + self.timing.boot_s:
                vm.instance["status"] = "RUNNING"
                vm.instance["lastStartTimestamp"] = _now()
                vm.hosts = boot(vm) if self.boot else None
                for op_name in vm.waiting_ops:
                    self._finish(op_name)
                vm.waiting_ops.clear()


def matches(resource: dict[str, Any], filter_: str) -> bool:
    """The subset of the list filter syntax the provisioner uses: `a.b = "v"` terms joined by AND."""
    if not filter_.strip():
        return True
    for term in re.split(r"\s+AND\s+", filter_.strip()):
        m = _FILTER_TERM.match(term.strip())
        if m is None:
            raise ApiError(400, "INVALID_ARGUMENT", f"Invalid list filter expression '{filter_}'.")
        value: Any = resource
        for key in m.group(1).split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if str(value) != m.group(2):
            return False
    return True


def _metadata(items: list[dict[str, Any]]) -> dict[str, Any]:
    """An instance's metadata as the API returns it: the items and a fingerprint of them."""
    digest = hashlib.sha256(json.dumps(items, sort_keys=True).encode()).digest()[:8]
    return {"kind": "compute#metadata", "fingerprint": base64.b64encode(digest).decode(), "items": items}
