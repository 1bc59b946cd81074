"""A job's code reaches only its own job's storage and nothing of the worker (issue 8, section 1), the
rules on their own: the agent's environment is an allow-list; the boundary a job's token or guard
enforces (its job directory read/write, its dataset and model code read-only) and the downscoped
token's rules; the token file the worker rewrites and the agent's storage client reads. The guard
and artifact checks against the emulator: tests/integration/test_code_tenancy.py; a real job's code
trying each attack: tests/e2e/test_code_tenancy.py."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path


from tests.support.tenancy import JOB, PROJECT_B
from trainjobs import storage
from trainjobs.messages import AgentAssignment
from trainjobs.spec import JobSpec
from worker.boundary.access import JobBoundary, Scope, access_boundary_rules, boundary_for
from worker.boundary.tokens import TokenFileRefresher, write_token_file
from worker.local.provisioner import agent_environment


def test_agent_environment_keeps_only_the_allow_list():
    worker_env = {
        "PATH": "/usr/bin", "HOME": "/home/worker", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC",
        "TF_CPP_MIN_LOG_LEVEL": "1", "TRAINJOBS_HEARTBEAT_S": "2", "PYTHONPATH": "/opt/lib",
        "TRAINJOBS_DATABASE_URL": "postgresql://postgres:secret@db/trainjobs", "TRAINJOBS_API_KEY": "tj_secret",
        "GOOGLE_APPLICATION_CREDENTIALS": "/keys/worker.json", "AWS_SECRET_ACCESS_KEY": "x", "DB_PASSWORD": "x",
        "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9000", "TF_CONFIG": '{"cluster": {}}',
    }
    env = agent_environment(worker_env, STORAGE_EMULATOR_HOST="http://127.0.0.1:9100")
    assert env == {
        "PATH": "/usr/bin", "HOME": "/home/worker", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC",
        "TF_CPP_MIN_LOG_LEVEL": "1", "TRAINJOBS_HEARTBEAT_S": "2",
        "PYTHONPATH": f"{Path(__file__).resolve().parents[2]}{os.pathsep}/opt/lib",
        "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9100",  # the job's guard, not the emulator
    }


def _assignment(module: str | None, dataset_uri: str) -> AgentAssignment:
    model = {"module": module} if module else {"name": "mlp"}
    spec = JobSpec.model_validate({"name": "t", "dataset": {"source": "sklearn:digits"}, "model": model})
    return AgentAssignment(job_id=JOB, attempt=1, spec=spec, dataset_uri=dataset_uri)


def test_boundary_reads_dataset_and_module_and_writes_only_the_job_directory():
    module = f"gs://tj/uploads/{PROJECT_B}/{'a' * 64}/my_model.py"
    manifest = {"splits": {"train": {"shards": ["shards/train-0.tfrecord", "gs://raw/images/train-1.tfrecord"]}}}
    boundary = boundary_for(_assignment(module, f"gs://tj/datasets/{'d' * 64}"), f"gs://tj/jobs/{JOB}", manifest)
    assert boundary.read == (Scope("tj", f"datasets/{'d' * 64}/"), Scope("raw", "images/train-1.tfrecord"),
                             Scope("tj", f"uploads/{PROJECT_B}/{'a' * 64}/my_model.py"))
    assert boundary.write == (Scope("tj", f"jobs/{JOB}/"),)


def test_downscoped_token_rules_limit_roles_prefixes_and_listing():
    boundary = JobBoundary(JOB, read=(Scope("tj", "datasets/dd/"), Scope("tj", f"uploads/{PROJECT_B}/aa/m.py"),
                                      Scope("raw", "images/it's.tfrecord")),
                           write=(Scope("tj", f"jobs/{JOB}/"),))
    listing = "api.getAttribute('storage.googleapis.com/objectListPrefix', '')"
    assert access_boundary_rules(boundary) == [
        {"availableResource": "//storage.googleapis.com/projects/_/buckets/raw",
         "availablePermissions": ["inRole:roles/storage.objectViewer"],
         "availabilityCondition": {"title": f"job {JOB}", "expression":
                                   "resource.name == 'projects/_/buckets/raw/objects/images/it\\'s.tfrecord'"}},
        {"availableResource": "//storage.googleapis.com/projects/_/buckets/tj",
         "availablePermissions": ["inRole:roles/storage.objectViewer"],
         "availabilityCondition": {"title": f"job {JOB}", "expression":
                                   "resource.name.startsWith('projects/_/buckets/tj/objects/datasets/dd/') || "
                                   f"{listing}.startsWith('datasets/dd/') || "
                                   f"resource.name == 'projects/_/buckets/tj/objects/uploads/{PROJECT_B}/aa/m.py'"}},
        {"availableResource": "//storage.googleapis.com/projects/_/buckets/tj",
         "availablePermissions": ["inRole:roles/storage.objectUser"],
         "availabilityCondition": {"title": f"job {JOB}", "expression":
                                   f"resource.name.startsWith('projects/_/buckets/tj/objects/jobs/{JOB}/') || "
                                   f"{listing}.startsWith('jobs/{JOB}/')"}},
    ]


def test_agent_storage_client_takes_its_token_from_the_file_the_worker_rewrites(tmp_path, monkeypatch):
    token_file = tmp_path / "storage-token.json"
    write_token_file(token_file, "first", datetime.now(UTC) + timedelta(hours=1))
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv(storage.TOKEN_FILE_ENV, str(token_file))
    credentials = storage.client()._credentials
    credentials.refresh(None)
    assert credentials.token == "first"
    write_token_file(token_file, "second", datetime.now(UTC) + timedelta(hours=1))
    credentials.refresh(None)
    assert credentials.token == "second"


def test_worker_writes_the_first_token_before_the_agent_starts_readable_by_it_alone(tmp_path):
    token_file = tmp_path / "storage-token.json"
    refresher = TokenFileRefresher(token_file, lambda: ("minted", datetime.now(UTC) + timedelta(hours=1)))
    refresher.start()
    refresher.stop()
    assert json.loads(token_file.read_text())["access_token"] == "minted"
    assert token_file.stat().st_mode & 0o777 == 0o600
