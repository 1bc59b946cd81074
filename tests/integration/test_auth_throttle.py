"""Failed key checks: an address that keeps sending unknown keys is told to wait (429), a key refused
moments ago is refused again without the database, and a forged X-Forwarded-For moves nothing.

The API runs as `trainjobs api` serves it (stack.cli._serve_api); each test speaks from its own
loopback address (127.0.0.N), so each is a client of its own.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import text

from service.auth_throttle import AuthThrottle, AuthThrottleConfig, address_key
from service.db.models import ApiKey
from service.db.projects import ensure_project, hash_key
from service.db.session import get_engine, transaction
from tests.support.jobs import make_key
from tests.support import scaled
from trainjobs.loopback import free_port

MAX_FAILURES = 3
BAD_KEY_TTL_S = scaled(3)
PROXY = "127.0.0.50"  # the one address whose X-Forwarded-For the server believes


@pytest.fixture(scope="module")
def server(database_url: str) -> Iterator[str]:
    from stack.cli import _serve_api

    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRAINJOBS_AUTH_MAX_FAILURES", str(MAX_FAILURES))
        env.setenv("TRAINJOBS_AUTH_BAD_KEY_TTL_S", str(BAD_KEY_TTL_S))
        env.setenv("TRAINJOBS_TRUSTED_PROXIES", PROXY)
        port = free_port()
        api = _serve_api(database_url, "127.0.0.1", port)
    yield f"http://127.0.0.1:{port}"
    api.stop()


def client_at(url: str, address: str) -> httpx.Client:
    """A client whose connections come from this loopback address."""
    return httpx.Client(base_url=url, transport=httpx.HTTPTransport(local_address=address), timeout=scaled(10))


def bearer(secret: str, forwarded_for: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {secret}"}
    if forwarded_for:
        headers["X-Forwarded-For"] = forwarded_for
    return headers


def unknown_key() -> str:
    return f"tj_{uuid.uuid4().hex}"


def test_an_address_that_keeps_sending_unknown_keys_is_told_to_wait(server, db):
    key = make_key(db, "alpha")
    with client_at(server, "127.0.0.11") as guesser, client_at(server, "127.0.0.12") as neighbour:
        for _ in range(MAX_FAILURES):
            assert guesser.get("/v1/jobs", headers=bearer(unknown_key())).status_code == 401
        # A key this process has not yet accepted waits too: it cannot be told from a guess.
        refused = guesser.get("/v1/jobs", headers=bearer(key))
        assert refused.status_code == 429, refused.text
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert refused.json()["error"]["error"] == "too_many_requests"
        assert neighbour.get("/v1/jobs", headers=bearer(key)).status_code == 200  # another address is not held
        # Accepted now, the key goes through the held address; another guess still waits.
        assert guesser.get("/v1/jobs", headers=bearer(key)).status_code == 200
        assert guesser.get("/v1/jobs", headers=bearer(unknown_key())).status_code == 429


def test_one_tenants_flood_of_unknown_keys_does_not_lock_out_a_working_key_from_the_same_address(server, db):
    # On one host every job, CLI and dashboard connects from 127.0.0.1: one job's guesses must not hold
    # the other projects' working keys.
    key = make_key(db, "beta")
    with client_at(server, "127.0.0.16") as shared:
        assert shared.get("/v1/jobs", headers=bearer(key)).status_code == 200
        for _ in range(MAX_FAILURES):
            assert shared.get("/v1/jobs", headers=bearer(unknown_key())).status_code == 401
        assert shared.get("/v1/jobs", headers=bearer(unknown_key())).status_code == 429
        assert shared.get("/v1/jobs", headers=bearer(key)).status_code == 200


def test_a_key_answered_before_any_key_check_is_not_taken_for_a_working_one(server, db):
    guess = unknown_key()
    with client_at(server, "127.0.0.17") as guesser:
        # An unknown path is answered 404 before any key is looked at: that says nothing of the key.
        assert guesser.get("/v1/no-such-route", headers=bearer(guess)).status_code == 404
        for _ in range(MAX_FAILURES):
            assert guesser.get("/v1/jobs", headers=bearer(unknown_key())).status_code == 401
        assert guesser.get("/v1/jobs", headers=bearer(guess)).status_code == 429


def test_a_forged_x_forwarded_for_does_not_move_the_count_off_the_caller(server, db):
    # From 127.0.0.1, where every local job's code connects from (and which uvicorn trusts by default).
    with client_at(server, "127.0.0.1") as guesser:
        for i in range(MAX_FAILURES):
            r = guesser.get("/v1/jobs", headers=bearer(unknown_key(), forwarded_for=f"198.51.100.{i}"))
            assert r.status_code == 401
        r = guesser.get("/v1/jobs", headers=bearer(unknown_key(), forwarded_for="198.51.100.99"))
        assert r.status_code == 429


def test_a_trusted_proxys_x_forwarded_for_names_the_client(server, db):
    key = make_key(db, "alpha")
    with client_at(server, PROXY) as proxy:
        for _ in range(MAX_FAILURES):
            assert proxy.get("/v1/jobs", headers=bearer(unknown_key(), forwarded_for="203.0.113.7")).status_code == 401
        assert proxy.get("/v1/jobs", headers=bearer(key, forwarded_for="203.0.113.7")).status_code == 429
        assert proxy.get("/v1/jobs", headers=bearer(key, forwarded_for="203.0.113.8")).status_code == 200


def test_a_key_refused_moments_ago_is_refused_again_without_the_database(server, db, database_url):
    secret = unknown_key()
    with client_at(server, "127.0.0.14") as client:
        assert client.get("/v1/jobs", headers=bearer(secret)).status_code == 401
        # With the key table locked, a lookup would wait for the lock; the cached refusal does not.
        with get_engine(database_url).connect() as conn, conn.begin():
            conn.execute(text("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE"))
            r = client.get("/v1/jobs", headers=bearer(secret))
        assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]


def test_a_refused_key_created_afterwards_works_once_its_cache_entry_expires(server, db):
    """Only that exact secret, created later, could make a refused hash valid: the cache is short."""
    secret = unknown_key()
    with client_at(server, "127.0.0.15") as client:
        assert client.get("/v1/jobs", headers=bearer(secret)).status_code == 401
        with transaction(db) as session:
            session.add(ApiKey(project_id=ensure_project(session, "alpha"), key_hash=hash_key(secret), prefix=secret[:10]))
        time.sleep(BAD_KEY_TTL_S + 0.2)  # past the entry, set just after the 401 went out
        assert client.get("/v1/jobs", headers=bearer(secret)).status_code == 200


def test_the_throttles_tables_stay_within_their_caps():
    throttle = AuthThrottle(AuthThrottleConfig(max_failures=2, max_addresses=100, max_bad_keys=100))
    for i in range(10_000):
        throttle.failed(f"10.0.{i // 256}.{i % 256}", hash_key(str(i)))
    assert throttle.sizes() == (100, 100)
    throttle.failed("10.0.39.15", hash_key("again"))  # the most recent addresses are still counted
    assert throttle.retry_after("10.0.39.15") is not None and throttle.known_bad(hash_key("9999"))


@pytest.mark.parametrize("host, counted_as", [
    ("192.0.2.1", "192.0.2.1"),
    ("2001:db8:1:2::1", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:ffff::9", "2001:db8:1:2::/64"),  # one host's /64: rotating inside it gains nothing
    ("::ffff:192.0.2.1", "192.0.2.1"),
    (None, "unknown"),
])
def test_failures_are_counted_per_ipv4_address_and_per_ipv6_64(host, counted_as):
    assert address_key(host) == counted_as


def test_a_bad_setting_stops_the_start_naming_it(monkeypatch):
    monkeypatch.setenv("TRAINJOBS_AUTH_WINDOW_S", "a minute")
    with pytest.raises(ValueError, match="TRAINJOBS_AUTH_WINDOW_S"):
        AuthThrottleConfig.from_env()
