"""Where everything lives in trainjobs' bucket: the one module that builds those paths.

The worker, the agent on the accelerator machine and the API meet only through objects in the bucket,
so a path is a contract between processes (and versions): each is built here and nowhere else.

Layout of one job, `gs://BUCKET/jobs/<job id>/`:

    spec.json                 the validated spec plus the worker's plan (dataset manifest URI, attempt)
    status.json               the chief agent's state: starting|running|succeeded|failed, heartbeat, progress,
                              runtime choices (strategy, replicas, precision, batch, lr), error
    status-<task>.json        the same, from each other host of a multi-host machine
    metrics.json              per-epoch metrics so far (rewritten each epoch)
    control.json              the worker's stop request to the agents (trainjobs/stop_request.py)
    logs/agent-<attempt>-<task>.log
    checkpoints/              tf.train.Checkpoint files, mirrored from the agent's disk
    tensorboard/              TensorBoard event files
    channels/<name>/          a program's channels, copied there by staging as they are (worker/staging_channels.py)
    cluster/attempt-<N>.json  the hosts of a multi-VM attempt, for their TF_CONFIG (worker/gcp/compute.py)
    _credentials/storage-token.json  the job's current storage token on cloud VMs (worker/gcp/job_tokens.py)
    artifacts/manifest.json   every artifact: path, size, sha256 (written last)
    artifacts/saved_model/    artifacts/model.tflite  artifacts/metrics.json  artifacts/history.json

Datasets live apart from jobs, content-addressed: `gs://BUCKET/datasets/<sha256>/manifest.json` and
`.../shards/*.tfrecord`. Uploads: `gs://BUCKET/uploads/<project id>/<sha256>/<file>` (trainjobs/uploads.py),
streamed first to `uploads/.incoming/`. The agent's wheel: `gs://BUCKET/agent/<sha256>/<wheel>`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_BUCKET = "trainjobs-local"

# The bucket's top-level prefixes.
JOBS = "jobs"
DATASETS = "datasets"
UPLOADS = "uploads"
INCOMING = f"{UPLOADS}/.incoming"  # never a project id (those are UUIDs), so never anyone's upload
AGENT_WHEELS = "agent"

# Names within a job directory that more than one process agrees on.
SPEC = "spec.json"
STATUS = "status.json"
METRICS = "metrics.json"
CONTROL = "control.json"
LOGS = "logs"
CHECKPOINTS = "checkpoints"
TENSORBOARD = "tensorboard"
CHANNELS = "channels"
CLUSTER = "cluster"
STORAGE_TOKEN = "_credentials/storage-token.json"
ARTIFACTS = "artifacts"
# ... and within its artifacts/ directory (the agent writes them there on its disk first).
ARTIFACT_MANIFEST = "manifest.json"
ARTIFACT_METRICS = "metrics.json"
ARTIFACT_HISTORY = "history.json"
# ... and within a staged dataset's directory.
DATASET_MANIFEST = "manifest.json"
DATASET_SHARDS = "shards"


def bucket_name() -> str:
    return os.environ.get("TRAINJOBS_BUCKET", DEFAULT_BUCKET)


def _bucket_uri(bucket: str | None) -> str:
    return f"gs://{bucket or bucket_name()}"


@dataclass(frozen=True)
class JobPaths:
    """The `gs://` URIs of one job's directory (see the module docstring)."""

    root: str  # gs://bucket/jobs/<id>

    @classmethod
    def for_job(cls, job_id: str, bucket: str | None = None) -> JobPaths:
        return cls(f"{_bucket_uri(bucket)}/{JOBS}/{job_id}")

    @classmethod
    def of(cls, job_dir: str) -> JobPaths:
        """The paths of a job directory handed over as text (`--job-dir`, a MachineRequest's)."""
        return cls(job_dir.rstrip("/"))

    def beside(self, job_id: str) -> JobPaths:
        """Another job's directory in the same bucket (a distillation's teacher: the student's boundary
        and its agent both find the teacher's artifacts here)."""
        return JobPaths(f"{self.root.rsplit('/', 1)[0]}/{job_id}")

    def key(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    @property
    def spec(self) -> str:
        return self.key(SPEC)

    @property
    def status(self) -> str:
        """The chief's status (host 0); `status_of` names every host's."""
        return self.key(STATUS)

    def status_of(self, task_index: int) -> str:
        """Only the chief owns status.json; the other hosts report beside it so the worker can see them."""
        return self.status if task_index == 0 else self.key(f"status-{task_index}.json")

    @property
    def metrics(self) -> str:
        return self.key(METRICS)

    @property
    def control(self) -> str:
        return self.key(CONTROL)

    @property
    def logs(self) -> str:
        return self.key(LOGS)

    def log(self, attempt: int, task_index: int) -> str:
        return f"{self.logs}/{log_name(attempt, task_index)}"

    @property
    def checkpoints(self) -> str:
        return self.key(CHECKPOINTS)

    @property
    def tensorboard(self) -> str:
        return self.key(TENSORBOARD)

    def channel(self, name: str) -> str:
        """The folder of a program's channel `name` (program.channels)."""
        return self.key(f"{CHANNELS}/{name}")

    def cluster(self, attempt: int) -> str:
        return self.key(f"{CLUSTER}/attempt-{attempt}.json")

    @property
    def storage_token(self) -> str:
        return self.key(STORAGE_TOKEN)

    @property
    def artifacts(self) -> str:
        return self.key(ARTIFACTS)

    def artifact(self, rel: str) -> str:
        """One artifact, by its path relative to artifacts/ (as the manifest lists it)."""
        return f"{self.artifacts}/{rel}"

    @property
    def artifact_manifest(self) -> str:
        return self.artifact(ARTIFACT_MANIFEST)

    @property
    def final_metrics(self) -> str:
        return self.artifact(ARTIFACT_METRICS)


def log_name(attempt: int, task_index: int) -> str:
    """The name of one agent's log object under logs/: one per attempt and host."""
    return f"agent-{attempt}-{task_index}.log"


def within_job(key: str) -> str | None:
    """'jobs/<id>/status.json' (an object's key in the bucket) -> 'status.json': the name its job's owner
    knows it by; None for a key outside any job directory."""
    parts = key.split("/", 2)
    return parts[2] if len(parts) == 3 and parts[0] == JOBS else None


def dataset_uri(sha256: str, bucket: str | None = None) -> str:
    return f"{_bucket_uri(bucket)}/{DATASETS}/{sha256}"


def dataset_manifest(dataset: str) -> str:
    """The manifest of the staged dataset at `dataset` (a dataset_uri)."""
    return f"{dataset.rstrip('/')}/{DATASET_MANIFEST}"


def dataset_file(dataset: str, rel: str) -> str:
    """A file of a staged dataset, by its path relative to the dataset (as the manifest lists its shards)."""
    return f"{dataset.rstrip('/')}/{rel}"


def agent_wheel_uri(bucket: str, sha256: str, wheel_name: str) -> str:
    """Where a version of the agent's wheel is kept, addressed by its content (worker/gcp/bootstrap.py)."""
    return f"gs://{bucket}/{AGENT_WHEELS}/{sha256}/{wheel_name}"
