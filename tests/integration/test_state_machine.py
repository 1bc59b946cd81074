"""Transitions: legal ones move the row and log an event; illegal and stale ones raise and change nothing."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select, update

from service.db import jobs as jobdata
from service.db.jobstate import ALLOWED, IllegalTransition, JobStatus, StaleTransition, transition
from service.db.models import Job, JobEvent
from service.db.projects import ensure_project
from service.db.session import transaction
from tests.support.jobs import digits_spec
from trainjobs.spec import JobSpec
from trainjobs.states import HOLDING, TERMINAL, in_order

S = JobStatus


def _job(factory, status: S = S.QUEUED, owner: str | None = None) -> uuid.UUID:
    with transaction(factory) as s:
        project = ensure_project(s, "p")
        spec = JobSpec.model_validate(digits_spec()).model_dump(mode="json")
        job, _ = jobdata.create_job(s, project, spec, idempotency_key=None, request_hash=b"")
        s.execute(update(Job).where(Job.id == job.id).values(status=status, lease_owner=owner))
        return job.id


def _state(factory, job_id):
    with transaction(factory) as s:
        job = s.get(Job, job_id)
        events = [(e.from_status, e.to_status) for e in s.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id))]
        return job.status, events, job


@pytest.mark.parametrize("frm,to", sorted(ALLOWED, key=lambda p: (p[0].value, p[1].value)),
                         ids=lambda s: s.value)
def test_every_allowed_transition_moves_the_row_and_logs_it(db, frm, to):
    job_id = _job(db, frm, owner="w1")
    with transaction(db) as s:
        transition(s, job_id, frm, to, reason="test", owner="w1")
    status, events, job = _state(db, job_id)
    assert status == to and events[-1] == (frm, to)
    if to in TERMINAL:
        assert job.finished_at is not None and job.lease_owner is None


ILLEGAL = [(a, b) for a in S for b in S if (a, b) not in ALLOWED]


@pytest.mark.parametrize("frm,to", ILLEGAL[::3], ids=lambda s: s.value)  # a third of the 70 pairs, all kinds
def test_illegal_transition_raises_and_changes_nothing(db, frm, to):
    job_id = _job(db, frm)
    with pytest.raises(IllegalTransition), transaction(db) as s:
        transition(s, job_id, frm, to, reason="test")
    status, events, _ = _state(db, job_id)
    assert status == frm and len(events) == 1


def test_a_diverged_loss_is_recorded_as_null_not_refused_by_jsonb(db):
    """A job whose loss became NaN (a regression in float16 once did) reported it in its metrics, and
    every driver step failed on PostgreSQL's jsonb ("Token NaN is invalid") until the job FAILED."""
    job_id = _job(db, S.RUNNING, owner="w1")
    with transaction(db) as s:
        jobdata.record_progress(s, job_id, "w1", progress=0.5,
                                metrics={"loss": float("nan"), "val_loss": float("inf"), "accuracy": 0.5},
                                runtime={"notes": ["x"], "scores": [1.0, float("-inf")]})
    job = _state(db, job_id)[2]
    assert job.metrics == {"loss": None, "val_loss": None, "accuracy": 0.5}
    assert job.runtime == {"notes": ["x"], "scores": [1.0, None]}


def test_terminal_states_have_no_way_out():
    assert not [p for p in ALLOWED if p[0] in TERMINAL]


def test_stale_transition_from_wrong_state_raises(db):
    job_id = _job(db, S.RUNNING, owner="w1")
    with pytest.raises(StaleTransition), transaction(db) as s:
        transition(s, job_id, S.PROVISIONING, S.RUNNING, reason="late", owner="w1")
    assert _state(db, job_id)[0] == S.RUNNING


def test_transition_under_someone_elses_lease_raises(db):
    job_id = _job(db, S.RUNNING, owner="w1")
    with pytest.raises(StaleTransition), transaction(db) as s:
        transition(s, job_id, S.RUNNING, S.SUCCEEDED, reason="not mine", owner="w2")
    status, events, _ = _state(db, job_id)
    assert status == S.RUNNING and len(events) == 1


def test_cancel_wins_over_a_racing_worker_transition(db):
    job_id = _job(db, S.RUNNING, owner="w1")
    with transaction(db) as s:
        project = s.get(Job, job_id).project_id
        jobdata.request_cancel(s, project, job_id)
    with pytest.raises(StaleTransition), transaction(db) as s:
        transition(s, job_id, S.RUNNING, S.SUCCEEDED, reason="too late", owner="w1")
    assert _state(db, job_id)[0] == S.CANCELLING


def test_every_move_the_claim_makes_is_an_allowed_transition():
    from service.db.jobstate import CLAIM_MOVES

    assert set(CLAIM_MOVES.items()) <= ALLOWED


@pytest.mark.parametrize("frm", [*in_order(HOLDING), S.QUEUED],
                         ids=lambda s: s.value)
def test_the_claim_moves_each_status_as_the_state_machine_table_says(db, frm):
    from sqlalchemy import text

    from service.db import queue
    from service.db.jobstate import CLAIM_MOVES

    job_id = _job(db, frm, owner=None if frm == S.QUEUED else "dead-worker")
    if frm != S.QUEUED:  # a lease that ran out
        with transaction(db) as s:
            s.execute(text("UPDATE jobs SET lease_expires_at = now() - interval '1 minute' WHERE id = :id"),
                      {"id": job_id})
    with transaction(db) as s:
        claim = queue.claim_next_job(s, "new-worker", 30)
    assert claim is not None and (claim.from_status, claim.to_status) == (frm, CLAIM_MOVES[frm])
    status, events, job = _state(db, job_id)
    assert status == CLAIM_MOVES[frm] and events[-1] == (frm, CLAIM_MOVES[frm]) and job.lease_owner == "new-worker"


def test_the_schema_migrates_down_and_up_again(database_url):
    """Each migration's downgrade undoes its upgrade, on a scratch copy of the schema."""
    import psycopg
    from sqlalchemy.engine import make_url

    from service.db.session import downgrade, head_revision, upgrade

    url = make_url(database_url)
    scratch = f"{url.database}_mig"
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{scratch}"')
    try:
        scratch_url = url.set(database=scratch).render_as_string(hide_password=False)
        upgrade(scratch_url)
        downgrade(scratch_url, "base")
        upgrade(scratch_url)
        with psycopg.connect(url.set(drivername="postgresql", database=scratch).render_as_string(hide_password=False)) as conn:
            assert conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] == head_revision()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')
