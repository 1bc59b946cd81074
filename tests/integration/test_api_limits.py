"""Issue 8 §3: what one request may cost, and that bad input is a 4xx naming the field, never a 500
or a dropped connection. Against the real API, PostgreSQL and the GCS emulator."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from tests.support.jobs import digits_spec
from tests.support import eventually, scaled
from trainjobs import storage


def _fields(r: httpx.Response) -> dict[str, str]:
    return {d["field"]: d["reason"] for d in r.json()["error"]["details"]}


def _raw_post(api: httpx.Client, body: str) -> httpx.Response:
    return api.post("/v1/jobs", content=body.encode("utf-8", "surrogatepass"),
                    headers={"content-type": "application/json"})


def _spec_with_params(params_json: str) -> str:
    """A spec's JSON text whose model.params is `params_json` verbatim (escapes json.dumps would not write)."""
    return json.dumps(digits_spec(model={"name": "cnn", "params": {"p": "PARAMS"}})).replace('{"p": "PARAMS"}', params_json)


def _connection(api_url: str) -> http.client.HTTPConnection:
    return http.client.HTTPConnection(api_url.removeprefix("http://"), timeout=scaled(30))


# --- 1. input PostgreSQL cannot store is a 422 naming the field ------------------------------------

UNSTORABLE = [
    # (case id, spec JSON text, field named)
    ("NUL in params", _spec_with_params('{"text": "a\\u0000b"}'), "model.params.text"),
    ("NUL deep in params", _spec_with_params('{"a": [{"b": "\\u0000"}]}'), "model.params.a.0.b"),
    ("lone surrogate in params", _spec_with_params('{"text": "\\ud800"}'), "model.params.text"),
    ("NaN in params", _spec_with_params('{"x": NaN}'), "model.params.x"),
    ("NUL in dataset.source", json.dumps(digits_spec(dataset={"source": "data\u0000.csv"})), "dataset.source"),
    ("NUL in label_column", json.dumps(digits_spec(dataset={"source": "d.csv", "options": {"label_column": "y\u0000"}})),
     "dataset.options.label_column"),
    ("runtime overflowing a timedelta", json.dumps(digits_spec(limits={"max_runtime": "99999999999999999999h"})),
     "limits.max_runtime"),
]


@pytest.mark.parametrize("body,field", [c[1:] for c in UNSTORABLE], ids=[c[0] for c in UNSTORABLE])
def test_unstorable_input_is_a_422_naming_the_field(api, body, field):
    r = _raw_post(api, body)
    assert r.status_code == 422, r.text
    assert field in _fields(r), _fields(r)
    assert api.get("/v1/jobs").json()["jobs"] == []


@pytest.mark.parametrize("query", ["label=k=%00", "label=%00=v", "label=k=v%0A", "label=K=v", "label=k=%ED%A0%80"])
def test_malformed_label_filter_is_a_422_naming_label(api, query):
    r = api.get(f"/v1/jobs?{query}")
    assert r.status_code == 422, r.text
    assert "label" in _fields(r)


def test_an_error_response_keeps_the_connection_open(api, api_url):
    conn = _connection(api_url)
    headers = {"Authorization": api.headers["authorization"], "Content-Type": "application/json"}
    conn.request("POST", "/v1/jobs", _spec_with_params('{"text": "\\u0000"}'), headers)
    first = conn.getresponse()
    first.read()
    sock = conn.sock
    conn.request("GET", "/v1/jobs", headers=headers)
    second = conn.getresponse()
    second.read()
    assert (first.status, second.status) == (422, 200)
    assert sock is not None and conn.sock is sock  # http.client would silently reconnect after a close
    conn.close()


@contextmanager
def _serve(app) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """`app` behind uvicorn on a free port, as in production."""
    import uvicorn

    from trainjobs.loopback import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    def started() -> bool:
        assert thread.is_alive(), "the server thread ended"
        return bool(server.started)

    eventually(started, 30, "the server started", every=0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(scaled(10))


def test_an_unexpected_error_is_a_json_500_and_keeps_the_connection_open(database_url):
    from service.app import create_app

    app = create_app(database_url)

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("a bug")

    with _serve(app) as url:
        conn = _connection(url)
        conn.request("GET", "/boom")
        first = conn.getresponse()
        body = json.loads(first.read())
        sock = conn.sock
        conn.request("GET", "/healthz")
        second = conn.getresponse()
        second.read()
        same_connection = sock is not None and conn.sock is sock
        conn.close()
    assert first.status == 500 and body["error"]["error"] == "internal"
    assert second.status == 200 and same_connection


# --- 2. request bodies: capped while they arrive ---------------------------------------------------


def test_a_spec_over_256_kib_is_a_413_and_nothing_is_stored(api):
    r = api.post("/v1/jobs", json=digits_spec(model={"name": "cnn", "params": {"x": "a" * (300 << 10)}}))
    assert r.status_code == 413, r.text
    assert r.json()["error"]["error"] == "too_large" and "256 KiB" in r.json()["error"]["message"]
    assert api.get("/v1/jobs").json()["jobs"] == []


def test_a_chunked_body_is_cut_off_at_the_cap(api):
    # No Content-Length: only counting the bytes as they arrive can refuse it.
    body = json.dumps(digits_spec(model={"name": "cnn", "params": {"x": "a" * (1 << 20)}})).encode()
    chunks = (body[i:i + 65536] for i in range(0, len(body), 65536))
    r = api.post("/v1/jobs", content=chunks, headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text


@pytest.mark.parametrize("path,content_type", [("/v1/jobs", "application/json"),
                                               ("/v1/modules", "multipart/form-data; boundary=b")])
def test_a_body_announced_over_the_cap_is_refused_before_it_is_sent(api, api_url, path, content_type):
    conn = _connection(api_url)
    conn.putrequest("POST", path)
    for name, value in {"Authorization": api.headers["authorization"], "Content-Type": content_type,
                        "Content-Length": str(60 << 20)}.items():
        conn.putheader(name, value)
    conn.endheaders(b"{")  # one byte of the 60 MiB: the answer must not wait for the rest
    r = conn.getresponse()
    assert r.status == 413
    assert json.loads(r.read())["error"]["error"] == "too_large"
    conn.close()


def test_params_over_64_kib_are_a_422_naming_model_params(api):
    r = api.post("/v1/jobs", json=digits_spec(model={"name": "cnn", "params": {"x": "a" * (70 << 10)}}))
    assert r.status_code == 422, r.text
    assert "64 KiB" in _fields(r)["model.params"]


def test_a_dataset_over_the_upload_cap_is_a_413_and_nothing_is_kept(api, bucket, monkeypatch):
    monkeypatch.setenv("TRAINJOBS_MAX_UPLOAD_BYTES", "1000")
    at_cap = api.post("/v1/datasets", files={"file": ("ok.csv", b"a" * 1000)})
    over = api.post("/v1/datasets", files={"file": ("big.csv", b"b" * 1001)})
    assert at_cap.status_code == 201, at_cap.text
    assert over.status_code == 413, over.text
    assert "1000 bytes" in over.json()["error"]["message"]
    stored = [b.name for b in storage.client().list_blobs(bucket)]  # .incoming/ temporaries included
    assert len(stored) == 1 and stored[0].endswith("/ok.csv"), stored


# --- 3. strict types -------------------------------------------------------------------------------

MISTYPED = [
    ("epochs true", {"training": {"epochs": True}}, "training.epochs"),
    ("learning_rate true", {"training": {"learning_rate": True}}, "training.learning_rate"),
    ("steps_per_execution true", {"steps_per_execution": True}, "steps_per_execution"),
    ("replicas true", {"accelerator": {"type": "cpu", "replicas": True}, "strategy": "auto"}, "accelerator.replicas"),
    ("max_retries true", {"limits": {"max_retries": True}}, "limits.max_retries"),
    ("max_runtime true", {"limits": {"max_runtime": True}}, "limits.max_runtime"),
    ("label value with trailing newline", {"labels": {"team": "vision\n"}}, "labels"),
    ("label key with trailing newline", {"labels": {"team\n": "vision"}}, "labels"),
    ("source with trailing newline", {"dataset": {"source": "sklearn:digits\n"}}, "dataset.source"),
    ("tpu type with trailing newline", {"accelerator": {"type": "tpu", "tpu_type": "v4-8\n"}, "strategy": "auto"},
     "accelerator.tpu_type"),
]


@pytest.mark.parametrize("overrides,field", [c[1:] for c in MISTYPED], ids=[c[0] for c in MISTYPED])
def test_a_value_of_the_wrong_type_is_a_422_naming_the_field(api, overrides, field):
    r = api.post("/v1/jobs", json=digits_spec(**overrides))
    assert r.status_code == 422, r.text
    assert field in _fields(r), _fields(r)


# --- 4. API keys -----------------------------------------------------------------------------------


def _cli(*args: str, database_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRAINJOBS_DATABASE_URL": database_url}
    return subprocess.run([sys.executable, "-m", "stack.cli", *args], env=env, capture_output=True, text=True,
                          timeout=scaled(120))


def _key_row(project: str, prefix: str, database_url: str) -> str:
    listed = _cli("keys", "list", "--project", project, database_url=database_url)
    assert listed.returncode == 0, listed.stderr
    return next(line for line in listed.stdout.splitlines() if line.startswith(prefix))


def test_keys_list_shows_each_key_by_prefix_never_its_secret(api, database_url):
    secret = api.headers["authorization"].removeprefix("Bearer ")
    row = _key_row("alpha", secret[:10], database_url)
    assert secret not in row and row.rstrip().endswith("-")  # not revoked


def test_a_revoked_key_is_refused_at_once_by_the_running_api(api, database_url):
    secret = api.headers["authorization"].removeprefix("Bearer ")
    assert api.get("/v1/jobs").status_code == 200
    revoked = _cli("keys", "revoke", secret[:10], database_url=database_url)
    assert revoked.returncode == 0, revoked.stderr
    r = api.get("/v1/jobs")  # the same API process, no restart
    assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]
    assert not _key_row("alpha", secret[:10], database_url).rstrip().endswith("-")  # the revoked column holds a time


def test_revoking_an_unknown_prefix_fails_naming_it(db, database_url):
    r = _cli("keys", "revoke", "tj_nothere", database_url=database_url)
    assert r.returncode != 0 and "tj_nothere" in r.stderr


# --- 5. the OpenAPI document declares what each route answers --------------------------------------

DECLARED = [
    ("get", "/readyz", {"200", "503"}),
    ("post", "/v1/jobs", {"200", "201", "400", "401", "409", "413", "422", "429", "503"}),
    ("get", "/v1/jobs", {"200", "401", "422", "429", "503"}),
    ("get", "/v1/jobs/{job_id}", {"200", "401", "404", "422", "429", "503"}),
    ("post", "/v1/jobs/{job_id}/cancel", {"202", "401", "404", "409", "422", "429", "503"}),
    ("get", "/v1/jobs/{job_id}/events", {"200", "401", "404", "422", "429", "503"}),
    ("get", "/v1/jobs/{job_id}/logs", {"200", "401", "404", "422", "429", "503"}),
    ("get", "/v1/jobs/{job_id}/metrics", {"200", "401", "404", "422", "429", "503"}),
    ("get", "/v1/jobs/{job_id}/artifacts", {"200", "401", "404", "422", "429", "503"}),
    ("get", "/v1/jobs/{job_id}/artifacts/{path}", {"200", "400", "401", "404", "409", "422", "429", "503"}),
    ("post", "/v1/datasets", {"201", "400", "401", "413", "422", "429", "503"}),
    ("post", "/v1/modules", {"201", "400", "401", "413", "422", "429", "503"}),
]


@pytest.mark.parametrize("method,path,statuses", DECLARED, ids=[f"{m} {p}" for m, p, _ in DECLARED])
def test_openapi_declares_every_status_a_route_answers(api_url, method, path, statuses):
    operation = httpx.get(f"{api_url}/openapi.json").json()["paths"][path][method]
    assert set(operation["responses"]) == statuses
    for status in statuses - {"200", "201", "202"}:
        schema = operation["responses"][status]["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, (status, schema)


# --- the jobs routes' database threads (service/deps.py: in_db_thread) -----------------------------


def test_jobs_routes_run_on_their_own_few_threads(db, database_url, monkeypatch):
    """TRAINJOBS_API_DB_THREADS=2: however many requests arrive at once, two run their database work
    at a time (the rest wait their turn), and each is answered."""
    from service.app import create_app
    from service.db import jobs as jobdata
    from tests.support.jobs import make_key

    monkeypatch.setenv("TRAINJOBS_API_DB_THREADS", "2")
    app = create_app(database_url)
    lock, running, most = threading.Lock(), [0], [0]
    real = jobdata.list_jobs

    def counted(session, project_id, **kw):  # type: ignore[no-untyped-def]
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        try:
            return real(session, project_id, **kw)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(jobdata, "list_jobs", counted)
    key = make_key(db, "threads")
    with _serve(app) as url:
        first = httpx.get(f"{url}/v1/jobs?limit=1", headers={"Authorization": f"Bearer {key}"})  # starts the pool
        assert first.status_code == 200
        answers: dict[int, int] = {}

        def get(limit: int) -> None:
            answers[limit] = httpx.get(f"{url}/v1/jobs?limit={limit}", headers={"Authorization": f"Bearer {key}"},
                                       timeout=scaled(30)).status_code

        threads = [threading.Thread(target=get, args=(n,)) for n in range(2, 14)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert answers == {n: 200 for n in range(2, 14)}
    assert most[0] == 2


def test_a_bad_db_threads_setting_stops_the_start_naming_it(database_url, monkeypatch):
    from service.app import create_app

    monkeypatch.setenv("TRAINJOBS_API_DB_THREADS", "0")
    with pytest.raises(ValueError, match="TRAINJOBS_API_DB_THREADS"):
        create_app(database_url)


def test_a_request_that_waits_too_long_for_a_database_turn_is_a_503(db, database_url, monkeypatch):
    """With the database hanging, each turn can last the connect timeout; a request queued behind
    them gets a 503 after the pool's wait, not minutes later."""
    from service.app import create_app
    from service.db import jobs as jobdata
    from tests.support.jobs import make_key

    monkeypatch.setenv("TRAINJOBS_API_DB_THREADS", "1")
    app = create_app(database_url)
    app.state.db_wait_s = 0.5
    real = jobdata.list_jobs
    hang, holding, release = threading.Event(), threading.Event(), threading.Event()

    def slow(session, project_id, **kw):  # type: ignore[no-untyped-def]
        if hang.is_set():
            holding.set()
            release.wait(scaled(60))  # the hanging database: until the queued request has its answer
        return real(session, project_id, **kw)

    monkeypatch.setattr(jobdata, "list_jobs", slow)
    key = make_key(db, "turns")
    headers = {"Authorization": f"Bearer {key}"}
    with _serve(app) as url:
        assert httpx.get(f"{url}/v1/jobs", headers=headers).status_code == 200
        hang.set()
        first: list[int] = []
        holder = threading.Thread(target=lambda: first.append(
            httpx.get(f"{url}/v1/jobs", headers=headers, timeout=scaled(30)).status_code))
        holder.start()
        assert holding.wait(scaled(30))  # the first request holds the only turn
        started = time.monotonic()
        try:
            # The turn is held until this returns: only the wait bound can answer it.
            queued = httpx.get(f"{url}/v1/jobs", headers=headers, timeout=scaled(30))
        finally:
            waited = time.monotonic() - started
            release.set()
        holder.join()
    assert first == [200]
    assert queued.status_code == 503 and "database" in queued.json()["error"]["message"]
    assert queued.headers["Retry-After"]
    assert waited >= 0.5  # it did wait its bound out first
