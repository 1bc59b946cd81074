"""Cloud TPU VMs through google-cloud-tpu (TPU API v2). The only module that imports google.cloud.tpu*.

A machine is one TPU node named after the request (deterministic per job and attempt, so a second
create finds the first and a new worker adopts what a dead one made). On-demand and spot nodes are
created directly, in the configured zone and then each fallback zone; when every zone is out of the
type, the node is queued instead (a queued resource in the first zone, valid for the configured
capacity wait), so Google hands it over when capacity frees up and fails it when the wait is over.
"""

from __future__ import annotations

import builtins
import concurrent.futures
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from trainjobs import storage
from trainjobs.spec import TpuAccelerator
from trainjobs.vm_metadata import (
    JOB_DIR_KEY, LABEL_MANAGED, MACHINE_KEY, NODE_NAME_KEY, PUBLIC_KEY_PATH, SEALED_KEY, STARTUP_SCRIPT_KEY, TPU_API_KEY)
from worker.gcp.bootstrap import startup_script, upload_agent_wheel
from worker.gcp.config import GcpConfig
from worker.gcp.errors import MachineRefused, cloud_message, is_stockout, is_transient
from worker.gcp.job_tokens import JobTokens
from worker.gcp.fleet_listing import Codec
from worker.gcp.machine_watch import WatchConfig
from worker.gcp.token_delivery import create_metadata, published_keys, sealed_value
from worker.gcp.zonal import Call, ZonalProvisioner, duration
from worker.ports import MachineInfo, MachineRequest, MachineState

log = logging.getLogger("trainjobs.worker")

# The TPU API's states, ours beside them: the only place they meet.
NODE_STATES: dict[str, MachineState] = {
    "CREATING": MachineState.CREATING,
    "STARTING": MachineState.CREATING,
    # Google restarts or repairs the hosts in place; the agent is gone until it is back, and the
    # driver's agent-silence limit decides whether to wait or start a new attempt.
    "RESTARTING": MachineState.CREATING,
    "REIMAGING": MachineState.CREATING,
    "REPAIRING": MachineState.CREATING,
    "UNKNOWN": MachineState.CREATING,
    "STATE_UNSPECIFIED": MachineState.CREATING,
    "READY": MachineState.READY,
    "PREEMPTED": MachineState.PREEMPTED,  # spot/preemptible: kept by Google (and counted against quota) until deleted
    "TERMINATED": MachineState.STOPPED,
    "STOPPING": MachineState.STOPPED,
    "STOPPED": MachineState.STOPPED,
    "HIDING": MachineState.STOPPED,
    "HIDDEN": MachineState.STOPPED,
    "UNHIDING": MachineState.STOPPED,
    "DELETING": MachineState.DELETING,
}
# A queued resource before its node exists (once it does, the node's own state is reported).
QUEUED_STATES: dict[str, MachineState] = {
    "STATE_UNSPECIFIED": MachineState.CREATING,
    "CREATING": MachineState.CREATING,
    "ACCEPTED": MachineState.CREATING,
    "WAITING_FOR_RESOURCES": MachineState.CREATING,
    "PROVISIONING": MachineState.CREATING,
    "ACTIVE": MachineState.CREATING,
    "FAILED": MachineState.STOPPED,
    "SUSPENDING": MachineState.PREEMPTED,  # a spot queued resource whose node was taken back
    "SUSPENDED": MachineState.PREEMPTED,
    "DELETING": MachineState.DELETING,
}
# A queued resource in these has no machine yet and waits for Google's capacity (up to the capacity wait).
WAITING_STATES = frozenset({"STATE_UNSPECIFIED", "CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES"})
ACCELERATOR_CONFIG_TYPES = {"v2": "V2", "v3": "V3", "v4": "V4", "v5litepod": "V5LITE_POD", "v5p": "V5P", "v6e": "V6E"}
RESOURCE_EXHAUSTED = 8  # google.rpc.Code
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]


def tpu_client(config: GcpConfig) -> Any:
    """The real client. An http:// TPU_API_ENDPOINT (a fake API) gets REST, no credentials, that endpoint."""
    from google.api_core.client_options import ClientOptions
    from google.cloud import tpu_v2

    endpoint = config.tpu_api_endpoint
    if endpoint and endpoint.startswith("http://"):
        from google.auth.credentials import AnonymousCredentials

        return tpu_v2.TpuClient(transport="rest", credentials=AnonymousCredentials(),
                                client_options=ClientOptions(api_endpoint=endpoint))
    return tpu_v2.TpuClient(client_options=ClientOptions(api_endpoint=endpoint) if endpoint else None)


def agent_startup_script(request: MachineRequest) -> str:
    bucket, _ = storage.split_uri(request.job_dir)
    return startup_script(request.job_dir, upload_agent_wheel(bucket))


@dataclass(frozen=True)
class Listed:
    """A machine in a listing: its node, its queued resource, or both (a queued resource's node)."""

    node: Any
    queued: Any


def _proto(message: Any) -> Any:
    return None if message is None else json.loads(type(message).to_json(message))


def _listed(record: Any) -> Listed:
    from google.cloud import tpu_v2

    node, queued = record["node"], record["queued"]
    return Listed(tpu_v2.Node.from_json(json.dumps(node), ignore_unknown_fields=True) if node is not None else None,
                  tpu_v2.QueuedResource.from_json(json.dumps(queued), ignore_unknown_fields=True)
                  if queued is not None else None)


# A listed machine as stored for the fleet (fleet_listing.py): its messages in the API's own JSON.
LISTED_JSON: Codec[Listed] = Codec(lambda listed: {"node": _proto(listed.node), "queued": _proto(listed.queued)}, _listed)


class TpuVmProvisioner(ZonalProvisioner):
    kind = "cloud-tpu"

    def __init__(self, config: GcpConfig, *, client: Any = None, create_wait_s: float = 60.0,
                 delete_wait_s: float = 600.0, backoff_s: float = 0.5,
                 startup: Callable[[MachineRequest], str] = agent_startup_script, tokens: JobTokens | None = None,
                 watch: WatchConfig | None = None, fleet: sessionmaker[Session] | None = None):
        """create_wait_s: how long create() follows the create operation before leaving it to get();
        delete_wait_s: how long delete() waits for Google to confirm; backoff_s: the first retry's delay;
        tokens: per-job storage tokens for the VMs (default: on, unless storage is the emulator); watch:
        answer get() from one listing per zone on this schedule (machine_watch.py; None: a read per get);
        fleet: that listing shared by every worker on this database (fleet_listing.py)."""
        super().__init__(config, backoff_s=backoff_s, tokens=tokens, listing=self._list_all, codec=LISTED_JSON,
                         watch=watch, fleet=fleet)
        self.create_wait_s, self.delete_wait_s, self.startup = create_wait_s, delete_wait_s, startup
        self.client = client if client is not None else tpu_client(config)

    # --- Provisioner ---

    def create(self, request: MachineRequest) -> MachineInfo:
        from google.api_core import exceptions as gexc

        if not isinstance(request.spec.accelerator, TpuAccelerator):
            raise MachineRefused(f"the Cloud TPU provisioner runs TPU jobs, not {request.spec.accelerator.type}")
        if (existing := self.get(request)) is not None:
            return existing
        node = self._node(request)
        self._touch(request.name)
        for zone in self.config.zones:
            node.metadata[NODE_NAME_KEY] = self._path(zone, "nodes", request.name)
            try:
                operation = self._call(f"create TPU node {request.name} in {zone}", lambda: self.client.create_node(
                    parent=self._parent(zone), node_id=request.name, node=node))
                if self.create_wait_s > 0:
                    operation.result(timeout=self.create_wait_s)
            except gexc.AlreadyExists:
                break
            except concurrent.futures.TimeoutError:
                break  # still creating; get() follows it from here
            except gexc.GoogleAPICallError as exc:
                if is_stockout(exc):
                    log.info("no %s capacity in %s: %s", node.accelerator_type, zone, cloud_message(exc))
                    continue
                if is_transient(exc):
                    raise  # still failing after the retries: the driver's next step tries again
                raise MachineRefused(cloud_message(exc)) from exc
            break
        else:
            return self._queue(request, node)
        return self.get(request) or MachineInfo(request.name, MachineState.CREATING, request.labels)

    def get(self, request: MachineRequest) -> MachineInfo | None:
        name = request.name
        if self.watch is not None and (seen := self.watch.find(name)) is not None:
            zone, listed = seen
            self._seen(name, zone)
            return self._node_seen(request, listed.node) if listed.node is not None else self._queued_info(
                listed.queued, zone)
        for zone in self._zones_for(name):
            if (node := self._find(lambda: self.client.get_node(name=self._path(zone, "nodes", name)))) is not None:
                self._seen(name, zone)
                return self._node_seen(request, node)
            queued = self._find(lambda: self.client.get_queued_resource(name=self._path(zone, "queuedResources", name)))
            if queued is not None:
                self._seen(name, zone)
                return self._queued_info(queued, zone)
        self._zone_of.pop(name, None)
        return None

    def delete(self, name: str) -> None:
        """Deletes the node and its queued resource in every zone, and waits until Google confirms."""
        if self.tokens is not None:
            self.tokens.stop(name)
        self._token_checks.forget(name)
        self._touch(name, soon=False)
        for zone in self.config.zones:
            # A queued resource owns its node: `force` deletes both.
            self._delete(f"queued resource {name}", lambda: self.client.delete_queued_resource(
                request={"name": self._path(zone, "queuedResources", name), "force": True}))
            self._delete(f"TPU node {name}", lambda: self.client.delete_node(name=self._path(zone, "nodes", name)))

    def list(self, labels: dict[str, str]) -> builtins.list[MachineInfo]:
        found = []
        for name, (zone, listed) in self._fresh_listing().items():
            if listed.node is not None and labels.items() <= dict(listed.node.labels).items():
                found.append(self._node_info(listed.node))
            elif listed.node is None and labels.items() <= dict(listed.queued.tpu.node_spec[0].node.labels).items():
                found.append(self._queued_info(listed.queued, zone))
        return found

    def _list_all(self, call: Call) -> dict[str, tuple[str, Listed]]:
        """Our nodes and queued resources in every zone (the TPU API's list takes no filter: by our label
        here), a zone's node and its queued resource as one machine."""
        found: dict[str, tuple[str, Listed]] = {}
        for zone in self.config.zones:
            nodes = call(f"list TPU nodes in {zone}", lambda: builtins.list(self.client.list_nodes(
                parent=self._parent(zone))))
            queued = call(f"list queued resources in {zone}", lambda: builtins.list(
                self.client.list_queued_resources(parent=self._parent(zone))))
            for node in nodes:
                if dict(node.labels).get(LABEL_MANAGED) == "true":
                    found.setdefault(node.name.rsplit("/", 1)[-1], (zone, Listed(node, None)))
            for qr in queued:
                spec = qr.tpu.node_spec[0] if qr.tpu.node_spec else None
                if spec is None or dict(spec.node.labels).get(LABEL_MANAGED) != "true":
                    continue
                seen = found.get(spec.node_id)
                if seen is None:
                    found[spec.node_id] = (zone, Listed(None, qr))
                elif seen[0] == zone:
                    found[spec.node_id] = (zone, Listed(seen[1].node, qr))
        return found

    # --- requests ---

    def _node(self, request: MachineRequest) -> Any:
        from google.cloud import tpu_v2

        acc = request.spec.accelerator
        assert isinstance(acc, TpuAccelerator)
        c = self.config
        node = tpu_v2.Node(
            description=f"trainjobs job {request.job_id} attempt {request.attempt}",
            runtime_version=acc.runtime_version,
            labels=request.labels,
            metadata={STARTUP_SCRIPT_KEY: self.startup(request), JOB_DIR_KEY: request.job_dir,
                      TPU_API_KEY: c.tpu_api_endpoint or "https://tpu.googleapis.com",
                      # The VM's only way into storage: a token for this job's own objects, which
                      # comes sealed to each host's own key once it asks (no token in metadata).
                      **(self._token_metadata(request) if self.tokens else {})},
            tags=builtins.list(c.tags),
            network_config=tpu_v2.NetworkConfig(network=c.network or "", subnetwork=c.subnetwork or "",
                                                enable_external_ips=True),
            scheduling_config=tpu_v2.SchedulingConfig(spot=acc.spot),
        )
        if acc.topology:
            # A topology is asked for through accelerator_config, which replaces accelerator_type.
            generation = acc.tpu_type.rsplit("-", 1)[0]
            node.accelerator_config = tpu_v2.AcceleratorConfig(
                type_=ACCELERATOR_CONFIG_TYPES[generation], topology=acc.topology)
        else:
            node.accelerator_type = acc.tpu_type
        if c.service_account:
            node.service_account = tpu_v2.ServiceAccount(email=c.service_account, scope=SCOPES)
        return node

    def _queue(self, request: MachineRequest, node: Any) -> MachineInfo:
        """Every zone is out of this type: ask Google to queue the node in the first zone for at most
        the capacity wait. A queued resource carries spot itself; its node must not."""
        from google.api_core import exceptions as gexc
        from google.cloud import tpu_v2

        zone, spot = self.config.zone, bool(node.scheduling_config.spot)
        queued_node = tpu_v2.Node(node)
        del queued_node.scheduling_config
        queued_node.metadata[NODE_NAME_KEY] = self._path(zone, "nodes", request.name)
        qr = tpu_v2.QueuedResource(
            tpu=tpu_v2.QueuedResource.Tpu(node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(
                parent=self._parent(zone), node_id=request.name, node=queued_node)]),
            queueing_policy=tpu_v2.QueuedResource.QueueingPolicy(
                valid_until_duration=timedelta(seconds=math.ceil(self.config.capacity_wait_s))),
        )
        if spot:
            qr.spot = tpu_v2.QueuedResource.Spot()
        try:
            self._touch(request.name)
            self._call(f"queue TPU node {request.name} in {zone}", lambda: self.client.create_queued_resource(
                parent=self._parent(zone), queued_resource_id=request.name, queued_resource=qr))
        except gexc.AlreadyExists:
            pass
        except gexc.GoogleAPICallError as exc:
            if is_transient(exc):
                raise
            raise MachineRefused(cloud_message(exc)) from exc
        log.info("%s: no zone has %s capacity now; queued in %s", request.name, node.accelerator_type, zone)
        return self.get(request) or MachineInfo(request.name, MachineState.CREATING, request.labels)

    # --- the first storage token, sealed to each host's own key (worker/gcp/token_delivery.py) ---

    def _token_metadata(self, request: MachineRequest) -> dict[str, str]:
        assert self.tokens is not None
        self.tokens.start(request)  # refreshed from now on; the hosts get the token sealed once they ask for it
        return create_metadata(request.name)

    def _deliver_token(self, request: MachineRequest, node: Any) -> None:
        """Seal the job's token to each host's published key, into the node's metadata. A failure is
        logged and tried again at the next look (the hosts wait for it at boot; the driver's boot limit
        decides): it never fails the look itself."""
        from google.cloud import tpu_v2

        assert self.tokens is not None
        name, metadata = request.name, dict(node.metadata)
        if MACHINE_KEY not in metadata or not self._token_checks.due(name, max(1, len(node.network_endpoints)),
                                                                     metadata.get(SEALED_KEY)):
            return
        try:
            found = self.client.get_guest_attributes(request={"name": node.name, "query_path": PUBLIC_KEY_PATH})
            keys = published_keys(name, ((e.namespace, e.key, e.value)
                                         for g in found.guest_attributes for e in g.query_value.items))
            value = sealed_value(name, keys, metadata.get(SEALED_KEY), self.tokens.start(request))
            if value is not None:  # the whole map is replaced: every other key goes back as it was
                self.client.update_node(request={"update_mask": {"paths": ["metadata"]}, "node": tpu_v2.Node(
                    name=node.name, metadata={**metadata, SEALED_KEY: value})})
                log.info("%s: storage token sealed to %d host key(s)", name, len(keys))
            self._token_checks.checked(name)
        except Exception as exc:
            log.warning("%s: could not deliver the first storage token yet: %s", name, cloud_message(exc))

    # --- responses ---

    def _node_seen(self, request: MachineRequest, node: Any) -> MachineInfo:
        info = self._node_info(node)
        if self.tokens is not None and info.state in (MachineState.CREATING, MachineState.READY):
            self.tokens.keep(request)  # adopted: tokens go on, for the request's boundary
            self._deliver_token(request, node)
        return info

    def _node_info(self, node: Any) -> MachineInfo:
        state = NODE_STATES.get(node.state.name, MachineState.CREATING)
        detail = f"TPU node {node.state.name}" + (f": {node.health_description}" if node.health_description else "")
        return MachineInfo(node.name.rsplit("/", 1)[-1], state, dict(node.labels), detail)

    def _queued_info(self, qr: Any, zone: str) -> MachineInfo:
        spec = qr.tpu.node_spec[0]
        name = qr.name.rsplit("/", 1)[-1]
        state_name = qr.state.state.name
        detail = f"queued resource {state_name}"
        if state_name == "FAILED":
            error = qr.state.failed_data.error
            detail = error.message or "the queued resource failed"
            if error.code == RESOURCE_EXHAUSTED:  # the queueing window closed before capacity came
                tpu_type = spec.node.accelerator_type or spec.node.accelerator_config.topology
                detail = f"no capacity in {zone} for {tpu_type} after {duration(self.config.capacity_wait_s)}"
        return MachineInfo(name, QUEUED_STATES.get(state_name, MachineState.CREATING), dict(spec.node.labels), detail,
                           waiting_for_capacity=state_name in WAITING_STATES,
                           refused=detail if state_name == "FAILED" else None)

    # --- calls ---

    def _parent(self, zone: str) -> str:
        return f"projects/{self.config.project}/locations/{zone}"

    def _path(self, zone: str, collection: str, name: str) -> str:
        return f"{self._parent(zone)}/{collection}/{name}"

    def _find(self, call: Callable[[], Any]) -> Any:
        from google.api_core import exceptions as gexc

        try:
            return self._call("read TPU inventory", call)
        except gexc.NotFound:
            return None

    def _delete(self, what: str, call: Callable[[], Any]) -> None:
        from google.api_core import exceptions as gexc

        try:
            operation = self._call(f"delete {what}", call)
            operation.result(timeout=self.delete_wait_s)
        except gexc.NotFound:
            return
        except concurrent.futures.TimeoutError:
            log.warning("delete %s not confirmed within %.0fs; the reaper finishes it", what, self.delete_wait_s)

