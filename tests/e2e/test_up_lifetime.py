"""`trainjobs up` (the installed console script, with its own PostgreSQL and GCS emulator and local machines)
ends every process it started however it ends, and the job it was running is retried by the next `up`
(issue 37: an `up` stopped with SIGTERM and killed during its stop left a running job's storage guard for
good, and its stack.json).

What `up` started is found without asking it: every process whose command line, working directory or
output names the data dir (PostgreSQL, the emulator, guards, the zygote, agents, the job's program, the
lifeline), with all descendants of those and of `up` (the staging fork server, PostgreSQL's backends).
One job lives through three `up`s, one ending each way: SIGTERM then SIGKILL during its stop; SIGKILL;
SIGKILL of `up` and of its lifeline at once, which leaves the stack for `trainjobs down` to end."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import eventually, scaled
from tests.support.tmp import outside_pytest_tmp
from trainjobs.loopback import free_port

pytestmark = pytest.mark.tf

TRAINJOBS = Path(sys.executable).with_name("trainjobs")  # the console script `pip install` made
PROGRAM = "slow_program.py"
SLOW = 'import time\nprint("slow program started", flush=True)\ntime.sleep(3600)\n'


def _start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if stat[0] == "Z" else int(stat[19])


def _names(pid: int, marker: str) -> bool:
    try:
        if marker in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
            return True
        links = [os.readlink(f"/proc/{pid}/cwd")] + [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in (1, 2)]
    except OSError:
        return False
    return any(link.startswith(marker) for link in links)


def stack_processes(data_dir: Path, *roots: int) -> dict[int, tuple[int | None, str]]:
    """pid -> (start time, command line) of every live process of the stack in data_dir."""
    parents: dict[int, int] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    found = {pid for pid in parents if pid != os.getpid() and _names(pid, str(data_dir))} | set(roots)
    while more := {pid for pid, parent in parents.items() if parent in found} - found:
        found |= more
    out = {}
    for pid in found:
        if (started := _start_time(pid)) is not None:
            out[pid] = (started, Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    return out


def still_running(before: dict[int, tuple[int | None, str]]) -> list[str]:
    return [cmd for pid, (started, cmd) in before.items() if _start_time(pid) == started]


class Stack:
    """The data dir, TRAINJOBS_HOME and the job that outlives each `up`."""

    def __init__(self, root: Path, scratch: Path):
        self.data_dir, self.scratch = root / "data", scratch
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("TRAINJOBS_DATABASE_URL", "STORAGE_EMULATOR_HOST", "TRAINJOBS_BUCKET")}
        self.env.update(TRAINJOBS_HOME=str(scratch / "home"))
        self.ups = 0
        self.job_id = ""

    def up(self) -> subprocess.Popen[bytes]:
        self.ups += 1
        self.log = self.scratch / f"up-{self.ups}.log"
        with self.log.open("w") as out:
            proc = subprocess.Popen([str(TRAINJOBS), "up", "--port", str(free_port()), "--data-dir", str(self.data_dir)],
                                    env=self.env, stdout=out, stderr=out)

        def ready() -> bool:
            assert proc.poll() is None, self.log.read_text()
            return "\nready\n" in self.log.read_text()

        eventually(ready, 120, lambda: f"`up` said ready; its log: {self.log.read_text()}", every=0.2)
        return proc

    def cli(self, *args: str, cwd: Path | None = None) -> str:
        r = subprocess.run([str(TRAINJOBS), *args], env=self.env, cwd=cwd, capture_output=True, text=True,
                           timeout=scaled(180))
        assert r.returncode == 0, f"trainjobs {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
        return r.stdout

    def submit_slow_job(self) -> None:
        folder = self.scratch / "job"
        folder.mkdir()
        (folder / PROGRAM).write_text(SLOW)
        (folder / "job.yaml").write_text("name: slow\naccelerator: {type: cpu}\nlimits: {max_retries: 3}\n"
                                         f"program: {{source: {PROGRAM}}}\n")
        self.job_id = self.cli("submit", "job.yaml", cwd=folder).split()[0]

    def program_running(self, attempt: int) -> None:
        """Wait until the job's attempt `attempt` runs its program."""
        config = json.loads((self.scratch / "home" / "config.json").read_text())

        def running() -> bool:
            job = httpx.get(f"{config['api_url']}/v1/jobs/{self.job_id}", timeout=scaled(10),
                            headers={"authorization": f"Bearer {config['api_key']}"}).json()
            assert job["status"] not in ("FAILED", "SUCCEEDED", "CANCELLED"), job
            procs = stack_processes(self.data_dir).values()
            return job["attempt"] == attempt and any(PROGRAM in cmd and f"-a{attempt}" in cmd for _, cmd in procs)

        eventually(running, 240, f"attempt {attempt} of job {self.job_id} runs its program", every=0.5)

    def all_ended(self, before: dict[int, tuple[int | None, str]]) -> None:
        eventually(lambda: not still_running(before) and not stack_processes(self.data_dir), 120,
                   lambda: f"every process of the stack ended; still running: {still_running(before)}, "
                           f"{stack_processes(self.data_dir)}", every=0.5)
        assert not (self.data_dir / "stack.json").exists()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    root = outside_pytest_tmp("life")  # an embedded PostgreSQL's data dir (tests/support/tmp.py says why)
    made = Stack(root, tmp_path)
    try:
        yield made
    finally:
        subprocess.run([str(TRAINJOBS), "down", "--data-dir", str(made.data_dir), "--wait", "5"], env=made.env,
                       capture_output=True, timeout=scaled(180))
        shutil.rmtree(root, ignore_errors=True)


def test_up_ends_everything_it_started_however_it_ends_and_the_next_up_retries_the_job(stack: Stack) -> None:
    # 1. SIGTERM, and SIGKILL once it is stopping: its lifeline ends the rest.
    up = stack.up()
    stack.submit_slow_job()
    stack.program_running(attempt=1)
    before = stack_processes(stack.data_dir, up.pid)
    kinds = ("stack.lifeline", "stack.emulator_process", "postgres -D", "storage_guard", "agent.zygote", PROGRAM)
    assert all(any(kind in cmd for _, cmd in before.values()) for kind in kinds), before
    up.send_signal(signal.SIGTERM)
    eventually(lambda: "stopping:" in stack.log.read_text(), 60, "`up` began to stop")
    up.kill()
    up.wait()
    stack.all_ended(before)

    # 2. The next `up` retries the job at once (its lifeline handed the job back); SIGKILL ends it the same way.
    up = stack.up()
    stack.program_running(attempt=2)
    before = stack_processes(stack.data_dir, up.pid)
    up.kill()
    up.wait()
    stack.all_ended(before)

    # 3. `up` and its lifeline killed at once leave the stack running, job and all; `trainjobs down` ends it.
    up = stack.up()
    stack.program_running(attempt=3)
    before = stack_processes(stack.data_dir, up.pid)
    [lifeline] = [pid for pid, (_, cmd) in before.items() if "stack.lifeline" in cmd]
    os.kill(lifeline, signal.SIGKILL)
    up.kill()
    up.wait()
    assert any(PROGRAM in cmd for cmd in still_running(before))  # what nothing would end
    said = stack.cli("down", "--data-dir", str(stack.data_dir))
    assert "local machine" in said and "GCS emulator" in said and "embedded PostgreSQL" in said, said
    stack.all_ended(before)
