"""The shared machine listing's schedule (worker/gcp/machine_watch.py) on a clock the test moves, and which
Google errors are rate limits (worker/gcp/errors.py)."""

from __future__ import annotations

import pytest
from google.api_core import exceptions as gexc

from worker.gcp.errors import is_rate_limited, is_transient
from worker.gcp.machine_watch import Listing, MachineWatch, WatchConfig
from worker.ports import RateLimited

CONFIG = WatchConfig(every_s=20, soon_s=2, max_every_s=60, max_age_s=180)
COMPUTE_RATE_LIMIT = gexc.Forbidden("Quota exceeded for quota metric 'Read requests' and limit 'Read requests per "
                                    "minute'", errors=[{"reason": "rateLimitExceeded", "domain": "usageLimits"}])


class Cloud:
    """Machines by name; `refuse` makes the next listings fail with a rate limit."""

    def __init__(self) -> None:
        self.machines: dict[str, tuple[str, str]] = {}
        self.listings = 0
        self.refuse = False

    def fetch(self) -> dict[str, tuple[str, str]]:
        self.listings += 1
        if self.refuse:
            raise COMPUTE_RATE_LIMIT
        return dict(self.machines)


def watch(cloud: Cloud) -> tuple[MachineWatch[str], list[float]]:
    now = [1000.0]
    return MachineWatch("compute-engine", cloud.fetch, CONFIG, clock=lambda: now[0], jitter=lambda: 1.0), now


def test_looks_within_the_interval_share_one_listing() -> None:
    cloud = Cloud()
    cloud.machines["m"] = ("zone-a", "RUNNING")
    w, now = watch(cloud)
    for _ in range(100):
        assert w.find("m") == ("zone-a", "RUNNING")
        now[0] += 0.1
    assert cloud.listings == 1
    now[0] += 20
    w.find("m")
    assert cloud.listings == 2


def test_a_machine_not_in_the_listing_or_touched_since_it_began_is_read_by_its_job() -> None:
    cloud = Cloud()
    w, now = watch(cloud)
    assert w.find("new") is None  # created after the listing: the job reads it itself
    cloud.machines["old"] = ("zone-a", "RUNNING")
    now[0] += 20
    w.find("old")
    w.touched("old", soon=False)  # this process deletes it: the listing cannot say what it is now
    assert w.find("old") is None
    w.touched("new")  # ... and creates another: the next listing comes soon, not at the interval
    now[0] += 2
    cloud.machines.pop("old")
    cloud.machines["new"] = ("zone-a", "STAGING")
    assert w.find("new") == ("zone-a", "STAGING")
    assert cloud.listings == 3


def test_rate_limits_double_the_interval_up_to_the_cap_and_jobs_are_told_not_to_read() -> None:
    cloud = Cloud()
    cloud.machines["m"] = ("zone-a", "RUNNING")
    w, now = watch(cloud)
    w.find("m")
    cloud.refuse = True
    intervals = []
    for _ in range(4):
        now[0] += w.interval_s
        assert w.find("m") == ("zone-a", "RUNNING")  # the last listing still answers
        intervals.append(w.interval_s)
    assert intervals == [40, 60, 60, 60]
    with pytest.raises(RateLimited):  # a machine it cannot answer for: no read of its own to add to the quota
        w.find("other")


def test_the_interval_steps_back_after_two_intervals_without_a_refusal() -> None:
    cloud = Cloud()
    w, now = watch(cloud)
    w.find("m")
    w.rate_limited(COMPUTE_RATE_LIMIT)
    assert w.interval_s == 40
    now[0] += 40
    w.find("m")  # a listing succeeds, but the refusal is recent
    assert w.interval_s == 40
    now[0] += 40
    w.find("m")
    assert w.interval_s == 20
    assert w.find("unknown") is None  # no longer held: the job may read its own machine


def test_a_listing_made_for_list_is_every_job_s_and_resets_the_schedule() -> None:
    cloud = Cloud()
    w, now = watch(cloud)
    w.find("m")
    now[0] += 15
    w.offer(Listing(now[0], {"m": ("zone-b", "RUNNING")}))
    now[0] += 10  # 25 s after the scheduled listing, 10 after the offered one
    assert w.find("m") == ("zone-b", "RUNNING")
    assert cloud.listings == 1


def test_a_listing_begun_before_a_create_leaves_the_soon_listing_due() -> None:
    cloud = Cloud()
    w, now = watch(cloud)
    w.find("m")
    began = now[0] + 1
    now[0] += 1.5
    w.touched("new")  # created while a teardown's listing (begun at `began`) was under way
    w.offer(Listing(began, {}))
    now[0] += 2
    cloud.machines["new"] = ("zone-a", "STAGING")
    assert w.find("new") == ("zone-a", "STAGING")  # listed 2 s after the create, not 20 s after the offer
    assert cloud.listings == 2


@pytest.mark.parametrize("exc, limited", [
    (COMPUTE_RATE_LIMIT, True),  # Compute Engine v1: 403, errors[].reason
    (gexc.TooManyRequests("Quota exceeded for quota metric 'Read requests' and limit 'Read requests per minute'"), True),
    (gexc.Forbidden("Required 'compute.instances.list' permission for 'projects/p'"), False),
    (gexc.TooManyRequests("Quota limit 'TPUS-per-project-per-zone' has been exceeded."), False),  # chips, not rate
], ids=["compute-403", "tpu-429", "permission", "chip-quota"])
def test_rate_limits_are_told_from_permission_and_resource_quotas(exc: Exception, limited: bool) -> None:
    assert is_rate_limited(exc) is limited
    assert is_transient(exc) is limited
