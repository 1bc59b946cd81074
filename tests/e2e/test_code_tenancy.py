"""A job's code reaches only its own job's storage and nothing of the worker (issue 8, section 1), through
the whole product: a real job's model module tries each attack from inside its agent. The pieces one
by one (environment, boundary, guard, artifact checks): tests/integration/test_code_tenancy.py."""

from __future__ import annotations

import json
import os

import httpx
import pytest

from tests.support.jobs import make_key
from tests.support.jobs import wait_for_job
from tests.support.local import AGENT_JOB_S
from tests.support.tenancy import succeeded_job
from trainjobs import storage


ATTACKER = b'''
import json
import os
import stat

import keras

from trainjobs import storage


def _attempt(report, what, action):
    try:
        action()
        report[what] = "done"
    except Exception as exc:
        report[what] = f"{type(exc).__name__}: {str(exc)[:300]}"


def build_model(input_shape, num_classes, params):
    report = {"environment": sorted(k for k, v in os.environ.items()
                                    if k in params["secrets"] or "postgresql" in v or "s3cr3t" in v)}
    bucket = params["bucket"]
    _attempt(report, "list the uploads", lambda: list(storage.client().list_blobs(bucket, prefix="uploads/")))
    _attempt(report, "list the bucket", lambda: list(storage.client().list_blobs(bucket)))
    _attempt(report, "read another project's module", lambda: storage.blob(params["module"]).download_as_bytes())
    _attempt(report, "read another project's dataset", lambda: storage.blob(params["dataset"]).download_as_bytes())
    _attempt(report, "overwrite another job's artifact",
             lambda: storage.blob(params["artifact"]).upload_from_string(b'{"val_accuracy": 0.0}'))
    # The local agent zygote forked this process: its request pipe would start any process, with
    # any environment (the emulator's own address, say).
    report["stdio pipes"] = [stat.S_ISFIFO(os.fstat(fd).st_mode) for fd in (0, 1, 2)]
    report["root"] = os.geteuid() == 0
    _attempt(report, "write to the zygote's request pipe", lambda: open(f"/proc/{os.getppid()}/fd/0", "w").close())
    with open(params["report"], "w") as f:
        json.dump(report, f)
    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                             keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(num_classes, activation="softmax")])
'''



@pytest.mark.tf
def test_another_projects_code_reaches_nothing_of_the_worker_or_of_other_projects(
        db, api, api_url, bucket, local_stack, tmp_path, database_url, monkeypatch):
    # What a worker holds: the database URL and a secret of the operator's; agents start after this.
    monkeypatch.setenv("TRAINJOBS_DATABASE_URL", database_url)
    monkeypatch.setenv("TRAINJOBS_WORKER_SECRET", "s3cr3t")
    # Project alpha: its model code, its dataset, a finished job with a metrics.json.
    module_a = api.post("/v1/modules", files={"file": ("alpha_model.py", b"SECRET = 1\n")}).json()["module"]
    dataset_a = api.post("/v1/datasets", files={"file": ("alpha.csv", b"x,label\n1,0\n2,1\n")}).json()["sha256"]
    dataset_a_uri = next(f"gs://{bucket}/{b.name}" for b in storage.client().list_blobs(bucket, prefix="uploads/")
                         if dataset_a in b.name)
    metrics_a = b'{"val_accuracy": 0.97}'
    job_a = succeeded_job(db, api, bucket, {"metrics.json": metrics_a})

    report = tmp_path / "report.json"
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {make_key(db, 'beta')}"}, timeout=30) as beta:
        module_b = beta.post("/v1/modules", files={"file": ("beta_model.py", ATTACKER)}).json()["module"]
        params = {"report": str(report), "bucket": bucket, "module": module_a, "dataset": dataset_a_uri,
                  "artifact": f"gs://{bucket}/jobs/{job_a}/artifacts/metrics.json",
                  "secrets": ["TRAINJOBS_DATABASE_URL", "TRAINJOBS_WORKER_SECRET", "TRAINJOBS_TEST_DATABASE_URL"]}
        spec = {"dataset": {"source": "sklearn:digits"}, "model": {"module": module_b, "params": params},
                "accelerator": {"type": "cpu"}, "strategy": "default", "training": {"epochs": 3, "learning_rate": 0.01}}
        r = beta.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        job_b = wait_for_job(beta, r.json()["id"], {"SUCCEEDED"}, timeout=AGENT_JOB_S)

        attempts = json.loads(report.read_text())
        assert attempts.pop("environment") == []
        assert attempts.pop("stdio pipes") == [False, False, False]  # /dev/null and the machine's log
        assert local_stack.forked_agents == 1
        # Not dumpable, so no process of its user can open it through /proc; root can (README, Security).
        to_zygote, root = attempts.pop("write to the zygote's request pipe"), attempts.pop("root")
        assert to_zygote.startswith("PermissionError") or root, to_zygote
        assert {what: "Forbidden" in outcome and "403" in outcome for what, outcome in attempts.items()} == {
            "list the uploads": True, "list the bucket": True, "read another project's module": True,
            "read another project's dataset": True, "overwrite another job's artifact": True}
        assert job_b["metrics"]["val_accuracy"] > 0.5  # its own training went on as usual
        assert api.get(f"/v1/jobs/{job_a}/artifacts/metrics.json").content == metrics_a

        # Beta's own artifacts were copied at success: changed later, they are not served.
        own = beta.get(f"/v1/jobs/{job_b['id']}/artifacts").json()["artifacts"]
        assert {"metrics.json", "history.json"} <= {a["path"] for a in own}
        storage.bucket(bucket).blob(f"jobs/{job_b['id']}/artifacts/metrics.json").upload_from_string(b"{}")
        assert beta.get(f"/v1/jobs/{job_b['id']}/artifacts/metrics.json").status_code == 409



ZYGOTE_ATTACKER = b'''
import json
import os

import keras


def build_model(input_shape, num_classes, params):
    """Ask the zygote for an agent (any environment: the emulator's own address, say) through the
    worker's end of its channel, found as any process of the worker's user can find it."""
    zygote = os.getppid()  # this agent was forked by it
    with open(f"/proc/{zygote}/stat") as f:
        worker = int(f.read().rsplit(")", 1)[1].split()[1])
    try:  # what the zygote reads requests from and writes replies to (readable here as root)
        channel = {os.readlink(f"/proc/{zygote}/fd/{fd}") for fd in (0, 1)}
    except OSError:
        channel = set()
    request = json.dumps({"args": ["--help"], "env": {}, "log": params["evidence"]}).encode() + b"\\n"
    tried = {}
    for fd in os.listdir(f"/proc/{worker}/fd"):
        link = os.readlink(f"/proc/{worker}/fd/{fd}")
        if link in channel or link.startswith("socket:"):
            try:
                with open(f"/proc/{worker}/fd/{fd}", "wb", buffering=0) as end:
                    end.write(request)
                tried[fd] = "sent"
            except OSError as exc:
                tried[fd] = exc.strerror
    with open(params["report"], "w") as f:
        json.dump({"tried": tried, "worker": worker}, f)
    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                             keras.layers.Dense(num_classes, activation="softmax")])
'''



@pytest.mark.tf
def test_a_jobs_code_cannot_ask_the_agent_zygote_for_a_process(db, api, bucket, local_stack, tmp_path):
    """The worker's end of the zygote's channel is a socket: /proc/<worker>/fd/N cannot open it, not
    even as root (the pipe it replaced opened, and the zygote forked what the job asked for)."""
    report, evidence = tmp_path / "report.json", tmp_path / "forked-for-the-job.log"
    module = api.post("/v1/modules", files={"file": ("zygote_attacker.py", ZYGOTE_ATTACKER)}).json()["module"]
    spec = {"dataset": {"source": "sklearn:digits"}, "accelerator": {"type": "cpu"}, "strategy": "default",
            "model": {"module": module, "params": {"report": str(report), "evidence": str(evidence)}},
            "training": {"epochs": 1}}
    job = api.post("/v1/jobs", json=spec).json()
    wait_for_job(api, job["id"], {"SUCCEEDED"}, timeout=AGENT_JOB_S)
    assert local_stack.forked_agents == 1  # the job's code ran in an agent the zygote forked
    outcome = json.loads(report.read_text())
    assert outcome["worker"] == os.getpid()  # the worker runs in this test's process
    assert outcome["tried"] and set(outcome["tried"].values()) == {"No such device or address"}, outcome
    assert not evidence.exists()  # nothing was forked for the job


STUDENT_ATTACKER = b'''
import json

import keras

from trainjobs import storage


def _attempt(report, what, action):
    try:
        action()
        report[what] = "done"
    except Exception as exc:
        report[what] = f"{type(exc).__name__}: {str(exc)[:300]}"


def build_model(input_shape, num_classes, params):
    bucket, teacher = params["bucket"], f"jobs/{params['teacher']}"
    report = {}
    _attempt(report, "read the teacher's labels", lambda: storage.blob(f"gs://{bucket}/{teacher}/artifacts/labels.json")
             .download_as_bytes())
    _attempt(report, "list the teacher's artifacts",
             lambda: list(storage.client().list_blobs(bucket, prefix=f"{teacher}/artifacts/")))
    _attempt(report, "read the teacher's spec", lambda: storage.blob(f"gs://{bucket}/{teacher}/spec.json")
             .download_as_bytes())
    _attempt(report, "list the teacher's directory",
             lambda: list(storage.client().list_blobs(bucket, prefix=f"{teacher}/")))
    _attempt(report, "overwrite the teacher's labels",
             lambda: storage.blob(f"gs://{bucket}/{teacher}/artifacts/labels.json").upload_from_string(b"{}"))
    _attempt(report, "read another job's artifact", lambda: storage.blob(params["other"]).download_as_bytes())
    with open(params["report"], "w") as f:
        json.dump(report, f)
    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                             keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(num_classes, activation="softmax")])
'''


@pytest.mark.tf
def test_a_students_code_reads_its_teachers_artifacts_and_nothing_else_of_any_job(
        db, api, bucket, local_stack, tmp_path):
    """Distillation (issue 23) widens a student's boundary by its teacher's artifacts/, read-only: its own
    model code can read them (the agent does, to learn from them), and no more of the teacher nor of any
    other job; the teacher's artifacts stay what its manifest says. Through the product: a real teacher
    trained by the local stack, the student staged (its classes checked against the teacher's) and trained."""
    teacher = api.post("/v1/jobs", json={"dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp"},
                                         "accelerator": {"type": "cpu"}, "strategy": "default",
                                         "training": {"epochs": 1}}).json()
    wait_for_job(api, teacher["id"], {"SUCCEEDED"}, timeout=AGENT_JOB_S)
    labels = api.get(f"/v1/jobs/{teacher['id']}/artifacts/labels.json").content
    other = succeeded_job(db, api, bucket, {"metrics.json": b'{"val_accuracy": 0.97}'})
    module = api.post("/v1/modules", files={"file": ("student.py", STUDENT_ATTACKER)}).json()["module"]
    report = tmp_path / "report.json"
    params = {"report": str(report), "bucket": bucket, "teacher": teacher["id"],
              "other": f"gs://{bucket}/jobs/{other}/artifacts/metrics.json"}
    r = api.post("/v1/jobs", json={"dataset": {"source": "sklearn:digits"}, "model": {"module": module, "params": params},
                                   "accelerator": {"type": "cpu"}, "strategy": "default",
                                   "training": {"epochs": 1, "distillation": {"teacher_job": teacher["id"]}}})
    assert r.status_code == 201, r.text
    student = wait_for_job(api, r.json()["id"], {"SUCCEEDED"}, timeout=AGENT_JOB_S)

    attempts = json.loads(report.read_text())
    assert {what: outcome == "done" for what, outcome in attempts.items()} == {
        "read the teacher's labels": True, "list the teacher's artifacts": True, "read the teacher's spec": False,
        "list the teacher's directory": False, "overwrite the teacher's labels": False,
        "read another job's artifact": False}, attempts
    assert all("403" in outcome for outcome in attempts.values() if outcome != "done"), attempts
    assert api.get(f"/v1/jobs/{teacher['id']}/artifacts/labels.json").content == labels
    assert student["metrics"]["distillation"]["teacher_job"] == teacher["id"]
