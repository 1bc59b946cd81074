"""The local provisioner's delete: SIGTERM to each host's process group, then as long as the agent's own
cleanup may take (TRAINJOBS_TERM_GRACE_S) and a margin, then SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support import eventually, scaled
from worker.local import provisioner as local
from worker.local.provisioner import LocalProvisioner

# A host that takes `cleanup_s` after SIGTERM to write its last word, as a loaded agent does.
SLOW_HOST = """
import signal, sys, time
from pathlib import Path
out, cleanup_s = Path(sys.argv[1]), float(sys.argv[2])
def on_term(signum, frame):
    time.sleep(cleanup_s)
    out.write_text("last word")
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
Path(str(out) + ".ready").write_text("")
while True:
    time.sleep(0.1)
"""


def _machine(root: Path, name: str, out: Path, cleanup_s: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SLOW_HOST, str(out), str(cleanup_s)], start_new_session=True)
    threading.Thread(target=proc.wait, daemon=True).start()
    def started() -> bool:
        assert proc.poll() is None, "the stand-in host exited"
        return Path(str(out) + ".ready").exists()

    eventually(started, 30, "the stand-in host started")
    logs = root / name
    logs.mkdir()
    (root / f"{name}.json").write_text(json.dumps({"name": name, "labels": {}, "devices": 1, "created": time.time(),
                                                   "logs": str(logs), "pids": [proc.pid]}))
    return proc


def test_delete_waits_out_the_agents_own_grace_before_killing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The cleanup takes longer than the 10 s delete used to wait, and less than the agent's grace.
    cleanup_s = 11.0
    monkeypatch.setenv("TRAINJOBS_TERM_GRACE_S", str(cleanup_s + scaled(10)))
    provisioner = LocalProvisioner(tmp_path / "machines")
    proc = _machine(provisioner.root, "m1", tmp_path / "out", cleanup_s)
    provisioner.delete("m1")
    assert (tmp_path / "out").read_text() == "last word"
    assert proc.wait(scaled(10)) == 143
    assert provisioner.list({}) == [] and not (provisioner.root / "m1").exists()


def test_delete_kills_a_host_whose_cleanup_outlasts_the_grace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINJOBS_TERM_GRACE_S", "0")
    monkeypatch.setattr(local, "DELETE_MARGIN_S", 0.5)
    provisioner = LocalProvisioner(tmp_path / "machines")
    proc = _machine(provisioner.root, "m1", tmp_path / "out", cleanup_s=scaled(120))
    started = time.monotonic()
    provisioner.delete("m1")
    assert proc.wait(scaled(10)) == -9
    assert time.monotonic() - started < scaled(60)  # long before the host would have finished
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("value", "grace"), [("12.5", 12.5), ("", 30.0), ("soon", 30.0), ("-3", 0.0)])
def test_term_grace_reads_the_agents_setting(value: str, grace: float) -> None:
    from trainjobs.stop_request import term_grace_s

    assert term_grace_s({"TRAINJOBS_TERM_GRACE_S": value}) == grace


def test_an_agent_starts_as_a_process_of_its_own_when_the_zygote_is_gone(tmp_path: Path) -> None:
    from worker.local.zygote_client import Zygote, ZygoteUnavailable

    zygote = Zygote({"PATH": "/usr/bin:/bin"}, tmp_path / "zygote.log")
    os.kill(zygote.pid, signal.SIGKILL)
    with pytest.raises(ZygoteUnavailable, match="exited"):
        zygote.spawn(["--job-dir", "gs://b/jobs/x"], {}, tmp_path / "task-0.log")
    with pytest.raises(ZygoteUnavailable):  # and it is not asked again
        zygote.spawn(["--job-dir", "gs://b/jobs/x"], {}, tmp_path / "task-0.log")
    assert zygote.forked == 0



def test_a_zygote_handed_to_a_provisioner_outlives_it(tmp_path: Path) -> None:
    """The test suite shares one zygote across its stacks (tests/support/local.py): a provisioner
    that did not start it neither closes it nor counts another's agents as its own."""
    from worker.local.zygote_client import Zygote

    zygote = Zygote({"PATH": "/usr/bin:/bin"}, tmp_path / "zygote.log")
    try:
        provisioner = LocalProvisioner(tmp_path / "machines", zygote=zygote)
        assert provisioner.start_zygote() is zygote and provisioner.forked_agents == 0
        provisioner.close()
        assert zygote.usable and zygote.pid == provisioner.start_zygote().pid
        os.kill(zygote.pid, signal.SIGKILL)
        eventually(lambda: not zygote.usable, scaled(10), "the killed zygote seen as unusable")
    finally:
        zygote.close()


# --- a machine outlives the worker that started it: the record names it from the first instant -----

# A worker that starts one machine; the test kills it while the machine is half started.
CREATOR = """
import sys
from pathlib import Path
from trainjobs.job_paths import JobPaths
from trainjobs.spec import JobSpec
from worker.boundary.access import JobBoundary, Scope
from worker.ports import MachineRequest
from worker.local.provisioner import LocalProvisioner
root, job_id, bucket = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
spec = JobSpec.model_validate({"dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp"}})
job_dir = JobPaths.for_job(job_id, bucket).root
boundary = JobBoundary(job_id, read=(), write=(Scope.from_uri(job_dir, directory=True),))
LocalProvisioner(root).create(MachineRequest(job_id, 1, spec, job_dir, boundary))
"""


def _serves(port_file: Path) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", int(port_file.read_text())), timeout=scaled(5)).close()
        return True
    except OSError:
        return False


def test_a_machine_whose_worker_was_killed_while_starting_it_is_listed_and_deleted_by_label(
        tmp_path: Path, bucket: str) -> None:
    import uuid

    from trainjobs.vm_metadata import LABEL_JOB
    from worker.ports import MachineState

    root, job_id = tmp_path / "machines", str(uuid.uuid4())
    creator = subprocess.Popen([sys.executable, "-c", CREATOR, str(root), job_id, bucket])
    # The machine's storage guard runs; its agent waits for the zygote's imports (seconds). Killed now,
    # the worker never returns from create: before, it recorded the machine only then.
    port_file = root / f"tj-{job_id.replace('-', '')[:20]}-a1" / "storage-guard.port"
    def started() -> bool:
        assert creator.poll() is None, "the worker exited before the machine started"
        return port_file.exists()

    eventually(started, 60, "the machine's storage guard runs", every=0.01)
    creator.kill()
    creator.wait()
    assert _serves(port_file)  # left running, as a killed worker leaves it

    fresh = LocalProvisioner(root)
    [machine] = fresh.list({LABEL_JOB: job_id})
    assert machine.state == MachineState.STOPPED  # it never ran its job
    fresh.delete(machine.name)
    assert fresh.list({}) == [] and not _serves(port_file)


def test_delete_stops_a_process_of_the_machine_that_was_never_recorded(tmp_path: Path) -> None:
    """A worker killed between starting an agent and recording its pid: the agent writes its log into
    the machine's directory from its first instruction, and that is how delete finds it."""
    provisioner = LocalProvisioner(tmp_path / "machines")
    logs = provisioner.root / "m1"
    logs.mkdir()
    with (logs / "task-0.log").open("ab") as out:
        agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], stdout=out,
                                 start_new_session=True)
    (provisioner.root / "m1.json").write_text(json.dumps({
        "name": "m1", "labels": {}, "devices": 1, "created": time.time(), "logs": str(logs), "pids": [],
        "started": {}, "starting": True}))
    provisioner.delete("m1")
    assert agent.wait(scaled(10)) == -signal.SIGTERM


def test_delete_never_signals_a_pid_that_now_names_another_process(tmp_path: Path) -> None:
    """The recorded agent exited and the kernel gave its pid to someone else's process: the start
    time the record noted tells them apart."""
    provisioner = LocalProvisioner(tmp_path / "machines")
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        logs = provisioner.root / "m1"
        logs.mkdir()
        started = int(Path(f"/proc/{bystander.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        (provisioner.root / "m1.json").write_text(json.dumps({
            "name": "m1", "labels": {}, "devices": 1, "created": time.time(), "logs": str(logs),
            "pids": [bystander.pid], "started": {str(bystander.pid): started - 1}}))  # the agent, long before
        provisioner.delete("m1")
        assert bystander.poll() is None  # untouched
        assert provisioner.list({}) == []
    finally:
        bystander.kill()
        bystander.wait()
