"""Getting the agent onto a cloud machine: the agent wheel and the startup script that installs and runs it.

The wheel holds the shared core (trainjobs/, less its client) and the agent (agent/): everything the
agent imports. We write it ourselves, with fixed timestamps, so the same sources give the same bytes: its
sha256 addresses it in the bucket (gs://BUCKET/agent/<sha256>/...), a worker builds and uploads it
once per version of the code, and every VM of that version installs the identical file.
"""

from __future__ import annotations

import base64
import hashlib
import io
import shlex
import tomllib
import zipfile
from functools import lru_cache
from pathlib import Path

from trainjobs import storage
from trainjobs.job_paths import STORAGE_TOKEN, agent_wheel_uri
from trainjobs.vm_metadata import HOST_KEY, MACHINE_KEY, METADATA_URL

REPO_ROOT = Path(__file__).resolve().parents[2]
AGENT_PACKAGES = ("trainjobs", "agent")
NOT_IN_THE_WHEEL = ("trainjobs/client",)  # the client: the VM has no use for it, nor for what it needs
EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip can hold: no build time leaks into the bytes

# The TPU runtime image and the Deep Learning VM images bring TensorFlow built for their accelerator;
# installing PyPI's would replace it.
NOT_INSTALLED_ON_VMS = ("tensorflow",)
# ... and their system Python is 3.10 (tpu-vm-tf-* on Ubuntu 22.04, the Deep Learning VM images), where the
# wheel is installed: the agent's files keep to 3.10 (tests/unit/test_agent_python.py), the server stays 3.11+.
AGENT_REQUIRES_PYTHON = ">=3.10"


def agent_requirements() -> list[str]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["optional-dependencies"]["train"]  # the core's and the agent's: not the client's
    return sorted({r for r in wanted if not r.lower().startswith(NOT_INSTALLED_ON_VMS)})


def _files() -> list[tuple[str, bytes]]:
    """(path in the wheel, bytes) of every source file the agent's wheel holds."""
    paths = [p for package in AGENT_PACKAGES for p in (REPO_ROOT / package).rglob("*.py")]
    return sorted((rel, p.read_bytes()) for p in paths if "__pycache__" not in p.parts
                  and not (rel := p.relative_to(REPO_ROOT).as_posix()).startswith(NOT_IN_THE_WHEEL))


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_agent_wheel() -> tuple[str, bytes]:
    """(file name, bytes) of a py3-none-any wheel of the agent: deterministic for the same sources."""
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    dist_info = f"trainjobs-{version}.dist-info"
    metadata = "Metadata-Version: 2.1\nName: trainjobs\nVersion: {}\nRequires-Python: {}\n{}".format(
        version, AGENT_REQUIRES_PYTHON, "".join(f"Requires-Dist: {r}\n" for r in agent_requirements()))
    wheel = "Wheel-Version: 1.0\nGenerator: trainjobs\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    entries = _files() + [(f"{dist_info}/METADATA", metadata.encode()), (f"{dist_info}/WHEEL", wheel.encode())]
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in entries) + f"{dist_info}/RECORD,,\n"
    entries.append((f"{dist_info}/RECORD", record.encode()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, EPOCH)
            info.external_attr = 0o644 << 16
            zf.writestr(info, data, zipfile.ZIP_DEFLATED)
    return f"trainjobs-{version}-py3-none-any.whl", out.getvalue()


@lru_cache(maxsize=8)
def upload_agent_wheel(bucket: str) -> str:
    """gs:// URI of this code's agent wheel, uploaded if the bucket lacks it. Once per process and bucket."""
    name, data = build_agent_wheel()
    uri = agent_wheel_uri(bucket, hashlib.sha256(data).hexdigest(), name)
    blob = storage.blob(uri)
    if not blob.exists():
        blob.upload_from_string(data, content_type="application/zip")
    return uri


# Prints "dist==version" for the distribution(s) that installed the `tensorflow` package (tensorflow,
# tensorflow-tpu, tensorflow-cpu, ...), nothing if none did. Python 3.10+, as on the images.
_IMAGE_TENSORFLOW = (
    'import importlib.metadata as m; '
    'print(*sorted({d + "==" + m.version(d) for d in m.packages_distributions().get("tensorflow", [])}))')


def startup_script(job_dir: str, wheel_uri: str, cluster_uri: str | None = None) -> str:
    """Runs as root on every host at boot. TRAINJOBS_SKIP_INSTALL and TRAINJOBS_METADATA_URL let the fake
    cloud run the same script on this machine (the agent from the checkout, its own metadata server).
    `cluster_uri`: a multi-host Compute Engine job, whose hosts wait there for their TF_CONFIG."""
    cluster = "" if cluster_uri is None else f"""# Several VMs train together: wait for the cluster the worker writes once every VM is RUNNING.
export TF_CONFIG="$("$PYTHON" -m agent.cluster --uri {shlex.quote(cluster_uri)} --task-index "$TASK")"
"""
    return f"""#!/bin/bash
# trainjobs agent bootstrap: install the agent, then run it for one job on this host.
set -euo pipefail
JOB_DIR={shlex.quote(job_dir)}
AGENT_WHEEL={shlex.quote(wheel_uri)}
PYTHON="${{TRAINJOBS_PYTHON:-python3}}"
if [ -z "${{TRAINJOBS_SKIP_INSTALL:-}}" ]; then
  WHEEL_DIR="$(mktemp -d)"
  gcloud storage cp "$AGENT_WHEEL" "$WHEEL_DIR/"
  # The wheel brings the agent's dependencies but not TensorFlow: the VM image has its own. pip resolves only
  # what it is asked for, so we name the image's TensorFlow distribution at its installed version too (nothing
  # is reinstalled): the agent's dependencies then keep within its bounds. Asked for the wheel alone, pip takes
  # the newest google-cloud-storage, whose protobuf (>=6.33) TensorFlow 2.18 refuses (<6), and upgrades it.
  IMAGE_TF="$("$PYTHON" -c {shlex.quote(_IMAGE_TENSORFLOW)})"
  "$PYTHON" -m pip install --quiet "$WHEEL_DIR"/*.whl $IMAGE_TF
fi
# Each host of a TPU slice (or VM of a multi-host GPU job) learns its own number from the metadata server.
METADATA="${{TRAINJOBS_METADATA_URL:-{METADATA_URL}}}"
TASK="$(curl -sf --retry 5 -H 'Metadata-Flavor: Google' "$METADATA/instance/attributes/{HOST_KEY}")"
# The job's own storage token (worker/gcp/job_tokens.py): the VM's account has no access to job data. The
# first one comes sealed to a key this host makes now and publishes as a guest attribute, so no token lies
# in metadata other VMs can read (worker/gcp/token_delivery.py); a machine named in its metadata waits for it.
if curl -sf --retry 5 -H 'Metadata-Flavor: Google' "$METADATA/instance/attributes/{MACHINE_KEY}" > /dev/null; then
  TOKEN_DIR="$(mktemp -d)"
  "$PYTHON" -m agent.first_token --metadata-url "$METADATA" --out "$TOKEN_DIR/storage-token.json"
  export TRAINJOBS_STORAGE_TOKEN_FILE="$TOKEN_DIR/storage-token.json"
  export TRAINJOBS_STORAGE_TOKEN_URI="$JOB_DIR/{STORAGE_TOKEN}"
fi
{cluster}exec "$PYTHON" -m agent --job-dir "$JOB_DIR" --task-index "$TASK"
"""
