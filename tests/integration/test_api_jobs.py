"""The jobs API over real HTTP and real PostgreSQL."""

from __future__ import annotations

import threading
import uuid

import httpx
import pytest

from tests.support.jobs import digits_spec, make_key


def test_submit_then_read_back(api):
    r = api.post("/v1/jobs", json=digits_spec(labels={"team": "vision"}))
    assert r.status_code == 201
    job = r.json()
    assert r.headers["location"] == f"/v1/jobs/{job['id']}"
    got = api.get(f"/v1/jobs/{job['id']}").json()
    assert got["status"] == "QUEUED" and got["attempt"] == 0
    assert got["spec"]["training"]["epochs"] == 2 and got["labels"] == {"team": "vision"}
    events = api.get(f"/v1/jobs/{job['id']}/events").json()["events"]
    assert [(e["from_status"], e["to_status"]) for e in events] == [(None, "QUEUED")]


def test_idempotency_key_replays_same_job(api):
    headers = {"Idempotency-Key": "abc-1"}
    first = api.post("/v1/jobs", json=digits_spec(), headers=headers)
    again = api.post("/v1/jobs", json=digits_spec(), headers=headers)
    assert first.status_code == 201 and again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true"
    assert first.json()["id"] == again.json()["id"]


def test_idempotency_key_with_different_body_is_409(api):
    api.post("/v1/jobs", json=digits_spec(), headers={"Idempotency-Key": "k"})
    r = api.post("/v1/jobs", json=digits_spec(name="other"), headers={"Idempotency-Key": "k"})
    assert r.status_code == 409 and r.json()["error"]["error"] == "idempotency_conflict"


def test_concurrent_duplicates_create_one_job(api, api_url):
    barrier = threading.Barrier(16)
    ids: list[str] = []
    codes: list[int] = []

    def post() -> None:
        with httpx.Client(base_url=api_url, headers=dict(api.headers)) as c:
            barrier.wait()
            r = c.post("/v1/jobs", json=digits_spec(), headers={"Idempotency-Key": "race"})
            codes.append(r.status_code)
            ids.append(r.json()["id"])

    threads = [threading.Thread(target=post) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 1
    assert sorted(codes) == [200] * 15 + [201]
    assert len(api.get("/v1/jobs").json()["jobs"]) == 1


def test_list_filters_by_status_and_label(api):
    a = api.post("/v1/jobs", json=digits_spec(labels={"team": "a"})).json()
    b = api.post("/v1/jobs", json=digits_spec(labels={"team": "b", "env": "dev"})).json()
    api.post(f"/v1/jobs/{a['id']}/cancel")
    by_label = api.get("/v1/jobs", params={"label": "team=b"}).json()["jobs"]
    assert [j["id"] for j in by_label] == [b["id"]]
    assert api.get("/v1/jobs", params=[("label", "team=b"), ("label", "env=prod")]).json()["jobs"] == []
    cancelled = api.get("/v1/jobs", params={"status": "CANCELLED"}).json()["jobs"]
    assert [j["id"] for j in cancelled] == [a["id"]]
    both = api.get("/v1/jobs", params=[("status", "CANCELLED"), ("status", "QUEUED")]).json()["jobs"]
    assert {j["id"] for j in both} == {a["id"], b["id"]}


def test_pagination_is_stable_while_jobs_arrive(api):
    before = [api.post("/v1/jobs", json=digits_spec(name=f"j{i}")).json()["id"] for i in range(25)]
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 7, **({"cursor": cursor} if cursor else {})}
        page = api.get("/v1/jobs", params=params).json()
        seen += [j["id"] for j in page["jobs"]]
        api.post("/v1/jobs", json=digits_spec(name="late"))  # arrives between pages
        if not (cursor := page["next_cursor"]):
            break
    assert seen == list(reversed(before))  # every earlier job once, newest first, no late ones mixed in


@pytest.mark.parametrize("params,field", [({"limit": 201}, "limit"), ({"limit": 0}, "limit"),
                                          ({"cursor": "garbage!"}, "cursor"), ({"status": "DONE"}, "status"),
                                          ({"label": "novalue"}, "label")])
def test_bad_list_parameters_are_422(api, params, field):
    r = api.get("/v1/jobs", params=params)
    assert r.status_code == 422
    assert any(d["field"].split(".")[0] == field for d in r.json()["error"]["details"])


def test_cancel_queued_job_is_immediate_and_idempotent(api):
    job = api.post("/v1/jobs", json=digits_spec()).json()
    first = api.post(f"/v1/jobs/{job['id']}/cancel")
    second = api.post(f"/v1/jobs/{job['id']}/cancel")
    assert first.status_code == second.status_code == 202
    assert second.json()["status"] == "CANCELLED"
    events = api.get(f"/v1/jobs/{job['id']}/events").json()["events"]
    assert [e["to_status"] for e in events] == ["QUEUED", "CANCELLED"]


def test_cancel_finished_job_is_409(api, db):
    from service.db.jobstate import JobStatus
    from service.db.models import Job
    from service.db.session import transaction

    job = api.post("/v1/jobs", json=digits_spec()).json()
    with transaction(db) as s:
        s.get(Job, uuid.UUID(job["id"])).status = JobStatus.SUCCEEDED
    r = api.post(f"/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 409 and r.json()["error"]["error"] == "job_finished"


def test_project_isolation(api, api_url, db):
    mine = api.post("/v1/jobs", json=digits_spec()).json()
    other_key = make_key(db, "beta")
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {other_key}"}) as other:
        assert other.get(f"/v1/jobs/{mine['id']}").status_code == 404
        assert other.get(f"/v1/jobs/{mine['id']}/events").status_code == 404
        assert other.post(f"/v1/jobs/{mine['id']}/cancel").status_code == 404
        assert other.get("/v1/jobs").json()["jobs"] == []
    assert api.get(f"/v1/jobs/{mine['id']}").json()["status"] == "QUEUED"  # B's cancel did nothing


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic abc"}])
def test_requests_without_a_valid_key_are_401(api_url, db, headers):
    r = httpx.get(f"{api_url}/v1/jobs", headers=headers)
    assert r.status_code == 401
    assert set(r.json()["error"]) == {"error", "message", "details"}


def test_unknown_job_and_bad_id_share_the_error_shape(api):
    missing = api.get(f"/v1/jobs/{uuid.uuid4()}")
    bad = api.get("/v1/jobs/not-a-uuid")
    assert missing.status_code == 404 and bad.status_code == 422
    for r in (missing, bad, api.get("/v1/nowhere")):
        assert set(r.json()["error"]) == {"error", "message", "details"}


def test_health_and_readiness(api_url, bucket):  # ready needs the bucket too
    assert httpx.get(f"{api_url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{api_url}/readyz").json() == {"status": "ready"}
    assert "/v1/jobs" in httpx.get(f"{api_url}/openapi.json").json()["paths"]


def test_api_refuses_to_start_on_unmigrated_database(database_url):
    import psycopg
    from sqlalchemy.engine import make_url

    from service.app import create_app
    from service.db.session import NotMigrated

    url = make_url(database_url)
    empty = f"{url.database}_empty"
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{empty}"')
        conn.execute(f'CREATE DATABASE "{empty}"')
    try:
        with pytest.raises(NotMigrated, match="trainjobs db upgrade"):
            create_app(url.set(database=empty).render_as_string(hide_password=False))
    finally:
        from service.db.session import get_engine

        get_engine(url.set(database=empty).render_as_string(hide_password=False)).dispose()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{empty}" WITH (FORCE)')


def test_a_job_reads_back_exactly_as_its_schema_writes_it(api, db):
    """GET, list and submit write their JSON straight from the row (issue 12): the same document
    JobPublic gives, field for field, the JSON columns and timestamps included."""
    from sqlalchemy import text

    from service.db.models import Job
    from service.schemas import JobPublic

    def schema_says(job_id: str, wait_reason: str | None) -> dict:
        with db() as s:
            out = JobPublic.model_validate(s.get(Job, uuid.UUID(job_id)))
        out.wait_reason = wait_reason
        return out.model_dump(mode="json")

    # A user module's params are free-form (a built-in's are checked), so the JSON column holds any text.
    posted = api.post("/v1/jobs", json=digits_spec(labels={"team": "vision"}, model={"module": "https://example.com/m.py",
                                                   "params": {"hidden": [64, 32], "note": "é ☃ \"q\""}}))
    assert posted.json() == schema_says(posted.json()["id"], None)
    job_id = posted.json()["id"]
    with db.begin() as s:
        s.execute(text("""UPDATE jobs SET status = 'RUNNING', progress = 0.5, error = 'x',
                              metrics = '{"loss": 0.25, "accuracy": 1e-3, "epoch": 2}', runtime = '{"notes": []}',
                              staging_at = now(), running_at = now() WHERE id = :id"""), {"id": job_id})
    expected = schema_says(job_id, None)
    assert api.get(f"/v1/jobs/{job_id}").json() == expected
    assert api.get("/v1/jobs").json()["jobs"] == [expected]


@pytest.mark.parametrize("method,path,body", [
    ("GET", "/v1/jobs/not-a-uuid", None), ("GET", "/v1/jobs?limit=0", None), ("POST", "/v1/jobs", {"name": 1}),
    ("POST", "/v1/jobs/not-a-uuid/cancel", None)])
def test_an_unknown_key_is_401_even_when_the_request_is_also_invalid(api, api_url, method, path, body):
    assert api.request(method, path, json=body).status_code == 422  # with a good key
    r = httpx.request(method, f"{api_url}{path}", json=body, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]


def test_connections_the_database_dropped_cost_no_request(api, database_url):
    """The API does not ping a pooled connection before each request: a dead one (a restarted
    server) fails the request's first statement, which runs again on a new connection."""
    import psycopg
    from sqlalchemy.engine import make_url

    for _ in range(4):  # several pooled connections
        assert api.get("/v1/jobs").status_code == 200
    url = make_url(database_url)
    admin = url.set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        killed = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s",
                              [url.database]).fetchone()
    assert killed and killed[0] > 0
    for _ in range(4):
        r = api.get("/v1/jobs")
        assert r.status_code == 200, r.text
    assert api.post("/v1/jobs", json=digits_spec()).status_code == 201


@pytest.mark.parametrize("walk_rows", [5000, 3], ids=["the newest jobs hold the page", "then the label index"])
def test_label_filters_page_through_the_projects_matching_jobs_only(api, api_url, db, monkeypatch, walk_rows):
    """list_jobs walks the project's newest jobs for a label filter, then asks the GIN index on
    {project: labels} when they hold no full page (walk_rows=3 takes that path on this small data)."""
    from service.db import jobs as data

    monkeypatch.setattr(data, "LABEL_WALK_ROWS", walk_rows)
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {make_key(db, 'beta')}"}) as beta:
        for _ in range(3):  # another project's jobs with the same labels never show
            assert beta.post("/v1/jobs", json=digits_spec(labels={"team": "x"})).status_code == 201
    ids = [api.post("/v1/jobs", json=digits_spec(labels={"team": "x" if i % 3 else "y", "n": str(i)})).json()["id"]
           for i in range(9)]
    api.post(f"/v1/jobs/{ids[4]}/cancel")
    team_x = [ids[i] for i in range(8, -1, -1) if i % 3]  # newest first

    def pages(params: list[tuple[str, str]]) -> list[str]:
        seen, cursor = [], None
        while True:
            r = api.get("/v1/jobs", params=params + [("limit", "2")] + ([("cursor", cursor)] if cursor else []))
            assert r.status_code == 200, r.text
            seen += [j["id"] for j in r.json()["jobs"]]
            if not (cursor := r.json()["next_cursor"]):
                return seen

    assert pages([("label", "team=x")]) == team_x
    assert pages([("label", "team=x"), ("status", "QUEUED")]) == [i for i in team_x if i != ids[4]]
    assert pages([("label", "team=x"), ("status", "CANCELLED")]) == [ids[4]]
    assert pages([("label", "team=x"), ("label", "n=5")]) == [ids[5]]
    assert pages([("label", "team=z")]) == []
