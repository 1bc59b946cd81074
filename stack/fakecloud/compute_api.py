"""The fake Compute Engine API over HTTP: the REST paths google-cloud-compute's REST transport calls
(google/cloud/compute_v1/services/{instances,zone_operations,images}/transports/rest_base.py), camelCase
JSON, zone operations that complete over time and error bodies. Tests import it; `trainjobs fake-cloud`
serves it beside the fake TPU API.

    with FakeComputeApi(sandbox=tmp_path, env={"STORAGE_EMULATOR_HOST": ...}) as api:
        os.environ["TRAINJOBS_COMPUTE_API_ENDPOINT"] = api.url
        api.stock_out("us-central1-a"); api.preempt("tj-...-a1-0"); api.requests  # what the client sent
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

from stack.fakecloud.compute_inventory import ComputeInventory, ComputeTiming, Vm
from stack.fakecloud.hosts import FakeHosts
from stack.fakecloud.metadata_server import HostView
from stack.fakecloud.server import ApiError, FakeGoogleApi, ReadQuota, Route, quota_message
from trainjobs.catalogue import bundled_gpus
from trainjobs.vm_metadata import STARTUP_SCRIPT_KEY

_ZONE = r"projects/[^/]+/zones/[^/]+"
ROUTES: list[Route] = [
    ("POST", re.compile(rf"^/compute/v1/({_ZONE})/instances$"), "insert"),
    ("GET", re.compile(rf"^/compute/v1/({_ZONE})/instances$"), "list"),
    ("GET", re.compile(rf"^/compute/v1/({_ZONE}/instances/[^/]+)$"), "get"),
    ("DELETE", re.compile(rf"^/compute/v1/({_ZONE}/instances/[^/]+)$"), "delete"),
    ("POST", re.compile(rf"^/compute/v1/({_ZONE}/instances/[^/]+)/setMetadata$"), "set_metadata"),
    ("GET", re.compile(rf"^/compute/v1/({_ZONE}/instances/[^/]+)/getGuestAttributes$"), "get_guest_attributes"),
    ("GET", re.compile(rf"^/compute/v1/({_ZONE})/operations$"), "list_operations"),
    ("GET", re.compile(rf"^/compute/v1/({_ZONE}/operations/[^/]+)$"), "get_operation"),
    # `wait` may answer before the operation is DONE (the API's own documentation): this one always does.
    ("POST", re.compile(rf"^/compute/v1/({_ZONE}/operations/[^/]+)/wait$"), "get_operation"),
    ("GET", re.compile(r"^/compute/v1/(projects/[^/]+/global/images/family/[^/]+)$"), "image_from_family"),
]


class FakeComputeApi(FakeGoogleApi):
    routes = ROUTES
    domain = "compute.googleapis.com"

    def __init__(self, *, sandbox: Path | None = None, env: dict[str, str] | None = None, boot: bool = True,
                 local_devices: int = 2, timing: ComputeTiming | None = None, host: str = "127.0.0.1", port: int = 0):
        self.sandbox = sandbox or Path(tempfile.mkdtemp(prefix="fake-compute-"))
        self.world = ComputeInventory(lambda: self.url, timing or ComputeTiming(), local_devices, boot, dict(env or {}))
        super().__init__(self.world.lock, host, port)

    def tick(self) -> None:
        self.world.tick(self._boot)

    def on_stop(self) -> None:
        with self.world.lock:
            vms = list(self.world.vms.values())
        for vm in vms:
            if vm.hosts is not None:
                vm.hosts.stop(grace_s=2.0)

    def rate_limit_error(self, quota: ReadQuota) -> ApiError:
        """Compute Engine's v1 API answers a rate quota with 403 and the legacy `errors` list, reason
        rateLimitExceeded (https://cloud.google.com/compute/api-docs/rate-limits): the client raises
        Forbidden, not TooManyRequests, and no ErrorInfo names the reason."""
        message = quota_message(self.domain, quota)
        return ApiError(403, None, message, errors=[{"message": message, "domain": "usageLimits",
                                                     "reason": "rateLimitExceeded"}])

    # --- test hooks ---

    def stock_out(self, zone: str, out: bool = True) -> None:
        """The zone has (or again has) no capacity: inserts there fail with ZONE_RESOURCE_POOL_EXHAUSTED."""
        with self.world.lock:
            (self.world.stocked_out.add if out else self.world.stocked_out.discard)(zone)

    def set_gpu_quota(self, zone: str, gpus: int) -> None:
        with self.world.lock:
            self.world.gpu_quota[zone] = gpus

    def preempt(self, name: str) -> None:
        with self.world.lock:
            self.world.preempt(self._path(name))

    def instance(self, name: str) -> dict[str, Any] | None:
        with self.world.lock:
            vm = next((v for p, v in self.world.vms.items() if p.rsplit("/", 1)[-1] == name), None)
            return json.loads(json.dumps(vm.instance)) if vm else None

    def instance_status(self, name: str) -> str | None:
        """The VM's status (RUNNING, TERMINATED...), None if there is no such VM; no copy of it made."""
        with self.world.lock:
            return next((v.instance["status"] for p, v in self.world.vms.items() if p.rsplit("/", 1)[-1] == name), None)

    def guest_attributes(self, name: str) -> dict[str, str]:
        """What the VM has written as guest attributes ("namespace/key" -> value)."""
        with self.world.lock:
            return dict(self.world.vms[self._path(name)].guest)

    def instance_names(self, status: str | None = None) -> list[str]:
        with self.world.lock:
            return sorted(p.rsplit("/", 1)[-1] for p, v in self.world.vms.items()
                          if status is None or v.instance["status"] == status)

    def _path(self, name: str) -> str:
        matches = [p for p in self.world.vms if p.rsplit("/", 1)[-1] == name]
        if not matches:
            raise KeyError(f"no instance {name}")
        return matches[0]

    # --- the world ---

    def _boot(self, vm: Vm) -> FakeHosts | None:
        items = {i["key"]: i.get("value", "") for i in (vm.instance.get("metadata") or {}).get("items") or []}
        script = items.get(STARTUP_SCRIPT_KEY)
        if not script:
            return None
        name = vm.instance["name"]
        bundled = bundled_gpus(vm.instance["machineType"].rsplit("/", 1)[-1])
        gpus = bundled[1] if bundled else sum(int(a.get("acceleratorCount") or 0)
                                              for a in vm.instance.get("guestAccelerators") or [])
        # CPU devices stand in for the GPUs (a CPU VM gets the same number, for its replicas).
        return FakeHosts(self.sandbox / name, script, hosts=1, devices_per_host=min(self.world.local_devices, gpus or
                                                                                     self.world.local_devices),
                         env=self.world.env, metadata_url=lambda host: self.metadata_url(name, host))

    def host_metadata(self, machine: str, host: int) -> HostView | None:
        """A VM sees its own metadata items as instance attributes, and its own guest attributes."""
        vm = next((v for p, v in self.world.vms.items() if p.rsplit("/", 1)[-1] == machine), None)
        if vm is None or host != 0:
            return None
        items = {i["key"]: i.get("value", "") for i in (vm.instance.get("metadata") or {}).get("items") or []}
        return HostView(items, vm.instance["zone"].split("/projects/", 1)[-1].split("/", 1)[0], vm.guest)

    def dispatch(self, action: str, name: str, query: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        w = self.world
        match action:
            case "insert":
                return w.insert(name, body)
            case "list":
                return w.list(name, query.get("filter", ""))
            case "get":
                return w.get(name)
            case "delete":
                return w.delete(name)
            case "set_metadata":
                return w.set_metadata(name, body)
            case "get_guest_attributes":
                return w.guest_attributes(name, query.get("variableKey", ""), query.get("queryPath", ""))
            case "list_operations":
                return w.list_operations(name, query.get("filter", ""))
            case "get_operation":
                return w.get_operation(name)
            case "image_from_family":
                project, family = name.split("/")[1], name.rsplit("/", 1)[-1]
                return w.image(project, family)
        raise ApiError(500, "INTERNAL", f"unrouted action {action}")
