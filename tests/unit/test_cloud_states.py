"""Each cloud's machine states mapped to ours in one place (worker/gcp/compute.py for Compute Engine):
every status the API documents has a state, and only a running VM is ready."""

from __future__ import annotations

from worker.gcp.compute import INSTANCE_STATES
from worker.ports import MachineState


def test_every_instance_status_maps_to_a_machine_state() -> None:
    statuses = {"PROVISIONING", "STAGING", "RUNNING", "STOPPING", "STOPPED", "SUSPENDING", "SUSPENDED", "TERMINATED",
                "REPAIRING"}
    assert set(INSTANCE_STATES) == statuses
    assert {s for s, m in INSTANCE_STATES.items() if m == MachineState.READY} == {"RUNNING"}
