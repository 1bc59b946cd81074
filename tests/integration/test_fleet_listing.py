"""Several workers, one listing (issue 25): the worker holding the fleet's listing lease lists each zone
on the shared schedule and the others answer their jobs from what it stored, so the fake cloud sees one
listing per interval for the whole fleet; a stopped lister's turn passes to another worker; a preemption
on a machine the listing worker does not drive is still noticed. Counts are the fake cloud's own; the
agents are stand-ins (tests/support/fleet.py: two real workers on one database and one fake)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from service.db.session import transaction
from tests.integration.test_machine_watch import (
    S, all_in, listing, machines, one_machine, requests_after_a_listing, statuses,
)
from tests.support import eventually, scaled
from tests.support.fleet import Fleet, fleet
from tests.support.worker import path
from worker.gcp.machine_watch import WatchConfig
from worker.gcp.zonal import ZonalProvisioner

EVERY = 1.0
WATCH = WatchConfig(every_s=EVERY, soon_s=0.5, max_every_s=4, max_age_s=60)


def lister(f: Fleet) -> str | None:
    with transaction(f.factory) as s:
        return s.execute(text("SELECT lister FROM machine_listings")).scalar()


def row(f: Fleet) -> object:
    with transaction(f.factory) as s:
        return s.execute(text("SELECT lister, lease_expires_at, now(), listed_at, interval_s FROM machine_listings")).all()


def worker_listing(f: Fleet) -> int:
    """The index of the worker whose turn it is to list."""
    names = [w.provisioner.fleet.me for w in f.workers if isinstance(w.provisioner, ZonalProvisioner) and w.provisioner.fleet]
    return names.index(eventually(lambda: lister(f), 10, "a lister"))


def drivers(f: Fleet, ids: list) -> set[str | None]:
    return {j.lease_owner for j in statuses(f, ids).values()}


@pytest.mark.parametrize("product", ["tpu"])  # Compute Engine's records go through the store in the tests below
def test_two_workers_list_each_zone_once_per_interval_between_them(db, database_url: str, tmp_path: Path,
                                                                    product: str) -> None:
    with fleet(database_url, db, product, tmp_path, jobs=3, train_s=600, poll_s=0.2, watch=WATCH, workers=2) as f:
        ids = f.submit(product, 6)
        eventually(lambda: all_in(f, ids, {S.RUNNING}), 60, "all 6 jobs RUNNING")
        assert drivers(f, ids) == {w.name for w in f.workers}  # both workers drive jobs: both need the listing
        window = 4 * EVERY
        seen = requests_after_a_listing(f, window)
        assert [r.path for r in seen if one_machine(r)] == []  # every job answered from a listing, either worker's
        # One fleet: at most one listing per 80% of an interval (two workers listing alone: 8 or more).
        assert 1 <= len([r for r in seen if listing(r)]) <= window / (0.8 * EVERY) + 1
        assert all_in(f, ids, {S.RUNNING})


def test_a_stopped_listing_worker_hands_the_listing_to_the_other(db, database_url: str, tmp_path: Path) -> None:
    with fleet(database_url, db, "tpu", tmp_path, jobs=3, train_s=600, poll_s=0.2, watch=WATCH, workers=2) as f:
        ids = f.submit("tpu", 6)
        eventually(lambda: all_in(f, ids, {S.RUNNING}), 60, "all 6 jobs RUNNING")
        first = worker_listing(f)
        other = f.workers[1 - first]
        f.workers[first].shutdown(timeout=10)
        stopped = len(f.fake.requests)
        # The lease (1.5 intervals) lapses and the other worker, whose jobs still need a listing, lists.
        eventually(lambda: lister(f) == other.provisioner.fleet.me, 4 * EVERY,  # type: ignore[attr-defined]
                   lambda: f"the other worker lists: {row(f)}, other {other.provisioner.fleet.me}")
        eventually(lambda: any(listing(r) for r in f.fake.requests[stopped:]), 2 * EVERY, "a listing after")
        mine = [i for i, j in statuses(f, ids).items() if j.lease_owner == other.name]
        assert mine and all_in(f, mine, {S.RUNNING})


def test_a_preemption_under_a_worker_that_does_not_list_is_noticed(db, database_url: str, tmp_path: Path) -> None:
    with fleet(database_url, db, "gpu", tmp_path, jobs=2, train_s=scaled(2), poll_s=0.2, watch=WATCH, workers=2) as f:
        ids = f.submit("gpu", 4, spot=True)
        eventually(lambda: all_in(f, ids, {S.RUNNING}), 60, "all 4 jobs RUNNING")
        reader = f.workers[1 - worker_listing(f)]
        victim_job = next(i for i, j in statuses(f, ids).items() if j.lease_owner == reader.name)
        [victim] = [m for m in machines(f) if victim_job.hex[:20] in m]
        f.fake.preempt(victim)  # a spot VM, deleted by Google (instanceTerminationAction DELETE)
        eventually(lambda: all_in(f, ids, {S.SUCCEEDED}), 60, lambda: f"all SUCCEEDED: {statuses(f, ids)}")
        assert statuses(f, ids)[victim_job].attempt == 2
        assert "RECOVERING" in path(f.factory, victim_job)


def test_a_rate_limit_stretches_the_fleet_s_schedule_for_every_worker(db, database_url: str, tmp_path: Path) -> None:
    with fleet(database_url, db, "gpu", tmp_path, jobs=2, train_s=600, poll_s=0.2, watch=WATCH, workers=2) as f:
        ids = f.submit("gpu", 4)
        eventually(lambda: all_in(f, ids, {S.RUNNING}), 60, "all 4 jobs RUNNING")
        # Under a third of what a listing a second needs: the lister is refused, stretches its interval and
        # stores it with the listing; the worker that does not list adopts it (its own calls were never
        # refused). The lister's probes back down (half the interval after two without a refusal) are
        # refused too, so the schedule stays stretched. At 5 a window, a listing every 2 s was just within
        # it: the schedule went back to 1 s between refusals, and under a loaded suite the test once missed
        # every moment when both workers and the stored schedule stood at 2 s.
        f.fake.limit_reads(3, window_s=10.0)
        eventually(lambda: schedule(f) > EVERY and all(i >= schedule(f) for i in intervals(f)), 30,
                   lambda: f"every worker on the stretched schedule: {schedule(f)}, {intervals(f)}")
        f.fake.limit_reads(None)
        assert all_in(f, ids, {S.RUNNING})


def schedule(f: Fleet) -> float:
    with transaction(f.factory) as s:
        return float(s.execute(text("SELECT interval_s FROM machine_listings")).scalar_one())


def intervals(f: Fleet) -> list[float]:
    return [w.provisioner.watch.interval_s for w in f.workers if isinstance(w.provisioner, ZonalProvisioner)
            and w.provisioner.watch is not None]
