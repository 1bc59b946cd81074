"""Issue 36, finding 9: a program's requirement that names its own URL (`name @ url`) is fetched by pip
on the job's machine, past every check of ours, so submit refuses it unless it is https:// to a host the
operator lists (TRAINJOBS_REQUIREMENT_URL_HOSTS) or file:// inside a folder the operator allows
(TRAINJOBS_HOST_DATA_DIRS); never another scheme, localhost or a private address. A 422 naming
`program.requirements.<i>`, through the real API; the agent checks the same again before pip runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.requirements import RequirementsError, install_requirements
from tests.support.tenancy import refusal
from trainjobs.source_rules import HOST_DATA_DIRS_ENV, REQUIREMENT_URL_HOSTS_ENV, DataAccessRules
from trainjobs.spec import ProgramSpec
from worker.ports import ProgramError
from worker.staging_adapter import check_program

WHEEL = "tjgreet-0.1-py3-none-any.whl"


@pytest.fixture
def program(api: httpx.Client, bucket: str) -> str:
    r = api.post("/v1/modules", files={"file": ("train.py", b"print('hi')\n")})
    assert r.status_code == 201, r.text
    return str(r.json()["module"])


def _spec(program: str, line: str) -> dict[str, Any]:
    return {"program": {"source": program, "requirements": ["six==1.16.0", line]}}


@pytest.mark.parametrize(("url", "reason"), [
    ("file:///etc/passwd", "host paths are not accepted by this deployment"),
    ("http://127.0.0.1:8080/" + WHEEL, "must be https:// with a host name"),
    ("git+ssh://10.0.0.1/repo.git", "must be https:// with a host name"),
    ("git+https://example.com/repo.git", "must be https:// with a host name"),
    ("https://10.0.0.1/" + WHEEL, "10.0.0.1 is not a public address"),
    ("https://169.254.169.254/" + WHEEL, "169.254.169.254 is not a public address"),  # the metadata server
    ("https://[::ffff:127.0.0.1]/" + WHEEL, "is not a public address"),
    ("https://localhost/" + WHEEL, "localhost is not a public address"),
    ("https://wheels.example.com/${TRAINJOBS_DATABASE_URL}/" + WHEEL, "filled in by pip from the machine's"),
    ("https://elsewhere.example.com/" + WHEEL, f"only from hosts the operator lists ({REQUIREMENT_URL_HOSTS_ENV})"),
])
def test_a_requirement_url_pip_may_not_fetch_is_refused_at_submit_naming_it(
        api: httpx.Client, program: str, monkeypatch: pytest.MonkeyPatch, url: str, reason: str) -> None:
    monkeypatch.setenv(REQUIREMENT_URL_HOSTS_ENV, "wheels.example.com")

    answer = refusal(api.post("/v1/jobs", json=_spec(program, f"tjgreet @ {url}")))

    assert answer["field"] == "program.requirements.1"
    assert reason in answer["reason"], answer["reason"]
    assert api.get("/v1/jobs").json()["jobs"] == []


def test_a_requirement_url_on_a_host_the_operator_lists_is_accepted(
        api: httpx.Client, program: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REQUIREMENT_URL_HOSTS_ENV, "pypi-mirror.internal, Wheels.Example.com")

    r = api.post("/v1/jobs", json=_spec(program, f"tjgreet @ https://wheels.example.com/{WHEEL}"))

    assert r.status_code == 201, r.text


def test_a_file_requirement_is_accepted_only_inside_a_folder_the_operator_allows(
        api: httpx.Client, program: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "wheels").mkdir()
    monkeypatch.setenv(HOST_DATA_DIRS_ENV, str(tmp_path / "wheels"))

    inside = api.post("/v1/jobs", json=_spec(program, f"tjgreet @ {(tmp_path / 'wheels' / WHEEL).as_uri()}"))
    climbing = api.post("/v1/jobs", json=_spec(program, f"tjgreet @ file://{tmp_path}/wheels/../secrets/{WHEEL}"))

    assert inside.status_code == 201, inside.text
    assert "not inside a directory this deployment allows" in refusal(climbing)["reason"]


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/" + WHEEL, "git+ssh://10.0.0.1/repo.git"])
def test_the_agent_refuses_before_pip_runs_what_submit_refuses(tmp_path: Path, url: str) -> None:
    """A job stored before the rule (its spec is read without the submit-only rules) meets it on the machine."""
    with pytest.raises(RequirementsError, match="must be https:// with a host name"):
        install_requirements([f"tjgreet @ {url}"], tmp_path / "scratch")
    assert not (tmp_path / "scratch").exists()  # no environment was made, pip never ran


def test_staging_holds_a_queued_job_to_the_requirement_hosts_the_operator_lists_now(tmp_path: Path) -> None:
    """A job admitted before its host left TRAINJOBS_REQUIREMENT_URL_HOSTS, or stored before the rule (the
    agent checks only what no operator may allow), fails at staging, before a machine is paid for."""
    source = tmp_path / "train.py"
    source.write_text("print('hi')\n")
    program = ProgramSpec(source=str(source),
                          requirements=["six==1.16.0", f"tjgreet @ https://wheels.example.com/{WHEEL}"])
    listed = DataAccessRules(host_dirs=(tmp_path.resolve(),), requirement_url_hosts=frozenset({"wheels.example.com"}))

    check_program(program, listed, "bucket", "project", tmp_path / "work")
    with pytest.raises(ProgramError, match=r"^program\.requirements\.1: .*only from hosts the operator lists"):
        check_program(program, DataAccessRules(host_dirs=listed.host_dirs), "bucket", "project", tmp_path / "work")
