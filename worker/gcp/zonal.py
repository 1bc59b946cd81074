"""What the Cloud TPU and the Compute Engine provisioners share: a machine lives in one of the
configured zones, calls are retried with backoff (errors.py), and the VMs' storage tokens go on for as
long as the machine lives (job_tokens.py, sealed to each VM by token_delivery.py).

Zones: create() tries them in the configured order, a stockout moving on to the next; get() asks first
the zone a machine was last seen in, so a running job costs one read per step, not one per zone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from worker.gcp.config import GcpConfig
from worker.gcp.errors import with_backoff
from worker.gcp.job_tokens import JobTokens, default_job_tokens
from worker.gcp.token_delivery import DueChecks


class ZonalProvisioner:
    """The base of TpuVmProvisioner and GceVmProvisioner."""

    def __init__(self, config: GcpConfig, *, backoff_s: float, tokens: JobTokens | None):
        self.config, self.backoff_s = config, backoff_s
        self.tokens = tokens if tokens is not None else default_job_tokens()
        self._zone_of: dict[str, str] = {}  # where each machine was last seen: its zone is asked first
        self._token_checks = DueChecks()  # when each VM's published key is read next

    def _zones_for(self, name: str) -> Iterator[str]:
        """The configured zones, the one the machine was last seen in first."""
        seen = self._zone_of.get(name)
        return iter(sorted(self.config.zones, key=lambda z: z != seen))

    def _seen(self, name: str, zone: str) -> None:
        self._zone_of[name] = zone

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        return with_backoff(call, what=what, base_s=self.backoff_s)


def duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} minutes" if seconds >= 60 else f"{seconds:.0f} seconds"
