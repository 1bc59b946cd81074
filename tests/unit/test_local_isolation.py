"""How local machines are isolated (issue 36, finding 10): the settings, read once and refused when wrong,
and the one-project claim of a host without a sandbox. The sandbox itself, attacked from a job's own
code: tests/e2e/test_local_tenancy.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from worker.local import sandbox
from worker.local.host_claim import HostClaimed, assign_host, check_host
from worker.local.sandbox import LocalIsolation, SandboxUnavailable


@pytest.mark.parametrize(("variable", "value"), [("TRAINJOBS_LOCAL_SANDBOX", "yes"),
                                                 ("TRAINJOBS_LOCAL_TRUSTED", "maybe")])
def test_a_setting_out_of_its_values_is_refused_naming_the_variable(monkeypatch, variable, value):
    monkeypatch.setenv("TRAINJOBS_LOCAL_SANDBOX", "off")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=variable):
        LocalIsolation.from_env()


def test_a_required_sandbox_that_cannot_start_stops_the_worker_with_the_reason(monkeypatch):
    monkeypatch.setenv("TRAINJOBS_LOCAL_SANDBOX", "bwrap")
    monkeypatch.setenv("PATH", "/nonexistent")  # no bwrap to find
    with pytest.raises(SandboxUnavailable, match="bwrap is not installed"):
        LocalIsolation.from_env()


def test_without_bubblewrap_auto_runs_unsandboxed_and_trusts_nobody_unless_told(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("TRAINJOBS_LOCAL_SANDBOX", "auto")
    monkeypatch.delenv("TRAINJOBS_LOCAL_TRUSTED", raising=False)
    assert LocalIsolation.from_env() == LocalIsolation(sandbox=False, trusted=False)
    monkeypatch.setenv("TRAINJOBS_LOCAL_TRUSTED", "1")
    assert LocalIsolation.from_env() == LocalIsolation(sandbox=False, trusted=True)
    assert "UNSANDBOXED" in LocalIsolation(sandbox=False, trusted=True).describe()


def test_an_unsandboxed_host_runs_only_the_project_the_operator_names(tmp_path: Path):
    with pytest.raises(HostClaimed, match="no project is named") as unnamed:
        check_host(tmp_path, "project-a")  # no job claims the host by coming first
    assert "TRAINJOBS_LOCAL_PROJECT" in str(unnamed.value) and "TRAINJOBS_LOCAL_TRUSTED=1" in str(unnamed.value)
    assign_host(tmp_path, "project-a")
    check_host(tmp_path, "project-a")
    check_host(tmp_path, "project-a")  # its next job
    with pytest.raises(HostClaimed, match="for another project only"):
        check_host(tmp_path, "project-b")
    with pytest.raises(HostClaimed):
        check_host(tmp_path, None)  # a request that names no project runs nowhere
    assign_host(tmp_path, "project-b")  # the operator's word replaces the last
    check_host(tmp_path, "project-b")
    with pytest.raises(HostClaimed):
        check_host(tmp_path, "project-a")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project-claim"]


@pytest.mark.parametrize("network", [False, True])
def test_only_a_real_buckets_machine_shares_the_hosts_network(monkeypatch, tmp_path: Path, network: bool):
    monkeypatch.setattr(sandbox, "bwrap", lambda: "/usr/bin/bwrap")
    command = sandbox.bwrap_command(command=["python"], writable=[tmp_path], readable=[], network=network,
                                    guard_socket=None if network else tmp_path / "guard.sock", cwd=tmp_path)
    assert "--unshare-all" in command and "--unshare-user" in command
    assert ("--share-net" in command) == network
    guard_bound = ("--bind", str(tmp_path / "guard.sock"), sandbox.GUARD_SOCKET) in zip(command, command[1:], command[2:])
    assert guard_bound != network  # without a network, the guard's socket is the one way out


def test_a_sandboxed_job_cannot_make_a_user_namespace_of_its_own(tmp_path: Path):
    """Where it could, it would hold every capability there (the kernel's network and mount code, whose
    bugs are how code without privileges usually becomes root)."""
    if (problem := sandbox.probe()) is not None:  # .ci/run installs bubblewrap
        pytest.skip(f"no bubblewrap sandbox on this host: {problem}")
    command = sandbox.bwrap_command(command=["unshare", "--user", "true"], writable=[tmp_path], readable=[],
                                    guard_socket=None, network=False, cwd=tmp_path)
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "unshare failed" in done.stderr, done


def test_deleting_a_machine_removes_a_disk_whose_folders_nest_past_pythons_recursion(tmp_path: Path):
    """A job can nest folders a few thousand deep on its disk; Python 3.11's rmtree raised RecursionError on
    them (not caught by ignore_errors), after the machine's record was gone: the disk stayed for ever."""
    from worker.local.provisioner import LocalProvisioner

    provisioner = LocalProvisioner(tmp_path / "machines", isolation=LocalIsolation(sandbox=False, trusted=True))
    disk = tmp_path / "machines" / "tj-deep-a1" / "disk-0"
    disk.mkdir(parents=True)
    fd = os.open(disk, os.O_RDONLY)
    try:
        for _ in range(3000):  # by descriptors: a path this long is past PATH_MAX
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)
    record = {"name": "tj-deep-a1", "labels": {}, "devices": 1, "created": 0, "logs": str(disk.parent),
              "pids": [], "started": {}}
    (tmp_path / "machines" / "tj-deep-a1.json").write_text(json.dumps(record))
    try:
        provisioner.delete("tj-deep-a1")
        assert not disk.parent.exists() and provisioner.list({}) == []
    finally:
        provisioner.close()
        # Never left behind, even by a failure here: pytest's own cleanup of old runs would hit the same limit.
        subprocess.run(["rm", "-rf", "--", str(disk.parent)], check=False)


def test_deleting_a_machine_kills_no_process_that_took_an_ended_agents_pid(tmp_path: Path, monkeypatch):
    """An agent that ends in the SIGTERM grace frees its pid, which another process may take before the
    SIGKILL that follows (pid_max is 32768 here): that process is not the machine's."""
    import signal
    import time

    from worker.local import provisioner as local_provisioner
    from worker.local.processes import pid_alive, start_time

    monkeypatch.setenv("TRAINJOBS_TERM_GRACE_S", "0")
    monkeypatch.setattr(local_provisioner, "DELETE_MARGIN_S", 0.3)
    # Deaf to SIGTERM, as the process that took the pid may be; its own session, as an agent has.
    other = subprocess.Popen(["sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.2)  # the trap is set
        real = start_time(other.pid)
        looks = iter([real])  # delete's first look finds the agent; every later one, the process after it

        def start_time_as_after_reuse(pid: int) -> int | None:
            return next(looks, real + 1) if pid == other.pid and real is not None else start_time(pid)

        monkeypatch.setattr(local_provisioner, "start_time", start_time_as_after_reuse)
        provisioner = local_provisioner.LocalProvisioner(tmp_path / "machines",
                                                         isolation=LocalIsolation(sandbox=False, trusted=True))
        logs = tmp_path / "machines" / "tj-reused-a1"
        logs.mkdir(parents=True)
        record = {"name": "tj-reused-a1", "labels": {}, "devices": 1, "created": 0, "logs": str(logs),
                  "pids": [other.pid], "started": {str(other.pid): real}}
        (tmp_path / "machines" / "tj-reused-a1.json").write_text(json.dumps(record))
        try:
            provisioner.delete("tj-reused-a1")
        finally:
            provisioner.close()
        assert pid_alive(other.pid), "the process that took the agent's pid was killed"
    finally:
        os.killpg(other.pid, signal.SIGKILL)
        other.wait()
