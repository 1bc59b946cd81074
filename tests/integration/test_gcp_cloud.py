"""What the Google Cloud provisioners share: configuration, the agent's wheel and startup script."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from io import BytesIO
from pathlib import Path
from typing import Any


from trainjobs import storage
from trainjobs.job_paths import agent_wheel_uri
from worker.gcp.bootstrap import build_agent_wheel, startup_script, upload_agent_wheel


def test_the_agent_wheel_is_the_same_bytes_for_the_same_code() -> None:
    assert build_agent_wheel() == build_agent_wheel()


def test_the_agent_wheel_holds_the_agent_and_its_dependencies_but_not_tensorflow() -> None:
    name, data = build_agent_wheel()
    with zipfile.ZipFile(BytesIO(data)) as wheel:
        files = set(wheel.namelist())
        metadata = wheel.read(next(f for f in files if f.endswith(".dist-info/METADATA"))).decode()
    assert {"agent/__main__.py", "agent/watchdog.py", "trainjobs/spec/__init__.py", "trainjobs/spec/derived.py",
            "trainjobs/stop_request.py"} <= files
    assert not any(f.startswith(("service/", "stack/", "worker/", "migrations/", "trainjobs/client/")) for f in files)
    assert "Requires-Dist: google-cloud-storage" in metadata and "Requires-Dist: numpy" in metadata
    # the client's dependencies stay off the VM
    assert not any(f"Requires-Dist: {name}" in metadata for name in ("click", "rich", "pyyaml"))
    assert "tensorflow" not in metadata.lower()


def test_the_agent_wheel_installs_with_pip_and_imports(tmp_path: Path) -> None:
    name, data = build_agent_wheel()
    (tmp_path / name).write_bytes(data)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target",
                    str(tmp_path / "site"), str(tmp_path / name)], check=True, timeout=300)
    probe = subprocess.run([sys.executable, "-c", "import agent.job, trainjobs.spec; print(agent.job.__file__)"],
                           env={"PYTHONPATH": str(tmp_path / "site")}, cwd=tmp_path, capture_output=True, text=True,
                           timeout=120)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.startswith(str(tmp_path / "site"))


def test_the_wheel_is_uploaded_once_under_its_sha256(bucket: str) -> None:
    uri = upload_agent_wheel(bucket)
    assert uri == upload_agent_wheel(bucket)
    import hashlib

    name, data = build_agent_wheel()
    assert uri == agent_wheel_uri(bucket, hashlib.sha256(data).hexdigest(), name)
    assert storage.blob(uri).download_as_bytes() == data


def test_the_startup_script_is_valid_bash_that_runs_the_agent_for_the_job(tmp_path: Path) -> None:
    script = startup_script("gs://b/jobs/j'1", agent_wheel_uri("b", "abc", "trainjobs-0.1.0-py3-none-any.whl"))
    (tmp_path / "s.sh").write_text(script)
    subprocess.run(["bash", "-n", str(tmp_path / "s.sh")], check=True)
    assert "-m agent --job-dir \"$JOB_DIR\"" in script
    assert "JOB_DIR='gs://b/jobs/j'\"'\"'1'" in script  # quoted: a job dir cannot inject shell


def test_a_gcp_worker_without_its_configuration_says_which_variable_is_missing(database_url: str, gcs_emulator: Any,
                                                                               tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINJOBS_GCP_")}
    env.update(TRAINJOBS_DATABASE_URL=database_url, TRAINJOBS_HOME=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "stack.cli", "worker", "--provisioner", "gcp", "--data-dir", str(tmp_path)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "TRAINJOBS_GCP_PROJECT is not set" in r.stderr
