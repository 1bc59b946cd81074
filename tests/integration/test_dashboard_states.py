"""The dashboard's statuses and groups come from the API (service/routes/dashboard.py), under the same
headers as every other file of the page."""

from __future__ import annotations

from service.routes.dashboard import states_script, sweep_states_script


def test_the_page_gets_the_job_state_groups_from_the_api(api) -> None:  # type: ignore[no-untyped-def]
    r = api.get("/ui/states.js")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript")
    assert r.text == states_script()
    assert r.headers["content-security-policy"].startswith("default-src 'self'")
    assert r.headers["x-content-type-options"] == "nosniff"


def test_the_page_gets_the_sweep_and_trial_states_from_the_api(api) -> None:  # type: ignore[no-untyped-def]
    from trainjobs.states import SWEEP_CANCELLABLE, SweepStatus, TrialState

    r = api.get("/ui/sweep-states.js")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript")
    assert r.text == sweep_states_script()
    assert r.headers["content-security-policy"].startswith("default-src 'self'")
    assert r.headers["x-content-type-options"] == "nosniff"
    groups = __import__("json").loads(r.text.split("Object.freeze(", 1)[1].rsplit(");", 1)[0])
    assert groups["STATUSES"] == [s.value for s in SweepStatus]
    assert groups["CANCELLABLE"] == [s.value for s in SWEEP_CANCELLABLE]  # what request_cancel acts on
    assert set(groups["TRIAL"].values()) == {s.value for s in TrialState}
