"""GPU (and CPU) VMs on Compute Engine through google-cloud-compute. The only module that imports
google.cloud.compute_v1.

A machine here is a set of VMs, one per worker host, named `<request.name>-<host>` and labelled with the
set's name: a single-host job is a set of one. All VMs of a set live in one zone (the first, else each
fallback zone in turn, that has the capacity for all of them). A multi-host set is READY once every VM
is RUNNING and the worker has written the cluster (TF_CONFIG, from the VMs' internal IPs) to the job
directory; the startup script waits for that file before it starts the agent. Losing any VM loses the
set: the driver gives the attempt up and the next attempt creates a whole new set.

Operations: `InstancesClient.insert()` wraps the operation in an ExtendedOperation that polls through a
ZoneOperationsClient its transport builds from the credentials alone (transports/base.py,
`_zone_operations_client`), so it asks compute.googleapis.com whatever endpoint we gave. We call
`insert_unary` / `delete_unary`, which return the Operation itself, and follow it with our own
ZoneOperationsClient, built with the same endpoint and credentials (`compute_clients`).
"""

from __future__ import annotations

import builtins
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from trainjobs import storage
from trainjobs.catalogue import bundled_gpus
from trainjobs.job_paths import JobPaths
from trainjobs.spec import CpuAccelerator, GpuAccelerator, TpuAccelerator
from trainjobs.spec.derived import vm_machine_type
from trainjobs.vm_metadata import (
    COMPUTE_API_KEY, HOST_KEY, INSTALL_GPU_DRIVER_KEY, INSTANCE_KEY, JOB_DIR_KEY, LABEL_HOSTS, LABEL_MACHINE, LABEL_MANAGED,
    MACHINE_KEY, PUBLIC_KEY_PATH, SEALED_KEY, STARTUP_SCRIPT_KEY)
from worker.gcp.bootstrap import startup_script, upload_agent_wheel
from worker.gcp.config import GcpConfig
from worker.gcp.errors import MachineRefused, cloud_message, is_transient
from worker.gcp.job_tokens import JobTokens
from worker.gcp.fleet_listing import Codec
from worker.gcp.machine_watch import WatchConfig
from worker.gcp.token_delivery import create_metadata, published_keys, sealed_value
from worker.gcp.zonal import Call, ZonalProvisioner, duration
from worker.ports import MachineInfo, MachineRequest, MachineState

log = logging.getLogger("trainjobs.worker")

# Compute Engine's instance statuses, ours beside them: the only place they meet. A VM that stops
# (STOPPING, TERMINATED) was preempted when its zone logged a `compute.instances.preempted` operation
# for it; `_member_state` asks.
INSTANCE_STATES: dict[str, MachineState] = {
    "PROVISIONING": MachineState.CREATING,
    "STAGING": MachineState.CREATING,
    "RUNNING": MachineState.READY,
    # Google repairs the host in place; the agent is gone until it is back, and the driver's
    # agent-silence limit decides whether to wait or start a new attempt.
    "REPAIRING": MachineState.CREATING,
    "STOPPING": MachineState.STOPPED,
    "STOPPED": MachineState.STOPPED,
    "SUSPENDING": MachineState.STOPPED,
    "SUSPENDED": MachineState.STOPPED,
    "TERMINATED": MachineState.STOPPED,
}
PREEMPTED_OPERATION = "compute.instances.preempted"
# Error codes of a failed operation that mean "this zone has no capacity now": try another zone.
TIMED_OUT = ("TIMEOUT", "")  # operations still running when the wait ended
STOCKOUT_CODES = ("ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "STOCKOUT")
SCOPES = ["https://www.googleapis.com/auth/devstorage.read_write",  # the job directory and datasets
          "https://www.googleapis.com/auth/compute"]  # the watchdog deletes its own VM


@dataclass(frozen=True)
class ComputeClients:
    instances: Any
    zone_operations: Any
    images: Any


def compute_clients(config: GcpConfig) -> ComputeClients:
    """The real clients, all on one endpoint. An http:// COMPUTE_API_ENDPOINT (a fake API) gets REST and
    no credentials."""
    from google.api_core.client_options import ClientOptions
    from google.cloud import compute_v1

    endpoint = config.compute_api_endpoint
    options: dict[str, Any] = {}
    if endpoint and endpoint.startswith("http://"):
        from google.auth.credentials import AnonymousCredentials

        options = {"transport": "rest", "credentials": AnonymousCredentials(),
                   "client_options": ClientOptions(api_endpoint=endpoint)}
    elif endpoint:
        options = {"client_options": ClientOptions(api_endpoint=endpoint)}
    return ComputeClients(compute_v1.InstancesClient(**options), compute_v1.ZoneOperationsClient(**options),
                          compute_v1.ImagesClient(**options))


def agent_startup_script(request: MachineRequest) -> str:
    bucket, _ = storage.split_uri(request.job_dir)
    cluster = JobPaths.of(request.job_dir).cluster(request.attempt) if request.spec.workers > 1 else None
    return startup_script(request.job_dir, upload_agent_wheel(bucket), cluster)


def _vms(record: Any) -> builtins.list[Any]:
    from google.cloud import compute_v1

    return [compute_v1.Instance.from_json(json.dumps(vm), ignore_unknown_fields=True) for vm in record]


# A listed set as stored for the fleet (fleet_listing.py): its VMs in the API's own JSON.
VMS_JSON: Codec[builtins.list[Any]] = Codec(lambda vms: [json.loads(type(vm).to_json(vm)) for vm in vms], _vms)


class GceVmProvisioner(ZonalProvisioner):
    kind = "compute-engine"  # GPU and CPU VMs

    def __init__(self, config: GcpConfig, *, clients: ComputeClients | None = None, create_wait_s: float = 120.0,
                 delete_wait_s: float = 600.0, backoff_s: float = 0.5, poll_s: float = 1.0,
                 startup: Callable[[MachineRequest], str] = agent_startup_script,
                 clock: Callable[[], float] = time.monotonic, tokens: JobTokens | None = None,
                 capacity_retry_s: float = 30.0, watch: WatchConfig | None = None,
                 fleet: sessionmaker[Session] | None = None):
        """create_wait_s: how long create() follows the insert operations (a stockout is only known once
        they end); delete_wait_s: how long delete() waits for Google to confirm; poll_s: between
        operation polls; backoff_s: the first retry's delay; capacity_retry_s: how often a set that no
        zone had capacity for asks again; tokens: per-job storage tokens for the VMs
        (worker/gcp/job_tokens.py; default: on, unless storage is the emulator); watch: answer get() from
        one listing per zone on this schedule (machine_watch.py; None: a list call per get); fleet: that
        listing shared by every worker on this database (fleet_listing.py)."""
        super().__init__(config, backoff_s=backoff_s, tokens=tokens, listing=self._list_all, codec=VMS_JSON,
                         watch=watch, fleet=fleet)
        self.create_wait_s, self.delete_wait_s, self.poll_s = create_wait_s, delete_wait_s, poll_s
        self.startup, self.clock = startup, clock
        self.clients = clients if clients is not None else compute_clients(config)
        self._clustered: set[str] = set()  # sets whose cluster file this process has written
        self._stocked_out_since: dict[str, float] = {}  # set -> when every zone first said no
        self._last_capacity_try: dict[str, float] = {}  # set -> when every zone last said no
        self.capacity_retry_s = capacity_retry_s

    # --- Provisioner ---

    def create(self, request: MachineRequest) -> MachineInfo:
        if isinstance(request.spec.accelerator, TpuAccelerator):
            raise MachineRefused("the Compute Engine provisioner runs GPU and CPU jobs; TPU jobs go to Cloud TPU")
        if (existing := self.get(request)) is not None:
            return existing
        if self.clock() - self._last_capacity_try.get(request.name, -math.inf) < self.capacity_retry_s:
            return self._no_capacity(request, asked=False)  # every zone said no moments ago
        hosts = request.spec.workers
        self._touch(request.name)
        for zone in self.config.zones:
            image = self._image(request)
            operations = [self._insert(zone, self._instance(request, zone, host, image)) for host in range(hosts)]
            error = self._wait_all(zone, operations)
            if error is None or error == TIMED_OUT:  # still creating: get() follows it from here
                self._stocked_out_since.pop(request.name, None)
                self._last_capacity_try.pop(request.name, None)
                self._seen(request.name, zone)
                break
            code, message = error
            self._delete_in(zone, request.name, hosts)  # a partial set is no use: all hosts in one zone
            if code not in STOCKOUT_CODES:
                raise MachineRefused(message)
            log.info("%s: no capacity in %s (%s): %s", request.name, zone, code, message)
        else:
            return self._no_capacity(request)
        return self.get(request) or MachineInfo(request.name, MachineState.CREATING, request.labels)

    def get(self, request: MachineRequest) -> MachineInfo | None:
        name, seen = request.name, self._zone_of.get(request.name)
        if self.watch is not None and (listed := self.watch.find(name)) is not None:
            return self._members_seen(request, *listed)
        for zone in self._zones_for(name):
            members = self._list(zone, f'labels.{LABEL_MACHINE} = "{name}"')
            if members:
                return self._members_seen(request, zone, members)
        if seen is not None and self._preempted(seen, f"{name}-"):
            # A spot VM preempted with instanceTerminationAction DELETE leaves nothing to find.
            return MachineInfo(name, MachineState.PREEMPTED, {}, f"preempted in {seen} and deleted by Google")
        return None

    def delete(self, name: str) -> None:
        """Deletes every VM of the set in every zone and waits until Google confirms."""
        if self.tokens is not None:
            self.tokens.stop(name)
        self._touch(name, soon=False)
        for zone in self.config.zones:
            members = self._list(zone, f'labels.{LABEL_MACHINE} = "{name}"')
            for m in members:
                self._token_checks.forget(m.name)
            operations = [op for m in members if (op := self._delete_instance(zone, m.name)) is not None]
            if self._wait_all(zone, operations, self.delete_wait_s, what="delete") == TIMED_OUT:
                log.warning("delete %s not confirmed within %.0fs; the reaper finishes it", name, self.delete_wait_s)
        self._zone_of.pop(name, None)
        self._clustered.discard(name)

    def list(self, labels: dict[str, str]) -> builtins.list[MachineInfo]:
        found = []
        for name, (zone, members) in self._fresh_listing().items():
            if matching := [vm for vm in members if labels.items() <= dict(vm.labels).items()]:
                found.append(self._set_info(zone, name, matching))
        return found

    def _list_all(self, call: Call) -> dict[str, tuple[str, builtins.list[Any]]]:
        """Our VMs in every zone (one list call each, filtered by our label), as sets: the set's name ->
        (its zone, its VMs); a set is where its VMs were first found."""
        found: dict[str, tuple[str, builtins.list[Any]]] = {}
        for zone in self.config.zones:
            sets: dict[str, builtins.list[Any]] = {}
            for vm in self._list(zone, f'labels.{LABEL_MANAGED} = "true"', call):
                if name := vm.labels.get(LABEL_MACHINE):
                    sets.setdefault(name, []).append(vm)
            for name, members in sets.items():
                found.setdefault(name, (zone, members))
        return found

    # --- requests ---

    def _instance(self, request: MachineRequest, zone: str, host: int, image: str) -> Any:
        from google.cloud import compute_v1

        c, acc, hosts = self.config, request.spec.accelerator, request.spec.workers
        name = f"{request.name}-{host}"
        machine_type, accelerators = _machine(acc)
        spot = isinstance(acc, GpuAccelerator) and acc.spot
        metadata = {
            STARTUP_SCRIPT_KEY: self.startup(request),
            JOB_DIR_KEY: request.job_dir,
            HOST_KEY: str(host),
            INSTANCE_KEY: f"projects/{c.project}/zones/{zone}/instances/{name}",
            COMPUTE_API_KEY: c.compute_api_endpoint or "https://compute.googleapis.com",
        }
        if self.tokens is not None:  # the VMs' only way into storage: a token for this job's own objects,
            self.tokens.start(request)  # which comes sealed to each VM's own key once it asks (no token in metadata)
            metadata.update(create_metadata(name))
        if isinstance(acc, GpuAccelerator):
            metadata[INSTALL_GPU_DRIVER_KEY] = "True"
        network = compute_v1.NetworkInterface(
            network=c.network or "global/networks/default",
            # An external IP, as for TPU VMs: the startup script installs the agent and reaches storage.
            access_configs=[compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")])
        if c.subnetwork:
            network.subnetwork = c.subnetwork
        scheduling = compute_v1.Scheduling(
            # GPUs cannot live-migrate; and a VM Google restarts would rerun the startup script in the
            # middle of an attempt, so a lost host stays lost and the driver replaces the set.
            on_host_maintenance="TERMINATE", automatic_restart=False)
        if spot:
            scheduling.provisioning_model = "SPOT"
            scheduling.instance_termination_action = "DELETE"
        instance = compute_v1.Instance(
            name=name,
            description=f"trainjobs job {request.job_id} attempt {request.attempt} host {host} of {hosts}",
            machine_type=f"zones/{zone}/machineTypes/{machine_type}",
            labels={**request.labels, LABEL_MACHINE: request.name, LABEL_HOSTS: str(hosts)},
            metadata=compute_v1.Metadata(items=[compute_v1.Items(key=k, value=v) for k, v in metadata.items()]),
            disks=[compute_v1.AttachedDisk(boot=True, auto_delete=True, initialize_params=compute_v1.AttachedDiskInitializeParams(
                source_image=image, disk_size_gb=c.boot_disk_gb, disk_type=f"zones/{zone}/diskTypes/pd-balanced"))],
            network_interfaces=[network],
            scheduling=scheduling,
            service_accounts=[compute_v1.ServiceAccount(email=c.service_account or "default", scopes=SCOPES)],
            tags=compute_v1.Tags(items=builtins.list(c.tags)),
        )
        if accelerators is not None:
            gpu_type, count = accelerators
            instance.guest_accelerators = [compute_v1.AcceleratorConfig(
                accelerator_type=f"projects/{c.project}/zones/{zone}/acceleratorTypes/{gpu_type}",
                accelerator_count=count)]
        return instance

    def _image(self, request: MachineRequest) -> str:
        """The newest image of the configured family: resolved now, so every VM of a set boots the same."""
        from google.api_core import exceptions as gexc

        c = self.config
        family = c.gpu_image_family if isinstance(request.spec.accelerator, GpuAccelerator) else c.cpu_image_family
        try:
            image = self._call(f"resolve image family {family}", lambda: self.clients.images.get_from_family(
                project=c.image_project, family=family))
        except gexc.NotFound as exc:
            raise MachineRefused(f"no image family {family!r} in project {c.image_project!r} "
                                 f"(TRAINJOBS_GCP_*_IMAGE_FAMILY): {cloud_message(exc)}") from exc
        return str(image.self_link)

    def _insert(self, zone: str, instance: Any) -> Any:
        from google.api_core import exceptions as gexc

        try:
            return self._call(f"create VM {instance.name} in {zone}", lambda: self.clients.instances.insert_unary(
                project=self.config.project, zone=zone, instance_resource=instance))
        except gexc.Conflict:
            return None  # already there (a create that was retried, or a worker that died after it)
        except gexc.GoogleAPICallError as exc:
            if is_transient(exc):
                raise  # still failing after the retries: the driver's next step tries again
            raise MachineRefused(cloud_message(exc)) from exc

    def _no_capacity(self, request: MachineRequest, asked: bool = True) -> MachineInfo:
        """Compute Engine does not queue a VM for capacity: the set waits here, every zone asked again at
        the driver's next step (get() finds nothing, so it calls create()), up to the capacity wait. A
        machine waiting for capacity starts no boot clock in the driver."""
        first = self._stocked_out_since.setdefault(request.name, self.clock())
        if asked:
            self._last_capacity_try[request.name] = self.clock()
        what = _describe(request)
        zones = ", ".join(self.config.zones)
        if self.clock() - first >= self.config.capacity_wait_s:
            self._stocked_out_since.pop(request.name, None)
            self._last_capacity_try.pop(request.name, None)
            raise MachineRefused(f"no capacity for {what} in {zones} after {duration(self.config.capacity_wait_s)}")
        return MachineInfo(request.name, MachineState.CREATING, request.labels,
                           f"no zone has capacity for {what} now ({zones})", waiting_for_capacity=True)

    # --- the first storage token, sealed to each VM's own key (worker/gcp/token_delivery.py) ---

    def _deliver_token(self, request: MachineRequest, zone: str, vm: Any) -> None:
        """Seal the job's token to the VM's published key, into its metadata. A failure (a fingerprint
        another writer changed: 412) is logged and tried again at the next look: the VM waits for it."""
        from google.api_core import exceptions as gexc
        from google.cloud import compute_v1

        assert self.tokens is not None
        items = {i.key: i.value for i in vm.metadata.items}
        if vm.status != "RUNNING" or MACHINE_KEY not in items or not self._token_checks.due(
                vm.name, 1, items.get(SEALED_KEY)):
            return
        try:
            try:
                found = self.clients.instances.get_guest_attributes(request={
                    "project": self.config.project, "zone": zone, "instance": vm.name, "query_path": PUBLIC_KEY_PATH})
                entries = [(e.namespace, e.key, e.value) for e in found.query_value.items]
            except gexc.NotFound:  # the VM has not published its key yet
                entries = []
            value = sealed_value(vm.name, published_keys(vm.name, entries), items.get(SEALED_KEY),
                                 self.tokens.start(request))
            if value is not None:
                kept = [compute_v1.Items(key=k, value=v) for k, v in items.items() if k != SEALED_KEY]
                self.clients.instances.set_metadata_unary(
                    project=self.config.project, zone=zone, instance=vm.name, metadata_resource=compute_v1.Metadata(
                        fingerprint=vm.metadata.fingerprint, items=[*kept, compute_v1.Items(key=SEALED_KEY, value=value)]))
                log.info("%s: storage token sealed to its key", vm.name)
            self._token_checks.checked(vm.name)
        except Exception as exc:
            log.warning("%s: could not deliver the first storage token yet: %s", vm.name, cloud_message(exc))

    # --- responses ---

    def _members_seen(self, request: MachineRequest, zone: str, members: builtins.list[Any]) -> MachineInfo:
        self._seen(request.name, zone)
        info = self._set_info(zone, request.name, members, request)
        if self.tokens is not None and info.state in (MachineState.CREATING, MachineState.READY):
            self.tokens.keep(request)  # adopted from a dead worker: tokens go on, for the request's boundary
            for vm in members:
                self._deliver_token(request, zone, vm)
        return info

    def _set_info(self, zone: str, name: str, members: builtins.list[Any],
                  request: MachineRequest | None = None) -> MachineInfo:
        """The set's state; with the request (get, not list), a multi-host set's cluster is written."""
        labels = dict(members[0].labels)
        hosts = int(labels.get(LABEL_HOSTS, "1") or 1)
        by_host = {m.name.rsplit("-", 1)[-1]: m for m in members}
        states = [(self._member_state(zone, m), m) for m in members]
        missing = [str(h) for h in range(hosts) if str(h) not in by_host]
        if any(s == MachineState.PREEMPTED for s, _ in states) or (missing and self._preempted(zone, f"{name}-")):
            return MachineInfo(name, MachineState.PREEMPTED, labels, f"a VM of {name} was preempted in {zone}")
        if stopped := [m for s, m in states if s == MachineState.STOPPED]:
            return MachineInfo(name, MachineState.STOPPED, labels, f"VM {stopped[0].name} is {stopped[0].status}")
        if missing:
            return MachineInfo(name, MachineState.STOPPED, labels, f"host(s) {', '.join(missing)} of {name} are gone")
        if all(s == MachineState.READY for s, _ in states):
            if hosts > 1 and request is not None and name not in self._clustered:
                self._write_cluster(request, members)
                self._clustered.add(name)
            if hosts == 1 or name in self._clustered:
                return MachineInfo(name, MachineState.READY, labels, f"{hosts} VM(s) RUNNING in {zone}")
        statuses = ", ".join(sorted(f"{m.name}: {m.status}" for m in members))
        return MachineInfo(name, MachineState.CREATING, labels, statuses)

    def _member_state(self, zone: str, vm: Any) -> MachineState:
        state = INSTANCE_STATES.get(vm.status, MachineState.CREATING)
        if state == MachineState.STOPPED and vm.scheduling.provisioning_model == "SPOT" and self._preempted(zone, vm.name):
            return MachineState.PREEMPTED
        return state

    def _write_cluster(self, request: MachineRequest, members: builtins.list[Any]) -> None:
        """The cluster every host waits for: worker i at VM i's internal IP, port tf_port + i. Written
        to the request's job directory, never to one named by the VMs' metadata."""
        ordered = sorted(members, key=lambda m: int(m.name.rsplit("-", 1)[-1]))
        workers = [f"{m.network_interfaces[0].network_i_p}:{self.config.tf_port + i}" for i, m in enumerate(ordered)]
        storage.write_json(JobPaths.of(request.job_dir).cluster(request.attempt), {"worker": workers})
        log.info("cluster of %s: %s", ordered[0].name.rsplit("-", 1)[0], ", ".join(workers))

    def _preempted(self, zone: str, name_prefix: str) -> bool:
        """Whether the zone logged a preemption of a VM whose name starts with `name_prefix`."""
        ops = self._call(f"list operations in {zone}", lambda: builtins.list(self.clients.zone_operations.list(
            request={"project": self.config.project, "zone": zone,
                     "filter": f'operationType = "{PREEMPTED_OPERATION}"'})))
        return any(op.target_link.rsplit("/", 1)[-1].startswith(name_prefix) for op in ops)

    # --- calls ---

    def _list(self, zone: str, filter_: str, call: Call | None = None) -> builtins.list[Any]:
        found: builtins.list[Any] = (call or self._call)(f"list VMs in {zone}", lambda: builtins.list(
            self.clients.instances.list(request={"project": self.config.project, "zone": zone, "filter": filter_})))
        return found

    def _delete_instance(self, zone: str, name: str) -> Any:
        from google.api_core import exceptions as gexc

        try:
            return self._call(f"delete VM {name}", lambda: self.clients.instances.delete_unary(
                project=self.config.project, zone=zone, instance=name))
        except gexc.NotFound:
            return None

    def _poll(self, zone: str, operation: str, what: str) -> Any:
        return self._call(f"{what} operation {operation}", lambda: self.clients.zone_operations.get(
            project=self.config.project, zone=zone, operation=operation))

    def _delete_in(self, zone: str, name: str, hosts: int) -> None:
        operations = [op for h in range(hosts) if (op := self._delete_instance(zone, f"{name}-{h}")) is not None]
        self._wait_all(zone, operations, self.delete_wait_s, what="delete")

    def _wait_all(self, zone: str, operations: builtins.list[Any], wait_s: float | None = None,
                  what: str = "create") -> tuple[str, str] | None:
        """Follow the operations until all are DONE. The first error as (code, message), TIMED_OUT if
        they outlast the wait, else None."""
        deadline = self.clock() + (self.create_wait_s if wait_s is None else wait_s)
        pending = [op for op in operations if op is not None]
        first_error: tuple[str, str] | None = None
        while pending:
            still = []
            for op in pending:
                if not _done(op):
                    op = self._poll(zone, op.name, what)
                if not _done(op):
                    still.append(op)
                elif op.error.errors and first_error is None:
                    e = op.error.errors[0]
                    first_error = (e.code, op.http_error_message if not e.message else e.message)
            pending = still
            if pending:
                if self.clock() >= deadline:
                    return first_error or TIMED_OUT
                time.sleep(self.poll_s)
        return first_error


def _done(operation: Any) -> bool:
    # Operation.status is an enum in google-cloud-compute (Instance.status is a plain string).
    return bool(getattr(operation.status, "name", operation.status) == "DONE")


def _machine(acc: GpuAccelerator | CpuAccelerator | TpuAccelerator) -> tuple[str, tuple[str, int] | None]:
    """(machine type, guest accelerators or None). A2, A3 and G2 types bring their GPUs; N1 takes them
    as guest accelerators. A CPU job gets the n2-standard VM the catalogue prices (two vCPUs per replica)."""
    if isinstance(acc, TpuAccelerator):
        raise AssertionError(acc)
    machine_type = vm_machine_type(acc)
    if isinstance(acc, GpuAccelerator) and not bundled_gpus(machine_type):
        return machine_type, (acc.gpu_type, acc.count)
    return machine_type, None


def _describe(request: MachineRequest) -> str:
    acc, hosts = request.spec.accelerator, request.spec.workers
    vms = f"{hosts} VMs" if hosts > 1 else "a VM"
    match acc:
        case GpuAccelerator():
            return f"{vms} with {acc.count} x {acc.gpu_type}"
        case _:
            return f"{vms} of type {_machine(acc)[0]}"

