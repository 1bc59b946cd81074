"""The test suite's agent fork server (tests/support/agent_forker.py) stands in for `python -m agent`
in its own process: what start_agent hands back must say what Popen said of the same agent."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import pytest

from tests.support import scaled
from tests.support.agent import REPO, ForkedAgent, agent_env, start_agent

pytestmark = pytest.mark.tf


def test_a_forked_agent_exits_and_says_what_a_process_of_its_own_says(bucket: str) -> None:
    job_dir = f"gs://{bucket}/jobs/no-such-job"
    forked = start_agent(job_dir)
    assert isinstance(forked, ForkedAgent)
    out, _ = forked.communicate(timeout=scaled(120))
    alone = subprocess.run([sys.executable, "-m", "agent", "--job-dir", job_dir], cwd=REPO, env=agent_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=scaled(240))
    assert forked.returncode == alone.returncode != 0
    last = alone.stdout.decode().strip().splitlines()[-1]
    assert last in out.decode(), (last, out.decode()[-2000:])


def test_a_killed_forked_agent_reports_the_signal_as_popen_does(bucket: str) -> None:
    with socket.socket() as silent:  # storage that accepts and never answers: the agent waits on it
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        agent = start_agent(f"gs://{bucket}/jobs/waiting", STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{silent.getsockname()[1]}")
        silent.settimeout(scaled(120))
        held, _ = silent.accept()  # its first storage request, never answered
        assert agent.poll() is None
        agent.kill()
        assert agent.wait(timeout=scaled(30)) == -signal.SIGKILL
        assert agent.poll() == -signal.SIGKILL
        agent.kill()  # an ended agent is not signalled again (its pid may name another process by now)
        held.close()
