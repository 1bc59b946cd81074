"""Every verb of the installed `trainjobs` command (the console script in the venv, as a user runs it) on
every state of a job, managed and program, against one real stack: the API, PostgreSQL, the GCS
emulator and a worker whose local machines run the real agent. Each job is brought to a state and asked
everything there (issue 37: `trainjobs metrics` failed on every job that had an epoch, and no test had
run it through the installed command on a finished job).

A queued job is one of project `held`, whose quota is 0; a running one is a program that waits for a
file the test writes; the others end by themselves."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support import eventually, scaled
from tests.support.browser import CHROMIUM, RECORD_CSP_VIOLATIONS, ms, needs_browser
from tests.support.jobs import make_key, module_jobs, wait_for_job
from tests.support.local import AGENT_JOB_S, local_stack_running
from trainjobs.config import save_client_config

pytestmark = pytest.mark.tf

TRAINJOBS = Path(sys.executable).with_name("trainjobs")  # the console script `pip install` made
DIGITS = {"dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp"}, "accelerator": {"type": "cpu"},
          "strategy": "default", "training": {"epochs": 3}, "labels": {"suite": "cli-verbs"}}

# A program that reports its first epoch, then trains on only once HOLD_FILE exists (or stops when asked).
HOLDING = '''
import os
import sys
import time
from pathlib import Path

from trainjobs import runtime as tj

print("epoch 1 done; holding until", os.environ["HOLD_FILE"], "exists", flush=True)
tj.report(epoch=1, epochs=2, loss=0.5, val_loss=0.625)
while not Path(os.environ["HOLD_FILE"]).exists():
    if tj.should_stop():
        print("asked to stop", flush=True)
        sys.exit(0)
    time.sleep(0.1)
tj.report(epoch=2, epochs=2, loss=0.25, val_loss=0.375)
'''

# A script that knows nothing of trainjobs (as one written for Vertex AI): no epochs, a file as its model.
PLAIN = '''
import os
from pathlib import Path

Path(os.environ["AIP_MODEL_DIR"], "model.txt").write_text("weights 0.5\\n")
print("saved", flush=True)
'''

FAILING = '''
def load(path):
    raise ValueError(f"the CSV {path} has no column 'price'")

print("loading", flush=True)
load("houses.csv")
'''


@dataclass
class Stack:
    api: httpx.Client  # project local's
    env: dict[str, str]  # the command's environment: TRAINJOBS_HOME with project local's config.json
    held: dict[str, str]  # the same, with project held's key (its quota is 0: its jobs stay QUEUED)
    tmp: Path

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.api.get(f"/v1/jobs/{job_id}").json())


def trainjobs(env: dict[str, str], *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([str(TRAINJOBS), *args], env=env, capture_output=True, text=True, timeout=scaled(AGENT_JOB_S))
    assert r.returncode == code, f"trainjobs {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr
    return r


def start(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([str(TRAINJOBS), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ended(proc: subprocess.Popen[str], code: int = 0) -> tuple[str, str]:
    out, err = proc.communicate(timeout=scaled(120))
    assert proc.returncode == code, (proc.returncode, out, err)
    return out, err


@pytest.fixture(scope="module")
def stack(database_url: str, api_url: str, gcs_emulator: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from service.db.quotas import set_quota
    from service.db.session import transaction

    assert TRAINJOBS.is_file(), f"{TRAINJOBS}: the project is not installed in this venv (pip install -e .)"
    tmp = tmp_path_factory.mktemp("cli-verbs")
    with module_jobs(database_url, api_url, "local") as (api, factory, monkey):
        held_key = make_key(factory, "held")
        with transaction(factory) as session:
            set_quota(session, "held", max_running_jobs=0)
        monkey.setenv("TRAINJOBS_HOME", str(tmp / "home"))
        save_client_config(api_url, api.headers["authorization"].split()[1])  # as `trainjobs up` does
        env = {k: v for k, v in os.environ.items() if k not in ("TRAINJOBS_API_URL", "TRAINJOBS_API_KEY")}
        with local_stack_running(database_url, tmp, slots=3):
            yield Stack(api, env, {**env, "TRAINJOBS_API_KEY": held_key}, tmp)


def spec_file(stack: Stack, name: str, **spec: Any) -> str:
    path = stack.tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, **spec}))
    return str(path)


def program(stack: Stack, name: str, code: str, **spec: Any) -> str:
    folder = stack.tmp / name
    folder.mkdir()
    (folder / "task.py").write_text(code)
    return spec_file(stack, name, program={"source": f"./{name}/", "entrypoint": "task.py", **spec.pop("program", {})},
                     accelerator={"type": "cpu"}, **spec)


def job_id_of(out: str) -> str:
    return out.split()[0]


def downloaded_match_the_listing(stack: Stack, job_id: str) -> list[str]:
    """`artifacts --download`: every file listed, each with the listing's sha256."""
    listing = json.loads(trainjobs(stack.env, "artifacts", job_id, "--json").stdout)["artifacts"]
    target = stack.tmp / f"artifacts-{job_id}"
    r = trainjobs(stack.env, "artifacts", job_id, "--download", str(target))
    assert f"downloaded {len(listing)} file(s)" in r.stderr + r.stdout
    for item in listing:
        assert hashlib.sha256((target / item["path"]).read_bytes()).hexdigest() == item["sha256"], item
    return [item["path"] for item in listing]


def test_a_managed_job_followed_to_its_end_answers_every_verb(stack: Stack) -> None:
    r = trainjobs(stack.env, "submit", spec_file(stack, "digits", **DIGITS), "--follow")
    job_id = job_id_of(r.stdout)
    lines = r.stdout.splitlines()
    # Every epoch, in order, all of them before the end is said (issue 37: the last shown was not the last).
    epochs = [i for i, line in enumerate(lines) if line.startswith("epoch ")]
    assert [lines[i].split()[1] for i in epochs] == ["1/3", "2/3", "3/3"], r.stdout
    succeeded = next(i for i, line in enumerate(lines) if re.match(r"\d\d:\d\d:\d\d  SUCCEEDED$", line))
    assert epochs[-1] < succeeded, r.stdout
    # The runtime and the final metrics readable: aligned lines, no dict printed whole.
    assert re.search(r"^runtime\s+strategy default, 1 replica, precision float32, global batch \d+", r.stdout, re.M)
    assert "{'" not in r.stdout and max(len(line) for line in lines) < 200, r.stdout

    status = trainjobs(stack.env, "status", job_id, "--events").stdout
    assert "SUCCEEDED (attempt 1)" in status and re.search(r"event .*RUNNING\s+-> SUCCEEDED", status), status
    assert json.loads(trainjobs(stack.env, "status", job_id, "-o", "json").stdout)["status"] == "SUCCEEDED"
    assert job_id in trainjobs(stack.env, "list", "--status", "succeeded", "--label", "suite=cli-verbs").stdout
    assert job_id not in trainjobs(stack.env, "list", "--status", "failed").stdout
    assert "epoch 3/3" in trainjobs(stack.env, "logs", job_id).stdout
    follow = trainjobs(stack.env, "logs", job_id, "--follow")
    assert "epoch 3/3" in follow.stdout and "-- job ended SUCCEEDED" in follow.stderr

    table = trainjobs(stack.env, "metrics", job_id).stdout.splitlines()
    assert table[0].split()[:3] == ["EPOCH", "LOSS", "ACCURACY"] and [row.split()[0] for row in table[1:]] == ["1", "2", "3"]
    records = [json.loads(line) for line in trainjobs(stack.env, "metrics", job_id, "--json").stdout.splitlines()]
    assert [rec["epoch"] for rec in records] == [1, 2, 3] and all(rec["val_accuracy"] > 0 for rec in records)
    follow = trainjobs(stack.env, "metrics", job_id, "--follow")
    assert [line.split()[1] for line in follow.stdout.splitlines()] == ["1", "2", "3"]
    assert follow.stderr.strip() == "-- job ended SUCCEEDED"

    r = trainjobs(stack.env, "cancel", job_id, code=1)
    assert "cannot be cancelled: job already SUCCEEDED" in r.stderr
    assert {"saved_model/saved_model.pb", "metrics.json", "history.json"} <= set(downloaded_match_the_listing(stack, job_id))


def test_a_running_program_job_answers_every_verb_then_is_cancelled(stack: Stack) -> None:
    hold = stack.tmp / "never"  # the program holds until cancelled
    r = trainjobs(stack.env, "submit", program(stack, "holding", HOLDING, program={"env": {"HOLD_FILE": str(hold)}},
                                               training={"epochs": 2}), "--json")
    job_id = json.loads(r.stdout)["id"]
    assert json.loads(r.stdout)["status"] == "QUEUED"
    eventually(lambda: "1  0.5000" in trainjobs(stack.env, "metrics", job_id).stdout, AGENT_JOB_S,
               lambda: f"the program reported epoch 1: {stack.job(job_id)}", every=0.5)

    assert "RUNNING (attempt 1)" in trainjobs(stack.env, "status", job_id).stdout
    assert job_id in trainjobs(stack.env, "list", "--status", "running").stdout
    assert "holding until" in trainjobs(stack.env, "logs", job_id).stdout
    r = trainjobs(stack.env, "artifacts", job_id)
    assert r.stdout == "" and "no artifacts: the job is RUNNING" in r.stderr
    metrics, logs = start(stack.env, "metrics", job_id, "--follow"), start(stack.env, "logs", job_id, "--follow")
    assert metrics.stdout is not None and metrics.stdout.readline().startswith("epoch 1  loss 0.5000  val loss 0.6250")

    r = trainjobs(stack.env, "cancel", job_id)
    assert job_id in r.stdout and re.search(r"CANCELL(ING|ED)", r.stdout), r.stdout
    out, err = ended(metrics)
    assert out == "" and err.strip() == "-- job ended CANCELLED"  # its first line was read above
    out, err = ended(logs)
    assert "holding until" in out and err.strip() == "-- job ended CANCELLED"

    assert "CANCELLED" in trainjobs(stack.env, "status", job_id, "--events").stdout
    assert trainjobs(stack.env, "metrics", job_id).stdout.splitlines()[1].split()[:2] == ["1", "0.5000"]  # kept
    assert "CANCELLED" in trainjobs(stack.env, "cancel", job_id).stdout  # idempotent
    assert "no artifacts: the job is CANCELLED" in trainjobs(stack.env, "artifacts", job_id).stderr


def test_a_program_job_followed_to_its_end_shows_every_epoch_before_the_end(stack: Stack) -> None:
    """A program's job ends as soon as it exits, a moment after its last report: the end was printed as
    soon as the job's status said so, its last epochs after it (issue 37)."""
    hold = stack.tmp / "released.hold"
    hold.touch()
    r = trainjobs(stack.env, "submit", program(stack, "released", HOLDING, program={"env": {"HOLD_FILE": str(hold)}},
                                               training={"epochs": 2}), "--follow")
    lines = r.stdout.splitlines()
    epochs = [i for i, line in enumerate(lines) if line.startswith("epoch ")]
    assert [lines[i].split()[1] for i in epochs] == ["1/2", "2/2"], r.stdout
    assert epochs[-1] < next(i for i, line in enumerate(lines) if re.match(r"\d\d:\d\d:\d\d  SUCCEEDED$", line))
    assert re.search(r"^runtime\s+strategy default, 1 replica, .*program task\.py", r.stdout, re.M), r.stdout


def test_a_failed_program_job_answers_every_verb(stack: Stack) -> None:
    r = trainjobs(stack.env, "submit", program(stack, "failing", FAILING), "--wait", code=1)
    job_id = job_id_of(r.stdout)
    status = trainjobs(stack.env, "status", job_id).stdout
    assert "FAILED (attempt 1)" in status and "ValueError: the CSV houses.csv has no column 'price'" in status
    assert job_id in trainjobs(stack.env, "list", "--status", "failed").stdout
    assert "Traceback" in trainjobs(stack.env, "logs", job_id).stdout
    assert trainjobs(stack.env, "metrics", job_id).stdout.strip() == "the program reported no epochs"
    assert trainjobs(stack.env, "metrics", job_id, "--follow").stderr.strip() == "-- job ended FAILED"
    assert "cannot be cancelled: job already FAILED" in trainjobs(stack.env, "cancel", job_id, code=1).stderr
    assert "no artifacts: the job is FAILED" in trainjobs(stack.env, "artifacts", job_id).stderr


def test_a_program_job_without_epochs_succeeds_and_says_so(stack: Stack) -> None:
    r = trainjobs(stack.env, "submit", program(stack, "plain", PLAIN), "--follow")
    job_id = job_id_of(r.stdout)
    assert "SUCCEEDED" in r.stdout and "epoch" not in r.stdout.replace("epochs", ""), r.stdout
    said = trainjobs(stack.env, "metrics", job_id).stdout.strip()
    assert said.startswith("the program reported no epochs"), said
    assert "model.txt" in downloaded_match_the_listing(stack, job_id)


def test_a_queued_job_answers_every_verb_then_is_cancelled(stack: Stack) -> None:
    spec = spec_file(stack, "held", **DIGITS)
    dry = trainjobs(stack.held, "submit", spec, "--dry-run").stdout
    assert "dry run: nothing was submitted" in dry
    job_id = job_id_of(trainjobs(stack.held, "submit", spec).stdout)
    status = trainjobs(stack.held, "status", job_id).stdout
    assert re.search(r"^status\s+QUEUED: project at quota: 0 of 0 running jobs$", status, re.M), status
    assert job_id in trainjobs(stack.held, "list", "--status", "queued").stdout
    assert trainjobs(stack.held, "logs", job_id).stdout == ""
    assert trainjobs(stack.held, "metrics", job_id).stdout.strip() == "no epochs finished yet (the job is QUEUED)"
    assert "no artifacts: the job is QUEUED" in trainjobs(stack.held, "artifacts", job_id).stderr
    logs, metrics = start(stack.held, "logs", job_id, "--follow"), start(stack.held, "metrics", job_id, "-f", "-o", "json")
    assert metrics.stdout is not None and json.loads(metrics.stdout.readline()) == {"event": "status", "status": "QUEUED"}

    assert "CANCELLED" in trainjobs(stack.held, "cancel", job_id).stdout  # a queued job ends at once
    assert ended(logs)[1].strip() == "-- job ended CANCELLED"
    assert json.loads(ended(metrics)[0].splitlines()[-1]) == {"event": "end", "status": "CANCELLED"}
    assert re.search(r"QUEUED -> CANCELLED\s+cancel requested by user", trainjobs(stack.held, "status", job_id, "--events").stdout)
    assert trainjobs(stack.held, "metrics", job_id).stdout.strip() == "no epoch finished: the job is CANCELLED"
    assert "CANCELLED" in trainjobs(stack.held, "cancel", job_id).stdout
    assert job_id not in trainjobs(stack.env, "list").stdout  # another project's


def test_sweeps_answer_every_verb_when_they_end_and_when_cancelled(stack: Stack) -> None:
    sweep = {"name": "lr-grid", "job": {**DIGITS, "training": {"epochs": 2}},
             "parameters": {"training.learning_rate": {"type": "categorical", "choices": [0.01, 0.003]}},
             "objective": {"metric": "val_accuracy"}, "algorithm": "grid", "parallel_trials": 2}
    path = stack.tmp / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    r = trainjobs(stack.env, "sweep", "submit", str(path), "--wait")
    sweep_id = r.stdout.split()[0]
    assert "2 complete" in r.stdout and re.search(r"^best\s+trial \d  val_accuracy 0\.\d+", r.stdout, re.M), r.stdout
    status = trainjobs(stack.env, "sweep", "status", sweep_id).stdout
    assert re.search(r"^status\s+SUCCEEDED", status, re.M) and len(re.findall(r"COMPLETE\s+0\.\d+", status)) == 2
    assert json.loads(trainjobs(stack.env, "sweep", "status", sweep_id, "--json").stdout)["status"] == "SUCCEEDED"
    assert re.search(rf"^{sweep_id}\s+lr-grid\s+SUCCEEDED\s+2/2", trainjobs(stack.env, "sweep", "list").stdout, re.M)
    r = trainjobs(stack.env, "sweep", "cancel", sweep_id)  # idempotent: an ended sweep stays as it is
    assert "SUCCEEDED" in r.stdout and "had already ended SUCCEEDED: nothing to cancel" in r.stderr, r.stderr

    path.write_text(yaml.safe_dump({**sweep, "name": "held-grid"}))
    held_id = trainjobs(stack.held, "sweep", "submit", str(path)).stdout.split()[0]
    assert "CANCELL" in trainjobs(stack.held, "sweep", "cancel", held_id).stdout
    eventually(lambda: re.search(r"^status\s+CANCELLED", trainjobs(stack.held, "sweep", "status", held_id).stdout, re.M),
               60, "the held sweep is CANCELLED")
    assert re.search(rf"^{held_id}\s+held-grid\s+CANCELLED", trainjobs(stack.held, "sweep", "list").stdout, re.M)


@needs_browser
def test_the_dashboard_shows_a_failed_programs_traceback_and_what_a_program_without_epochs_has(
        stack: Stack, api_url: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    failing = job_id_of(trainjobs(stack.env, "submit", program(stack, "failing-ui", FAILING)).stdout)
    plain = job_id_of(trainjobs(stack.env, "submit", program(stack, "plain-ui", PLAIN)).stdout)
    for job_id, status in ((failing, "FAILED"), (plain, "SUCCEEDED")):
        wait_for_job(stack.api, job_id, {status}, timeout=AGENT_JOB_S)
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1400})
            page.add_init_script(RECORD_CSP_VIOLATIONS)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{api_url}/ui/#/jobs/{failing}")
            # Where an `up` user finds the key (stack/cli.py: up writes it with save_client_config).
            hint = page.locator("#signin-up")
            expect(hint).to_contain_text("It made the project local and wrote a key for it to "
                                         "$TRAINJOBS_HOME/config.json (~/.trainjobs/config.json when TRAINJOBS_HOME "
                                         "is not set)")
            page.fill("#key", stack.api.headers["authorization"].split()[1])
            page.click("#signin-form button")

            expect(page.locator("#job-status")).to_have_text("FAILED", timeout=ms(10))
            error = page.locator("#job-error").inner_text()  # as a person sees it: its lines kept
            lines = error.splitlines()
            assert "Traceback (most recent call last):" in lines, error
            assert lines[-1] == "ValueError: the CSV houses.csv has no column 'price'", error
            expect(page.locator("#epochs-note")).to_have_text("The program reported no epochs.", timeout=ms(10))

            page.goto(f"{api_url}/ui/#/jobs/{plain}")
            expect(page.locator("#job-status")).to_have_text("SUCCEEDED", timeout=ms(10))
            expect(page.locator("#epochs-note")).to_contain_text("The program reported no epochs", timeout=ms(10))
            expect(page.locator("#final-metrics")).to_contain_text("the program reported none")
            expect(page.locator("#job-error")).to_be_hidden()
            expect(page.locator("#artifacts")).to_contain_text("model.txt", timeout=ms(10))
            errors += page.evaluate("window.cspViolations")
        finally:
            browser.close()
    assert errors == []
