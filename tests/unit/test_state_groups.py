"""The job-state groups (trainjobs/states.py) and everything written in them: the state table, the claim
and quota SQL, and the dashboard, which gets them from the API instead of spelling them."""

from __future__ import annotations

import json
import re

from service.db import queue, quotas
from service.db.jobstate import ALLOWED, CLAIM_MOVES
from service.routes.dashboard import UI_DIR, states_script
from trainjobs.states import ACTIVE, CANCELLABLE, GROUPS, HOLDING, TERMINAL, JobStatus, in_order, sql_list

S = JobStatus


def test_the_groups_say_what_each_status_is() -> None:
    assert ACTIVE == {S.STAGING, S.PROVISIONING, S.RUNNING, S.RECOVERING}
    assert HOLDING == ACTIVE | {S.CANCELLING}
    assert CANCELLABLE == ACTIVE | {S.QUEUED}
    assert TERMINAL == {S.SUCCEEDED, S.FAILED, S.CANCELLED}
    # every status is queued, holding a machine, or over: exactly one of them
    assert {S.QUEUED} | HOLDING | TERMINAL == set(S) and not HOLDING & TERMINAL and S.QUEUED not in HOLDING | TERMINAL
    assert {s for s in S if s.terminal} == TERMINAL


def test_the_state_table_is_written_in_the_groups() -> None:
    assert not [pair for pair in ALLOWED if pair[0] in TERMINAL]
    assert {(s, S.RECOVERING) for s in ACTIVE} <= ALLOWED  # a lost machine or worker, from any active status
    assert {(s, S.CANCELLING) for s in ACTIVE} <= ALLOWED and (S.QUEUED, S.CANCELLED) in ALLOWED  # CANCELLABLE
    assert not [pair for pair in ALLOWED if pair[1] == S.CANCELLING and pair[0] not in CANCELLABLE | {S.CANCELLING}]
    assert CLAIM_MOVES.keys() == HOLDING | {S.QUEUED}


def test_the_claim_and_the_quotas_count_the_holding_statuses() -> None:
    holding = sql_list(HOLDING)
    assert holding == "'STAGING', 'PROVISIONING', 'RUNNING', 'RECOVERING', 'CANCELLING'"
    # a lease is taken over only in a holding status, by the claim and the takeover alike: one CTE
    for statement in (queue.CLAIM_SQL, queue.TAKEOVER_SQL):
        assert queue._EXPIRED in str(statement) and queue._MOVE in str(statement)
    assert f"status IN ({holding})" in queue._EXPIRED
    assert quotas.HOLDING_SQL == holding and quotas.HOLDING_RANGE_SQL == "'STAGING' AND 'CANCELLING'"
    assert quotas.HOLDING_RANGE_SQL in str(queue.CLAIM_SQL)


def test_the_dashboard_gets_the_statuses_and_groups_from_the_api() -> None:
    script = states_script()
    served = json.loads(re.fullmatch(r"(?s)//[^\n]*\nconst JOB_STATES = Object\.freeze\((.*)\);\n", script)[1])
    assert served == {"STATUSES": [s.value for s in S], **{k: [s.value for s in in_order(g)] for k, g in GROUPS.items()}}
    page = "".join((UI_DIR / name).read_text() for name in ("index.html", "app.js"))
    assert '<script src="states.js"></script>\n<script src="app.js"></script>' in page
    # ... and spells none of them itself
    assert not re.findall(r"\b(?:%s)\b" % "|".join(s.value for s in S), page)
