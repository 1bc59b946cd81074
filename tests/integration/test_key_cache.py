"""Issue 25: the API remembers keys it accepted (service/key_cache.py), and still refuses a revoked key
on the next request; a key made elsewhere works at once; a lost listener connection drops what it
remembered. Against the real API (in this process, conftest.api_url) and PostgreSQL; the cache's
counters are read from /metrics, as an operator sees them."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text
from sqlalchemy.engine import make_url

from service.db.projects import hash_key, revoke_api_key
from service.db.session import transaction
from tests.support import eventually, scaled
from tests.support.jobs import digits_spec


def _metric(api_url: str, name: str) -> float:
    found = [s.value for family in text_string_to_metric_families(httpx.get(f"{api_url}/metrics").text)
             for s in family.samples if s.name == name]
    assert found, f"{name} is not on /metrics"
    return found[0]


def _cached_read(api: httpx.Client, api_url: str, job_id: str) -> None:
    """Two reads: the second is answered with the key from memory (the hits counter moves)."""
    assert api.get(f"/v1/jobs/{job_id}").status_code == 200
    hits = _metric(api_url, "trainjobs_api_key_cache_hits_total")
    assert api.get(f"/v1/jobs/{job_id}").status_code == 200
    assert _metric(api_url, "trainjobs_api_key_cache_hits_total") > hits


def test_a_remembered_key_revoked_is_refused_on_the_next_request(api, api_url, db):
    job = api.post("/v1/jobs", json=digits_spec()).json()
    _cached_read(api, api_url, job["id"])
    invalidated = _metric(api_url, "trainjobs_api_key_cache_invalidations_total")
    with transaction(db) as session:
        revoke_api_key(session, api.headers["authorization"].removeprefix("Bearer "))
    r = api.get(f"/v1/jobs/{job['id']}")
    assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]
    assert _metric(api_url, "trainjobs_api_key_cache_invalidations_total") > invalidated


def test_a_key_made_by_another_process_works_on_its_first_request(api, api_url, database_url):
    env = {**os.environ, "TRAINJOBS_DATABASE_URL": database_url}
    made = subprocess.run([sys.executable, "-m", "stack.cli", "keys", "create", "--project", "alpha"], env=env,
                          capture_output=True, text=True, timeout=scaled(120), check=True)
    key = made.stdout.strip()
    assert httpx.get(f"{api_url}/v1/jobs", headers={"Authorization": f"Bearer {key}"}).status_code == 200


def test_a_lost_listener_connection_drops_every_remembered_key(api, api_url, db, database_url):
    job = api.post("/v1/jobs", json=digits_spec()).json()
    _cached_read(api, api_url, job["id"])
    connects = _metric(api_url, "trainjobs_api_key_cache_listener_connects_total")
    url = make_url(database_url)
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE application_name = 'trainjobs-key-listener' AND datname = %s", [url.database])
    eventually(lambda: _metric(api_url, "trainjobs_api_key_cache_listener_connects_total") > connects, 30,
               "the key listener connected again")
    # Revoked behind the API's back: no notification, so only a dropped cache refuses it now.
    with db.begin() as session:
        session.execute(text("UPDATE api_keys SET revoked_at = now() WHERE key_hash = :h"),
                        {"h": hash_key(api.headers["authorization"].removeprefix("Bearer "))})
    assert api.get(f"/v1/jobs/{job['id']}").status_code == 401

