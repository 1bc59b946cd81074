"""The admin verbs (`keys`, `projects set-quota`, `db upgrade`) work on the deployment `trainjobs up` runs,
found without --data-dir, or refuse in one line; none leaves a database running that it started (issue 37:
`keys list` without --data-dir started a second embedded PostgreSQL, left it running, and printed a
traceback advising `trainjobs db upgrade`)."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import eventually, scaled
from tests.support.tmp import outside_pytest_tmp
from trainjobs.loopback import free_port


def postmasters(under: Path) -> set[int]:
    """The embedded PostgreSQL servers whose data is under `under`."""
    found = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"pginstall/bin/postgres") and b"-D" in argv:
            if argv[argv.index(b"-D") + 1].startswith(str(under).encode()):
                found.add(int(entry))
    return found


@pytest.fixture
def home(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A user's TRAINJOBS_HOME, and an environment naming no database, emulator or data dir."""
    root = outside_pytest_tmp("admin")  # an embedded PostgreSQL's data dir (tests/support/tmp.py says why)
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRAINJOBS_DATABASE_URL", "STORAGE_EMULATOR_HOST", "TRAINJOBS_BUCKET", "TRAINJOBS_DATA_DIR")}
    yield root, {**env, "TRAINJOBS_HOME": str(root / "home")}
    shutil.rmtree(root, ignore_errors=True)


def trainjobs(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stack.cli", *args], env=env, capture_output=True, text=True,
                          timeout=scaled(120))


def test_an_admin_verb_with_no_deployment_refuses_in_one_line_and_starts_no_database(home):
    root, env = home
    for verb in (["keys", "list", "--project", "local"], ["keys", "create", "--project", "x"], ["db", "upgrade"],
                 ["projects", "set-quota", "local", "--max-running-jobs", "1"]):
        r = trainjobs(*verb, env=env)
        assert r.returncode == 1, r
        assert r.stderr.strip().splitlines() == [
            f"Error: no trainjobs deployment found in {root / 'home' / 'data'}: start one with `trainjobs up`, "
            "give its --data-dir, or give TRAINJOBS_DATABASE_URL"], r.stderr
    assert not postmasters(root) and not (root / "home" / "data" / "postgres").exists()


def test_admin_verbs_use_the_running_up_s_database_then_the_stopped_one_s_and_leave_none_running(home):
    root, env = home
    data_dir = root / "elsewhere"  # not the default: found through the running `up`
    log = root / "up.log"
    with log.open("w") as out:
        up = subprocess.Popen([sys.executable, "-m", "stack.cli", "up", "--port", str(free_port()), "--data-dir",
                               str(data_dir), "--provisioner", "memory"], env=env, stdout=out, stderr=out)
    try:
        eventually(lambda: up.poll() is None and "\nready\n" in log.read_text(), 60, lambda: log.read_text(), every=0.1)
        assert f"project 'local': a new API key for it is in {root / 'home' / 'config.json'}" in log.read_text()
        server = int((data_dir / "postgres" / "postmaster.pid").read_text().split()[0])

        made = trainjobs("keys", "create", "--project", "local", env=env)
        assert made.returncode == 0 and made.stdout.startswith("tj_"), made
        listed = trainjobs("keys", "list", "--project", "local", env=env)
        assert listed.returncode == 0 and made.stdout[:10] in listed.stdout, listed
        assert f"using the database of the `trainjobs up` running on {data_dir}" in listed.stderr
        quota = trainjobs("projects", "set-quota", "local", "--max-running-jobs", "4", env=env)
        assert quota.returncode == 0 and "0 of 4 running jobs" in quota.stdout, quota
        assert trainjobs("db", "upgrade", "--data-dir", str(data_dir), env=env).returncode == 0
        eventually(lambda: postmasters(root) == {server}, 30, lambda: f"{postmasters(root)}: only up's server, {server}")
    finally:
        up.send_signal(signal.SIGINT)
        assert up.wait(scaled(60)) == 0, log.read_text()

    listed = trainjobs("keys", "list", "--project", "local", "--data-dir", str(data_dir), env=env)
    assert listed.returncode == 0 and made.stdout[:10] in listed.stdout, listed
    assert f"the deployment in {data_dir} is stopped: its database runs for this command only" in listed.stderr
    revoked = trainjobs("keys", "revoke", made.stdout[:10], "--data-dir", str(data_dir), env=env)
    assert revoked.returncode == 0 and "revoked" in revoked.stdout, revoked
    eventually(lambda: not postmasters(root), 30, lambda: f"no server left: {postmasters(root)}")
    assert not (data_dir / "postgres" / "postmaster.pid").exists()


def test_a_database_started_for_a_verb_is_stopped_when_its_start_is_interrupted(home, monkeypatch):
    # Ctrl-C once the server is up but before the verb has its URL (pg_ctl's session keeps the server
    # from the Ctrl-C): the verb's own clean-up must still stop it.
    from stack import embedded
    from stack.deployment import admin_database

    root, env = home
    postgres = root / "data" / "postgres"
    embedded.start_embedded_postgres(postgres)
    embedded.stop_embedded_postgres(postgres)  # a stopped deployment's database
    for name in ("TRAINJOBS_DATABASE_URL", "TRAINJOBS_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRAINJOBS_HOME", env["TRAINJOBS_HOME"])

    def interrupted(*_: object) -> None:
        assert postmasters(root), "the server is up when the interrupt comes"
        raise KeyboardInterrupt

    monkeypatch.setattr(embedded, "_ensure_database", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with admin_database(root / "data", True, lambda _: None):
            pass
    assert not postmasters(root) and not (postgres / "postmaster.pid").exists()


def test_a_database_started_for_a_verb_runs_under_the_data_dir_s_lock(home, monkeypatch):
    # An `up` starting on the data dir meanwhile waits for the verb, then finds the server stopped and
    # starts it as its own (else it took the verb's for someone else's, never to stop it, and the verb
    # stopped it under it).
    from stack import embedded
    from stack.deployment import admin_database
    from stack.lifetime import LOCK_FILE

    root, env = home
    data_dir = root / "data"
    embedded.start_embedded_postgres(data_dir / "postgres")
    embedded.stop_embedded_postgres(data_dir / "postgres")
    for name in ("TRAINJOBS_DATABASE_URL", "TRAINJOBS_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRAINJOBS_HOME", env["TRAINJOBS_HOME"])

    def lock_is_free() -> bool:
        fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        finally:
            os.close(fd)

    with admin_database(data_dir, True, lambda _: None):
        assert postmasters(root) and not lock_is_free()
    assert not postmasters(root) and lock_is_free()
