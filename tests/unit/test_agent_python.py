"""The agent's wheel runs on Python 3.10: the system Python of the Cloud TPU VM runtime images
(tpu-vm-tf-*, Ubuntu 22.04) and of the Deep Learning VM images, which the startup script installs the
wheel into (worker/gcp/bootstrap.py). The server stays on 3.11+.

No Python 3.10 interpreter exists on the machines these tests run on, and none can be downloaded (only
package registries are reachable), so the wheel is checked statically, file by file, exactly as it ships:
- vermin (its rules know which stdlib names, keywords and syntax each version added) with target 3.10,
  evaluating annotations as if at run time: `from __future__ import annotations` keeps most of them
  strings, but pydantic evaluates its models' field annotations when the class is made;
- the 3.10 grammar (`ast.parse(..., feature_version=(3, 10))`).
Each check is first shown to refuse a 3.11-only snippet, so a wrong flag cannot make it pass everything.
What static checks cannot see (a 3.11 behaviour change behind the same name) is noted where it matters,
e.g. trainjobs/str_enum.py, whose parity with enum.StrEnum is tested here.
"""

from __future__ import annotations

import ast
import enum
import json
import os
import subprocess
import sys
import zipfile
from io import BytesIO
from pathlib import Path
from typing import Any, cast

import pytest
from pydantic import BaseModel

from tests.support import scaled
from trainjobs.job_paths import JobPaths, agent_wheel_uri
from trainjobs.messages import AgentState
from trainjobs.states import JobStatus
from trainjobs.str_enum import StrEnum
from trainjobs.vm_metadata import HOST_KEY
from worker.gcp.bootstrap import build_agent_wheel, startup_script

TARGET = (3, 10)
ELEVEN_ONLY = {
    "datetime.UTC": "from datetime import UTC\nprint(UTC)\n",
    "enum.StrEnum": "import enum\nclass S(enum.StrEnum):\n    A = 'a'\n",
    "tomllib": "import tomllib\n",
    "typing.Self": "from typing import Self\n",
    "asyncio.timeout": "import asyncio\nasync def f():\n    async with asyncio.timeout(1):\n        pass\n",
    "except*": "try:\n    pass\nexcept* ValueError:\n    pass\n",
    "a pydantic field's annotation": "from __future__ import annotations\nimport typing\nfrom pydantic import BaseModel\n"
                                     "class M(BaseModel):\n    parent: typing.Self | None = None\n",
}


@pytest.fixture(scope="module")
def wheel_sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel's Python files, unpacked as they ship."""
    root = tmp_path_factory.mktemp("agent-wheel")
    _, data = build_agent_wheel()
    with zipfile.ZipFile(BytesIO(data)) as wheel:
        wheel.extractall(root, [n for n in wheel.namelist() if n.endswith(".py")])
    return root


def _vermin(*paths: Path) -> subprocess.CompletedProcess[str]:
    # --no-parse-comments: a `# novm` comment cannot quietly exempt a line.
    return subprocess.run(
        [sys.executable, "-c", "import sys; from vermin import main; sys.exit(main())",
         f"--target={TARGET[0]}.{TARGET[1]}-", "--violations", "--eval-annotations", "--no-tips",
         "--no-config-file", "--no-parse-comments", "--processes=1", *map(str, paths)],
        capture_output=True, text=True, timeout=scaled(300))


def _py_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


@pytest.mark.parametrize("feature", sorted(ELEVEN_ONLY))
def test_the_checks_refuse_code_that_needs_python_3_11(tmp_path: Path, feature: str) -> None:
    source = tmp_path / "probe.py"
    source.write_text(ELEVEN_ONLY[feature])
    if feature == "except*":  # a grammar change: the parser's business
        with pytest.raises(SyntaxError):
            ast.parse(source.read_text(), feature_version=TARGET)
    else:
        found = _vermin(source)
        assert found.returncode != 0, found.stdout + found.stderr


def test_the_wheel_holds_the_agent_and_the_core(wheel_sources: Path) -> None:
    shipped = {str(p.relative_to(wheel_sources)) for p in _py_files(wheel_sources)}
    assert {"agent/__main__.py", "trainjobs/messages.py", "trainjobs/str_enum.py"} <= shipped
    assert not any(f.startswith(("worker/", "trainjobs/client/")) for f in shipped)


def test_no_file_in_the_agent_wheel_needs_more_than_python_3_10(wheel_sources: Path) -> None:
    found = _vermin(*_py_files(wheel_sources))
    assert found.returncode == 0, found.stdout + found.stderr


@pytest.mark.parametrize("name", ["trainjobs", "agent"])
def test_every_file_in_the_agent_wheel_parses_with_the_python_3_10_grammar(wheel_sources: Path, name: str) -> None:
    files = _py_files(wheel_sources / name)
    assert files
    for path in files:
        ast.parse(path.read_text(), filename=str(path.relative_to(wheel_sources)), feature_version=TARGET)


def test_the_wheel_says_it_installs_on_python_3_10() -> None:
    _, data = build_agent_wheel()
    with zipfile.ZipFile(BytesIO(data)) as wheel:
        metadata = wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    assert "Requires-Python: >=3.10\n" in metadata


# --- our StrEnum behaves as enum.StrEnum wherever a member is written, compared or parsed ----------

@pytest.mark.parametrize("ours", [AgentState, JobStatus])
def test_the_message_enums_write_and_compare_as_enum_strenum_does(ours: type[StrEnum]) -> None:
    theirs: Any = cast(Any, enum.StrEnum)(ours.__name__, {m.name: m.value for m in ours})

    class Ours(BaseModel):
        state: ours  # type: ignore[valid-type]

    class Theirs(BaseModel):
        state: theirs

    for member in ours:
        twin = theirs[member.name]
        assert isinstance(member, str) and member == twin == member.value and hash(member) == hash(twin)
        assert (str(member), f"{member}", f"{member:>12}", "%s" % member, repr(str(member))) == \
               (str(twin), f"{twin}", f"{twin:>12}", "%s" % twin, repr(str(twin)))
        assert json.dumps({"s": member, member: 1}) == json.dumps({"s": twin, twin: 1})
        assert ours(member.value) is member and ours(str(twin)) is member
        assert Ours(state=member).model_dump_json() == Theirs(state=twin).model_dump_json()
        assert Ours.model_validate_json(Theirs(state=twin).model_dump_json()).state is member
    assert Ours.model_json_schema()["$defs"][ours.__name__]["enum"] == \
           Theirs.model_json_schema()["$defs"][ours.__name__]["enum"]


# --- the install step of the startup script, on an image whose TensorFlow came with it ---------------

@pytest.mark.parametrize("image_tensorflow", ["tensorflow-tpu", "tensorflow", None])
def test_the_startup_script_installs_the_wheel_within_the_bounds_of_the_images_tensorflow(
        tmp_path: Path, image_tensorflow: str | None) -> None:
    """pip is asked for the wheel and for the image's own TensorFlow distribution at its installed version,
    so the agent's dependencies are resolved against TensorFlow's bounds instead of upgraded under it."""
    image = tmp_path / "image-site-packages"  # the VM image's Python: a TensorFlow distribution, or none
    (image / "tensorflow").mkdir(parents=True)
    (image / "tensorflow" / "__init__.py").write_text("")
    if image_tensorflow is not None:
        info = image / f"{image_tensorflow.replace('-', '_')}-2.18.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {image_tensorflow}\nVersion: 2.18.0\n"
                                       "Requires-Dist: protobuf<6.0.0dev,>=3.20.3\n")
        (info / "RECORD").write_text("tensorflow/__init__.py,,\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    # python: the image's interpreter (no site-packages but the image's); `-m` calls are only recorded.
    (bin_dir / "python").write_text(f'#!/bin/bash\nif [ "$1" = -m ]; then echo "$*" >> {calls}; exit 0; fi\n'
                                    f'PYTHONPATH={image} exec {sys.executable} -S "$@"\n')
    (bin_dir / "gcloud").write_text('#!/bin/bash\n: > "$4/trainjobs-0.1.0-py3-none-any.whl"\n')  # storage cp URI DIR/
    (bin_dir / "curl").write_text(f'#!/bin/bash\ncase "${{@: -1}}" in */{HOST_KEY}) echo 0;; *) exit 22;; esac\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    job_dir = JobPaths.for_job("j1", "b").root
    script = startup_script(job_dir, agent_wheel_uri("b", "abc", "trainjobs-0.1.0-py3-none-any.whl"))
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "TRAINJOBS_PYTHON": str(bin_dir / "python"),
           "TMPDIR": str(tmp_path)}
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=scaled(60))
    assert out.returncode == 0, out.stderr
    install, run = calls.read_text().splitlines()
    pinned = [] if image_tensorflow is None else [f"{image_tensorflow}==2.18.0"]
    assert install.split()[:4] == ["-m", "pip", "install", "--quiet"]
    assert install.split()[4].endswith("/trainjobs-0.1.0-py3-none-any.whl") and install.split()[5:] == pinned
    assert run == f"-m agent --job-dir {job_dir} --task-index 0"
