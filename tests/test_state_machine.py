"""Transitions: legal ones move the row and log an event; illegal and stale ones raise and change nothing."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select

from service.db import jobs as jobdata
from service.db.jobstate import ALLOWED, IllegalTransition, JobStatus, StaleTransition, transition
from service.db.models import Job, JobEvent
from service.db.projects import ensure_project
from service.db.session import transaction
from tests.conftest import digits_spec
from trainjobs.spec import JobSpec

S = JobStatus


def _job(factory, status: S = S.QUEUED, owner: str | None = None) -> uuid.UUID:
    with transaction(factory) as s:
        project = ensure_project(s, "p")
        spec = JobSpec.model_validate(digits_spec()).model_dump(mode="json")
        job, _ = jobdata.create_job(s, project, spec, idempotency_key=None, request_hash=b"")
        job.status, job.lease_owner = status, owner
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
    if to in (S.SUCCEEDED, S.FAILED, S.CANCELLED):
        assert job.finished_at is not None and job.lease_owner is None


ILLEGAL = [(a, b) for a in S for b in S if (a, b) not in ALLOWED]


@pytest.mark.parametrize("frm,to", ILLEGAL[::3], ids=lambda s: s.value)  # a third of the 70 pairs, all kinds
def test_illegal_transition_raises_and_changes_nothing(db, frm, to):
    job_id = _job(db, frm)
    with pytest.raises(IllegalTransition), transaction(db) as s:
        transition(s, job_id, frm, to, reason="test")
    status, events, _ = _state(db, job_id)
    assert status == frm and len(events) == 1


def test_terminal_states_have_no_way_out():
    assert not [p for p in ALLOWED if p[0] in (S.SUCCEEDED, S.FAILED, S.CANCELLED)]


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
