"""Our processes are started as `python -P -m MODULE` (trainjobs/module_command.py): a folder named like
one of our packages in the directory a process starts in is never imported instead of ours."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from trainjobs.module_command import module_command

ROOT = Path(__file__).resolve().parents[2]


def test_a_folder_named_agent_where_a_process_starts_is_not_run_as_the_agent(tmp_path: Path) -> None:
    # `trainjobs up` run in a project of the user's with an `agent/` package of its own.
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "__init__.py").write_text("")
    (tmp_path / "agent" / "__main__.py").write_text("print('the project folder agent ran')\n")
    plain = subprocess.run([module_command("agent")[0], "-m", "agent", "--help"], cwd=tmp_path,
                           capture_output=True, text=True)
    assert "the project folder agent ran" in plain.stdout  # what `python -m` did
    ours = subprocess.run(module_command("agent", "--help", cwd=tmp_path), cwd=tmp_path, capture_output=True, text=True)
    assert "the project folder agent ran" not in ours.stdout
    assert "--job-dir" in ours.stdout, ours.stdout + ours.stderr


def test_every_process_of_ours_is_started_through_module_command() -> None:
    # The agent's own `-m venv` and `-m pip` (agent/requirements.py) run in the job's work folder, and
    # name standard modules: left as they are.
    bare = []
    for folder in ("stack", "worker", "agent", "service", "trainjobs"):
        for path in (ROOT / folder).rglob("*.py"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r'sys\.executable,\s*"-m",\s*"(?!venv"|pip")', line) or \
                        re.search(r'sys\.executable,\s*"-m",\s*[A-Z_]+\b', line):
                    bare.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bare, "\n".join(bare)


def test_a_process_started_in_the_folder_holding_our_packages_keeps_it_on_its_path() -> None:
    # A checkout run without installing it (the images' test environments): that folder is ours.
    assert "-P" not in module_command("stack.emulator_process", cwd=ROOT)
    assert "-P" in module_command("stack.emulator_process", cwd=ROOT / "tests")
