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

from tests.conftest import scaled
from worker.provisioners import local
from worker.provisioners.local import LocalProvisioner

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
    deadline = time.monotonic() + scaled(30)
    while not Path(str(out) + ".ready").exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the stand-in host did not start"
        time.sleep(0.05)
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
    from trainjobs.watchdog import term_grace_s

    assert term_grace_s({"TRAINJOBS_TERM_GRACE_S": value}) == grace


def test_an_agent_starts_as_a_process_of_its_own_when_the_zygote_is_gone(tmp_path: Path) -> None:
    from worker.provisioners.zygote import Zygote, ZygoteUnavailable

    zygote = Zygote({"PATH": "/usr/bin:/bin"}, tmp_path / "zygote.log")
    os.kill(zygote.pid, signal.SIGKILL)
    with pytest.raises(ZygoteUnavailable, match="exited"):
        zygote.spawn(["--job-dir", "gs://b/jobs/x"], {}, tmp_path / "task-0.log")
    with pytest.raises(ZygoteUnavailable):  # and it is not asked again
        zygote.spawn(["--job-dir", "gs://b/jobs/x"], {}, tmp_path / "task-0.log")
    assert zygote.forked == 0
