"""Storage or PostgreSQL down (issue 8, section 2): the API answers 503 within seconds and says which
is down, /readyz names it, both recover by themselves, and the worker carries its jobs through.

Each outage is real: an emulator of the test's own, stopped and started again on the same port with
its data kept, and an embedded PostgreSQL of the module's own, stopped and restarted (never the
shared servers other tests use). A request that would hang (the storage client's 120 s of retries)
fails here on the HTTP client's timeout.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import random
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from service.db import jobs as jobdata
from service.db.jobstate import JobStatus
from service.db.models import Job
from service.db.projects import ensure_project
from service.db.session import get_engine, session_factory, transaction, upgrade
from stack.embedded import (
    GcsEmulator,
    start_embedded_postgres,
    start_gcs_emulator,
    stop_embedded_postgres,
)
from tests.support.jobs import digits_spec, make_key
from tests.support import scaled
from tests.support import eventually
from trainjobs import storage
from trainjobs.job_paths import ARTIFACT_METRICS, JobPaths
from trainjobs.messages import AgentReport, AgentState
from trainjobs.loopback import free_port
from trainjobs.spec import JobSpec
from trainjobs.states import TERMINAL
from worker.driver import DriverConfig
from worker.gcs_channel import GcsJobChannel
from worker.loop import Worker, WorkerConfig
from trainjobs.vm_metadata import LABEL_JOB
from worker.ports import MachineInfo, MachineRequest, MachineState
from worker.memory_cloud import MemoryCloud, memory_stager

S = JobStatus
OUTAGE_BUCKET = "outage-test"


def assert_unavailable(response: httpx.Response, what: str) -> None:
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["error"] == "unavailable" and what in error["message"], error
    assert response.headers["retry-after"].isdigit()


# --- storage ---------------------------------------------------------------------------------------

def _port_no_connection_takes() -> int:
    """A free loopback port below the kernel's ephemeral range. The emulator restarts on its port
    after an outage; in one from that range, any process's outgoing connection may have been given
    the port in the meantime (a CI run saw the restart fail so)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


class OwnStorage:
    """An emulator on a port of its own, with its objects on disk so they outlive a stop."""

    def __init__(self, data_dir: Path):
        self.data_dir, self.port = data_dir, _port_no_connection_takes()
        self.emulator: GcsEmulator = self.start()

    def start(self) -> GcsEmulator:
        self.emulator = start_gcs_emulator(self.data_dir, bucket=OUTAGE_BUCKET, port=self.port)
        return self.emulator

    def stop(self) -> None:
        self.emulator.stop()


@pytest.fixture
def own_storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[OwnStorage]:
    """This process (the API under test included) talks to the test's own emulator."""
    own = OwnStorage(tmp_path / "gcs")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", own.emulator.url)
    monkeypatch.setenv("TRAINJOBS_BUCKET", OUTAGE_BUCKET)
    yield own
    own.stop()


@pytest.fixture
def patient_api(api: httpx.Client) -> httpx.Client:
    """The API client, waiting long enough for an answer given within seconds even on a loaded
    machine, and well short of the storage client's retries (79-166 s before the storage limits)."""
    api.timeout = httpx.Timeout(scaled(60))
    return api


def _job_with_an_artifact(api: httpx.Client, db: Any) -> str:
    job_id = api.post("/v1/jobs", json=digits_spec()).json()["id"]
    manifest = json.dumps([{"path": ARTIFACT_METRICS, "size": 2, "sha256": "0" * 64}])
    with transaction(db) as session:
        session.execute(text("UPDATE jobs SET artifacts = CAST(:m AS jsonb) WHERE id = :id"),
                        {"m": manifest, "id": job_id})
    return str(job_id)


STORAGE_ROUTES: dict[str, Callable[[httpx.Client, str], httpx.Response]] = {
    "logs": lambda api, job: api.get(f"/v1/jobs/{job}/logs"),
    "metrics": lambda api, job: api.get(f"/v1/jobs/{job}/metrics"),
    "artifact download": lambda api, job: api.get(f"/v1/jobs/{job}/artifacts/metrics.json"),
    "dataset upload": lambda api, job: api.post("/v1/datasets", files={"file": ("data.csv", b"x,label\n1,0\n")}),
    "module upload": lambda api, job: api.post("/v1/modules", files={"file": ("my_model.py", b"def build(): ...\n")}),
}


def _unfinished_blob_writers() -> list[Any]:
    """Upload writers left open in this process (the API's included). One whose close() failed while
    storage was down is closed again by io's finalizer whenever it is collected: a fresh upload under
    the storage client's 120 s of retries, in whichever thread collects it."""
    from google.cloud.storage.fileio import BlobWriter

    return [o for o in gc.get_objects() if isinstance(o, BlobWriter) and not o.closed]


@pytest.mark.parametrize("route", STORAGE_ROUTES)
def test_a_route_that_needs_storage_answers_503_naming_storage_while_it_is_down(own_storage, patient_api, db, route):
    job_id = _job_with_an_artifact(patient_api, db)
    own_storage.stop()
    assert_unavailable(STORAGE_ROUTES[route](patient_api, job_id), "storage")
    assert _unfinished_blob_writers() == []  # a failed upload leaves nothing to retry later


def test_routes_answer_again_once_storage_is_back(own_storage, patient_api, db):
    job_id = _job_with_an_artifact(patient_api, db)
    own_storage.stop()
    assert_unavailable(patient_api.get(f"/v1/jobs/{job_id}/logs"), "storage")
    own_storage.start()
    eventually(lambda: patient_api.get(f"/v1/jobs/{job_id}/logs").status_code == 200, 10,
               "logs answered after storage came back", every=0.2)


def test_readyz_names_storage_while_it_is_down(own_storage, patient_api):
    assert patient_api.get("/readyz").status_code == 200
    own_storage.stop()
    response = patient_api.get("/readyz")
    assert_unavailable_details(response, ["storage"])


def assert_unavailable_details(response: httpx.Response, down: list[str]) -> None:
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert [d["field"] for d in error["details"]] == down, error
    assert all(name in error["message"] for name in down)


STAND_IN_METRICS = json.dumps({"val_accuracy": 0.9}).encode()
STAND_IN_ARTIFACTS = [{"path": ARTIFACT_METRICS, "size": len(STAND_IN_METRICS),
                       "sha256": hashlib.sha256(STAND_IN_METRICS).hexdigest()}]


class StandInMachines:
    """Machines whose 'agent' is a thread that reports through trainjobs.storage, as the real agent
    does: status.json with a heartbeat while it 'trains', then artifacts/metrics.json, the artifact
    manifest and SUCCEEDED. Its threads start without the worker's storage limits, like an agent in
    its own process: a write during an outage waits for storage (the client's own retries) and lands
    once it is back. `trained` names the jobs whose agent has finished training and begun those writes."""

    kind = "stand-in"

    def __init__(self, train_s: float):
        self.train_s = train_s
        self.trained: set[str] = set()
        self._machines: dict[str, MachineRequest] = {}
        self._lock = threading.Lock()

    def create(self, request: MachineRequest) -> MachineInfo:
        with self._lock:
            if request.name not in self._machines:
                self._machines[request.name] = request
                threading.Thread(target=self._agent, args=(request,), daemon=True).start()
        return MachineInfo(request.name, MachineState.READY, request.labels)

    def get(self, request: MachineRequest) -> MachineInfo | None:
        with self._lock:
            found = request.name in self._machines
        return MachineInfo(request.name, MachineState.READY, request.labels) if found else None

    def delete(self, name: str) -> None:
        with self._lock:
            self._machines.pop(name, None)

    def list(self, labels: dict[str, str]) -> list[MachineInfo]:
        with self._lock:
            return [MachineInfo(n, MachineState.READY, r.labels) for n, r in self._machines.items()
                    if labels.items() <= r.labels.items()]

    def _agent(self, request: MachineRequest) -> None:
        try:
            self._train(request)
        except Exception as exc:  # noqa: BLE001 - storage gone for good (its test is over): the job's test judges the job
            logging.getLogger(__name__).warning("stand-in agent %s stopped: %s", request.name, exc)

    def _train(self, request: MachineRequest) -> None:
        paths = JobPaths(request.job_dir)

        def report(state: AgentState, progress: float) -> None:
            storage.write_json(paths.status, AgentReport(state=state, attempt=request.attempt, progress=progress,
                                                         heartbeat_at=datetime.now(UTC)).model_dump(mode="json"))

        def deleted() -> bool:  # a deleted machine's agent is gone with it, and writes nothing more
            with self._lock:
                return request.name not in self._machines

        # Heartbeats go out from a thread of their own, as the real agent's publisher does, so training
        # does not wait on storage: a heartbeat stuck in the client's retries holds only itself.
        started, trained = time.monotonic(), threading.Event()

        def heartbeat() -> None:
            try:
                while not trained.is_set() and not deleted():
                    report(AgentState.RUNNING, min(1.0, (time.monotonic() - started) / self.train_s))
                    trained.wait(0.5)
            except Exception as exc:  # noqa: BLE001 - as _agent: storage gone for good
                logging.getLogger(__name__).warning("stand-in heartbeat %s stopped: %s", request.name, exc)

        beating = threading.Thread(target=heartbeat, daemon=True)
        beating.start()
        while time.monotonic() - started < self.train_s:  # deliberately: "training" is time passing
            if deleted():
                trained.set()
                return
            time.sleep(0.1)
        trained.set()
        if deleted():
            return
        with self._lock:
            self.trained.add(request.job_id)
        storage.write_json(paths.final_metrics, json.loads(STAND_IN_METRICS))
        storage.write_json(paths.artifact_manifest, STAND_IN_ARTIFACTS)
        beating.join()  # its last RUNNING must not land after SUCCEEDED
        report(AgentState.SUCCEEDED, 1.0)

    def has_trained(self, job_id: uuid.UUID) -> bool:
        with self._lock:
            return str(job_id) in self.trained


def _submit(factory: Any) -> uuid.UUID:
    spec = JobSpec.model_validate(digits_spec()).model_dump(mode="json")
    with transaction(factory) as session:
        project = ensure_project(session, "outages")
        job, _ = jobdata.create_job(session, project, spec, idempotency_key=None, request_hash=b"")
        return job.id


def _job(factory: Any, job_id: uuid.UUID) -> Job:
    with transaction(factory) as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job


def _worker(database_url: str, provisioner: Any, channel: Any) -> Worker:
    config = WorkerConfig(concurrency=2, name=f"outage-{uuid.uuid4().hex[:6]}", lease_s=scaled(30), heartbeat_s=0.5,
                          poll_s=0.3, driver=DriverConfig(poll_s=0.3, retry_backoff_max_s=scaled(4),
                                                          agent_stale_s=scaled(120)))  # outages here scale too
    return Worker(get_engine(database_url), provisioner, channel, memory_stager, config)


def agent_state(cloud: MemoryCloud, job_id: uuid.UUID) -> AgentState | None:
    """What the job's first agent reports now, as the worker would read it (None: nothing yet)."""
    report = cloud.read_status(str(job_id), 1)
    return report.state if report else None


def _cancel(factory: Any, job_id: uuid.UUID) -> None:
    with transaction(factory) as session:
        jobdata.request_cancel(session, _job(factory, job_id).project_id, job_id)


def test_the_worker_works_through_a_storage_outage_and_finishes_its_jobs_once_storage_is_back(own_storage, db,
                                                                                              database_url):
    machines = StandInMachines(train_s=scaled(8))
    worker = _worker(database_url, machines, GcsJobChannel())
    worker.start()
    try:
        kept, cancelled = _submit(db), _submit(db)
        for job_id in (kept, cancelled):
            eventually(lambda: _job(db, job_id).status == S.RUNNING, 20, "job RUNNING")
        own_storage.stop()
        down_since = time.monotonic()
        # While storage is away the worker still acts on what needs only the database and the machines.
        # Before the storage limits a driver that had begun a storage read sat in it for the client's
        # 120 s. Deliberately let time pass (no event shows a driver inside a read): by now both drivers
        # have begun one.
        time.sleep(scaled(2))
        _cancel(db, cancelled)
        eventually(lambda: _job(db, cancelled).status == S.CANCELLED, 45, "cancelled while storage is down",
                   every=0.2)
        eventually(lambda: machines.has_trained(kept), 30, "the agent finished training while storage was down",
                   every=0.2)
        # Deliberately tens of seconds of outage in all, longer than the worker's storage limits: its
        # reads fail for a while, and the agent's last writes wait in the storage client's retries.
        time.sleep(max(0.0, scaled(30) - (time.monotonic() - down_since)))
        assert _job(db, kept).status == S.RUNNING  # nothing of the agent's end could be read yet
        own_storage.start()
        # The agent's last write lands at the storage client's next retry, up to a minute later.
        job = eventually(lambda: (j := _job(db, kept)).status in TERMINAL and j, 120,
                         "job finished after storage came back", every=0.2)
    finally:
        worker.shutdown(timeout=scaled(10))
    assert (job.status, job.error, job.attempt) == (S.SUCCEEDED, None, 1)
    assert job.metrics == {"val_accuracy": 0.9}
    assert job.artifacts == STAND_IN_ARTIFACTS
    assert machines.list({LABEL_JOB: str(kept)}) == [] and machines.list({LABEL_JOB: str(cancelled)}) == []


# --- PostgreSQL ------------------------------------------------------------------------------------

class OwnPostgres:
    """An embedded PostgreSQL for this module alone, migrated; stop() cuts every connection at once."""

    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.url = start_embedded_postgres(data_dir, database="trainjobs")
        upgrade(self.url)

    def stop(self) -> None:
        stop_embedded_postgres(self.data_dir)

    def start(self) -> None:
        assert start_embedded_postgres(self.data_dir, database="trainjobs") == self.url


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[OwnPostgres]:
    # Not under pytest's tmp_path: as root the server runs as another user, which must reach its data
    # directory, and every pytest session resets pytest's temporary root to owner-only.
    parent = Path(tempfile.mkdtemp(prefix="trainjobs-own-pg-"))
    own = OwnPostgres(parent / "data")
    yield own
    get_engine(own.url).dispose()
    stop_embedded_postgres(own.data_dir)
    shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture
def running_postgres(own_postgres: OwnPostgres) -> Iterator[OwnPostgres]:
    """The module's server, started again after a test that stopped it (even one that failed)."""
    yield own_postgres
    own_postgres.start()


@pytest.fixture(scope="module")
def own_api_url(own_postgres: OwnPostgres) -> Iterator[str]:
    import uvicorn

    from service.app import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(own_postgres.url), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    eventually(lambda: _answers(url), 10, "own API up")
    yield url
    server.should_exit = True
    thread.join(5)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def own_api(running_postgres: OwnPostgres, own_api_url: str, bucket: str) -> Iterator[httpx.Client]:
    key = make_key(session_factory(get_engine(running_postgres.url)), f"p-{uuid.uuid4().hex[:8]}")
    with httpx.Client(base_url=own_api_url, headers={"Authorization": f"Bearer {key}"},
                      timeout=scaled(30)) as client:
        yield client


def test_routes_answer_503_naming_the_database_while_it_is_down_and_recover_once_it_is_back(running_postgres, own_api):
    job = own_api.post("/v1/jobs", json=digits_spec()).json()
    running_postgres.stop()
    assert_unavailable(own_api.get(f"/v1/jobs/{job['id']}"), "database")
    assert_unavailable(own_api.post("/v1/jobs", json=digits_spec()), "database")
    running_postgres.start()
    eventually(lambda: own_api.get(f"/v1/jobs/{job['id']}").status_code == 200, 10,
               "the API answered once the database was back", every=0.2)


def test_readyz_names_the_database_while_it_is_down(running_postgres, own_api):
    assert own_api.get("/readyz").status_code == 200
    running_postgres.stop()
    assert_unavailable_details(own_api.get("/readyz"), ["database"])


def test_a_job_driven_across_a_postgres_restart_ends_succeeded_and_the_worker_claims_new_jobs(running_postgres):
    factory = session_factory(get_engine(running_postgres.url))
    cloud = MemoryCloud(train_s=scaled(2))
    worker = _worker(running_postgres.url, cloud, cloud)
    worker.start()
    try:
        job_id = _submit(factory)
        eventually(lambda: _job(factory, job_id).status == S.RUNNING, 20, "job RUNNING", every=0.2)
        running_postgres.stop()
        eventually(lambda: agent_state(cloud, job_id) == AgentState.SUCCEEDED, 30,
                   "the agent finished while the database was down", every=0.2)
        running_postgres.start()
        back_at = datetime.now(UTC)
        job = eventually(lambda: (j := _job(factory, job_id)).status in TERMINAL and j, 60,
                         "job finished after the database came back", every=0.2)
        after = _submit(factory)
        later = eventually(lambda: (j := _job(factory, after)).status in TERMINAL and j, 30,
                           "a job submitted after the restart finished", every=0.2)
    finally:
        worker.shutdown(timeout=scaled(10))
    assert (job.status, job.error, job.attempt) == (S.SUCCEEDED, None, 1)
    assert job.metrics == {"val_accuracy": 0.99}  # what the agent reported while the database was away
    assert job.finished_at is not None and job.finished_at >= back_at  # recorded once it was back
    assert later.status == S.SUCCEEDED
    assert cloud.list({LABEL_JOB: str(job_id)}) == []
