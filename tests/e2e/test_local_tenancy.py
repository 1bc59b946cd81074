"""One project's job on a local machine reaches nothing of the worker's nor of another project's (issue 36,
findings 10 and 7), each attack run from a real program job's own code through the whole product.

- In the sandbox (worker/local/sandbox.py): a program looks for the worker's environment in /proc, the
  database and the emulator on the loopback, the worker's files, and still does its own storage.
- Without it: only the project the operator names runs (worker/local/host_claim.py).
- The requirements cache: another project's planted environment never runs in a job (per-project caches).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.db.projects import ensure_project
from service.db.session import transaction
from tests.support.jobs import make_key, wait_for_job
from tests.support.local import AGENT_JOB_S, local_stack_running
from tests.support.wheels import make_wheel
from worker.local.host_claim import assign_host
from worker.local.sandbox import LocalIsolation, probe

pytestmark = pytest.mark.tf

PROBER = r'''
import json, os, socket, subprocess, sys
from pathlib import Path

params = json.loads(sys.argv[1])
report = {}

def attempt(what, action):
    try:
        report[what] = ["done", action()]
    except Exception as exc:
        report[what] = [type(exc).__name__, str(exc)[:200]]

processes = {}
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != os.getpid():
        seen = {}
        for part in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as f:
                    seen[part] = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError as exc:
                seen[part] = type(exc).__name__
        processes[pid] = seen
report["processes"] = processes
attempt("read the worker's environment", lambda: open(f"/proc/{params['worker_pid']}/environ").read()[:50])
for what, port in (("connect to PostgreSQL", 5432), ("connect to the emulator", params["emulator_port"])):
    attempt(what, lambda port=port: socket.create_connection(("127.0.0.1", port), timeout=10).close())
report["network interfaces"] = [name for _, name in socket.if_nameindex()]
own = next(p for p in Path(os.environ["TRAINJOBS_MODEL_DIR"]).parents if p.name.startswith("tj-"))
attempt("list its own machine's directory", lambda: sorted(os.listdir(own)))
for what, path in params["listed"].items():
    attempt(what, lambda path=path: sorted(os.listdir(path))[:20])
for what, path in params["read"].items():
    attempt(what, lambda path=path: open(path).read()[:100])
# Its requirement, installed in the sandbox from the operator's folder, in its project's cache.
import tjgreet
report["requirement"] = [tjgreet.hello(), sys.executable]
# A process left behind in a session of its own: it must end with the machine.
subprocess.Popen(["sleep", params["daemon"]], start_new_session=True)
with open(os.path.join(os.environ["TRAINJOBS_MODEL_DIR"], "report.json"), "w") as f:
    json.dump(report, f)
'''


def _program(client: httpx.Client, name: str, source: str, **program: Any) -> dict[str, Any]:
    r = client.post("/v1/modules", files={"file": (name, source.encode())})
    assert r.status_code == 201, r.text
    job = client.post("/v1/jobs", json={"accelerator": {"type": "cpu"},
                                        "program": {"source": r.json()["module"], **program}})
    assert job.status_code == 201, job.text
    return dict(job.json())


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _artifact(client: httpx.Client, job_id: str, path: str) -> bytes | None:
    r = client.get(f"/v1/jobs/{job_id}/artifacts/{path}")
    return r.content if r.status_code == 200 else None


@pytest.fixture
def sandboxed_stack(db, database_url: str, bucket: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    if (problem := probe()) is not None:  # .ci/run installs bubblewrap, so CI never skips this
        pytest.skip(f"no bubblewrap sandbox on this host: {problem}")
    with local_stack_running(database_url, tmp_path, isolation=LocalIsolation(sandbox=True)) as provisioner:
        yield provisioner


def test_a_sandboxed_jobs_code_sees_no_worker_process_file_or_port_and_still_reaches_its_storage(
        db, api, bucket, gcs_emulator, sandboxed_stack, tmp_path, database_url, monkeypatch):  # type: ignore[no-untyped-def]
    # What the worker holds: the database URL and a secret of the operator's; the agent starts after this.
    monkeypatch.setenv("TRAINJOBS_DATABASE_URL", database_url)
    monkeypatch.setenv("TRAINJOBS_WORKER_SECRET", "s3cr3t-of-the-operator")
    emulator_port = int(gcs_emulator.url.rsplit(":", 1)[1].split("/")[0])
    machines = sandboxed_stack.root
    other_disk = machines / "tj-another-job-a1" / "disk-0"  # another job's machine, as the provisioner lays it out
    other_disk.mkdir(parents=True)
    (other_disk / "weights.txt").write_text("another project's weights")
    (tmp_path / "worker-secret.txt").write_text("s3cr3t-of-the-operator")
    (machines / "cache" / "another-projects-cache").mkdir(parents=True)
    # A requirement's wheel in a folder the operator lets jobs name (issue 36, finding 9), not the worker's data.
    wheels = Path(tempfile.mkdtemp())
    monkeypatch.setenv("TRAINJOBS_HOST_DATA_DIRS", str(wheels))
    wheel = make_wheel(wheels, "tjgreet", "0.1", {"tjgreet/__init__.py": "def hello():\n    return 'hi'\n"})
    daemon = "7357.4711"  # seconds to sleep, and the mark of the process the job leaves behind
    params = {"worker_pid": os.getpid(), "emulator_port": emulator_port, "daemon": daemon,
              "listed": {"list the machines": str(machines), "list the caches": str(machines / "cache"),
                         "list the worker's data": str(tmp_path), "list ~/.trainjobs": str(Path.home() / ".trainjobs")},
              "read": {"read another job's disk": str(other_disk / "weights.txt"),
                       "read the worker's file": str(tmp_path / "worker-secret.txt")}}
    job = _program(api, "prober.py", PROBER, args=[json.dumps(params)], requirements=[f"tjgreet @ {wheel.as_uri()}"])
    wait_for_job(api, job["id"], {"SUCCEEDED"}, timeout=AGENT_JOB_S)  # its machine deleted first
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and daemon in _cmdline(pid)]

    report = _artifact(api, job["id"], "report.json")  # written through its storage guard, downloaded here
    assert report is not None
    found = json.loads(report)
    processes = found.pop("processes")
    # Its own PID namespace: the sandbox's launcher and relay, the agent, nothing of the worker's.
    assert 0 < len(processes) <= 4, processes
    assert all("agent" in p["cmdline"] or "bwrap" in p["cmdline"] for p in processes.values()), processes
    seen = json.dumps(processes)
    assert "s3cr3t-of-the-operator" not in seen and database_url not in seen and "postgresql" not in seen
    assert found.pop("network interfaces") == ["lo"]
    # Of the worker's directories it sees only the path down to its own disk and its project's cache:
    # no inventory, log, guard file or socket, no other machine, no staging.
    own = f"tj-{job['id'].replace('-', '')[:20]}-a1"  # MachineRequest.name
    assert found.pop("list its own machine's directory") == ["done", ["disk-0"]]
    assert found.pop("list the machines") == ["done", sorted(["cache", own])]
    caches = found.pop("list the caches")
    assert caches[0] == "done" and len(caches[1]) == 1 and caches[1] != ["another-projects-cache"], caches
    hello, python = found.pop("requirement")
    assert hello == "hi" and Path(python).is_relative_to(machines / "cache" / caches[1][0]), python
    assert found.pop("list the worker's data") == ["done", ["machines"]]
    assert {what: outcome[0] for what, outcome in found.items()} == {
        "read the worker's environment": "FileNotFoundError",
        "connect to PostgreSQL": "ConnectionRefusedError", "connect to the emulator": "ConnectionRefusedError",
        "list ~/.trainjobs": "FileNotFoundError", "read another job's disk": "FileNotFoundError",
        "read the worker's file": "FileNotFoundError"}, found


FINISHES = 'print("a job of the project this host runs")\n'


def test_without_the_sandbox_only_the_project_the_operator_names_runs_even_if_another_submits_first(
        db, api, api_url, bucket, database_url, tmp_path):  # type: ignore[no-untyped-def]
    """Unsandboxed, a job's code reads the worker's environment and so holds the deployment: the host runs the
    project the operator named (here alpha, as `up` names its own), never the first to submit (beta here)."""
    with transaction(db) as session:
        alpha = ensure_project(session, "alpha")
    with local_stack_running(database_url, tmp_path, isolation=LocalIsolation(sandbox=False, trusted=False)) as machines:
        assign_host(machines.root, str(alpha))
        with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {make_key(db, 'beta')}"},
                          timeout=30) as beta:
            first = _program(beta, "first.py", FINISHES)
            refused = wait_for_job(beta, first["id"], {"FAILED"}, timeout=AGENT_JOB_S)
        named = _program(api, "named.py", FINISHES)
        wait_for_job(api, named["id"], {"SUCCEEDED"}, timeout=AGENT_JOB_S)
    assert "for another project only" in refused["error"], refused["error"]
    assert "TRAINJOBS_LOCAL_TRUSTED=1" in refused["error"] and "TRAINJOBS_LOCAL_PROJECT" in refused["error"]


PLANTER = r'''
import os, stat, sys
from pathlib import Path

from agent.requirements import cached_environment, image_versions

# The environment a job of any project asking for these requirements would reuse, as the agent finds it,
# and the same environment in the victim's own cache, at the path the provisioner gives it on the host.
own = cached_environment(["six==1.17.0"], image_versions())
for env in [own, *(Path(root) / "requirements" / own.name for root in sys.argv[1:])]:
    python = env / "bin" / "python"
    try:
        python.parent.mkdir(parents=True, exist_ok=True)
        python.write_text("#!/bin/sh\necho planted > \"$TRAINJOBS_MODEL_DIR/planted.txt\"\n")
        python.chmod(0o755)
        print("planted", python)
    except OSError as exc:
        print("could not plant", python, exc)
'''

USES_SIX = r'''
import os, sys
import six
with open(os.path.join(os.environ["TRAINJOBS_MODEL_DIR"], "ran.txt"), "w") as f:
    f.write(sys.executable)
'''


@pytest.mark.parametrize("sandboxed", [False, True], ids=["unsandboxed-trusted", "sandboxed"])
def test_a_requirements_environment_another_project_planted_never_runs_in_a_job(
        db, api, api_url, bucket, database_url, tmp_path, monkeypatch, sandboxed):  # type: ignore[no-untyped-def]
    """Unsandboxed and trusted, the caches are apart by project (the planter writes only where its own agent
    looks); in the sandbox, the planter also writes to the victim's cache at its host path, which it cannot see."""
    if sandboxed and (problem := probe()) is not None:  # .ci/run installs bubblewrap, so CI never skips this
        pytest.skip(f"no bubblewrap sandbox on this host: {problem}")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # where an agent's default cache would be
    isolation = LocalIsolation(sandbox=True) if sandboxed else LocalIsolation(sandbox=False, trusted=True)
    with transaction(db) as session:
        alpha = ensure_project(session, "alpha")
    with local_stack_running(database_url, tmp_path, isolation=isolation) as provisioner:
        victims_cache = provisioner.project_cache(str(alpha))
        with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {make_key(db, 'beta')}"},
                          timeout=30) as beta:
            planter = _program(beta, "planter.py", PLANTER, args=[str(victims_cache)] if sandboxed else [])
            wait_for_job(beta, planter["id"], {"SUCCEEDED"}, timeout=AGENT_JOB_S)
        victim = _program(api, "victim.py", USES_SIX, requirements=["six==1.17.0"])
        wait_for_job(api, victim["id"], {"SUCCEEDED"}, timeout=AGENT_JOB_S)
        assert _artifact(api, victim["id"], "planted.txt") is None
        ran = _artifact(api, victim["id"], "ran.txt")
        assert ran is not None  # its own environment, built for it, ran its program
        assert Path(ran.decode()).is_relative_to(provisioner.root / "cache"), ran
