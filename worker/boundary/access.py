"""What one job's code may reach in storage: its dataset and model code (read), a distillation's
teacher's artifacts (read), its own job directory (read and write), nothing else.

One boundary, two enforcers: on Google Cloud it becomes a Credential Access Boundary on the
downscoped token the worker mints for the job (`worker/boundary/tokens.py`); against the local emulator,
which checks nothing, the job's storage guard (`worker/boundary/storage_guard.py`) answers 403 outside it.
The driver computes it (`job_boundary`) from what the job cannot write and hands it to the
provisioner in the MachineRequest, at create and on adoption alike.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from trainjobs import storage
from trainjobs.job_paths import DATASETS, JobPaths, dataset_manifest
from trainjobs.messages import AgentAssignment
from trainjobs.spec import JobSpec

_MODULE_FILES = (".py", ".zip", ".tar.gz", ".tgz")
_STAGED = re.compile(rf"{DATASETS}/[0-9a-f]{{64}}/?")  # job_paths.dataset_uri: only staging writes under datasets/
MAX_RULES = 10  # a Credential Access Boundary holds at most 10 rules
MAX_EXPRESSION = 2048  # characters in one rule's condition


@dataclass(frozen=True)
class Scope:
    """Objects in one bucket: everything under `key` when it ends in '/', else that one object."""

    bucket: str
    key: str

    @classmethod
    def from_uri(cls, uri: str, *, directory: bool) -> Scope:
        bucket, key = storage.split_uri(uri)
        return cls(bucket, key.rstrip("/") + "/" if directory else key)

    @property
    def is_directory(self) -> bool:
        return self.key.endswith("/")

    def holds(self, bucket: str, name: str) -> bool:
        return bucket == self.bucket and (name == self.key or (self.is_directory and name.startswith(self.key)))

    def covers_listing(self, bucket: str, prefix: str) -> bool:
        """A listing by `prefix` returns only objects inside this directory (a single object is read,
        never listed: a listing by its name would also show any object whose name extends it)."""
        return self.is_directory and self.holds(bucket, prefix)


@dataclass(frozen=True)
class JobBoundary:
    job_id: str
    read: tuple[Scope, ...]  # read-only: the dataset, the model code
    write: tuple[Scope, ...]  # read and write: the job's own directory

    def can_read(self, bucket: str, name: str) -> bool:
        return any(s.holds(bucket, name) for s in self.read + self.write)

    def can_list(self, bucket: str, prefix: str) -> bool:
        return any(s.covers_listing(bucket, prefix) for s in self.read + self.write)

    def can_write(self, bucket: str, name: str) -> bool:
        return any(s.holds(bucket, name) for s in self.write)

    def to_json(self) -> str:
        return json.dumps({"job_id": self.job_id, "read": [[s.bucket, s.key] for s in self.read],
                           "write": [[s.bucket, s.key] for s in self.write]})

    @classmethod
    def from_json(cls, text: str) -> JobBoundary:
        raw = json.loads(text)
        return cls(raw["job_id"], tuple(Scope(*s) for s in raw["read"]), tuple(Scope(*s) for s in raw["write"]))


def boundary_for(assignment: AgentAssignment, job_dir: str, dataset_manifest: dict[str, Any] | None) -> JobBoundary:
    """The boundary of one attempt: its job directory, its staged dataset (and the TFRecord shards a
    dataset used in place names, wherever they are), its uploaded model code."""
    read = []
    if assignment.dataset_uri.startswith("gs://"):
        read.append(Scope.from_uri(assignment.dataset_uri, directory=True))
    for split in (dataset_manifest or {}).get("splits", {}).values():
        read += [Scope.from_uri(s, directory=False) for s in split.get("shards", []) if s.startswith("gs://")]
    module = assignment.spec.code[1] if assignment.spec.code is not None else None
    if module and module.startswith("gs://"):
        # A .py file or an archive is one object; anything else was uploaded as a package directory.
        read.append(Scope.from_uri(module, directory=not module.endswith(_MODULE_FILES)))
    distillation = assignment.spec.training.distillation
    if distillation is not None and job_dir.startswith("gs://"):
        # The teacher's artifacts and nothing else of it (not its checkpoints, spec or logs), read-only. Its
        # id comes from the stored spec, which submit and staging checked is a finished job of this project
        # (service/db/teachers.py), and is a UUID (trainjobs/spec/training.py): no path can hide in it.
        teacher = JobPaths.of(job_dir).beside(distillation.teacher_job)
        read.append(Scope.from_uri(teacher.artifacts, directory=True))
    # A mem:// job directory (the in-memory cloud of tests) is no storage a token or guard governs.
    write = (Scope.from_uri(job_dir, directory=True),) if job_dir.startswith("gs://") else ()
    return JobBoundary(assignment.job_id, tuple(dict.fromkeys(read)), write)


def job_boundary(job_id: str, spec: JobSpec, dataset_uri: str | None, job_dir: str) -> JobBoundary:
    """A job's boundary from what its code cannot touch: the job's row (its spec, and the dataset URI
    staging recorded there) and that dataset's manifest, which only the worker writes (datasets/ is in
    no job's write scope, and the API writes only uploads/). The same at create and on adoption: a
    spec.json or a manifest the job wrote in its own directory, or a machine's metadata, never
    widens it (issue 18, finding 1)."""
    manifest = None
    if dataset_uri is not None and dataset_uri.startswith("gs://"):
        _check_staged(job_id, dataset_uri, job_dir)
        manifest = storage.read_json(dataset_manifest(dataset_uri))
        if manifest is None:
            raise LookupError(f"job {job_id}: the staged dataset {dataset_uri} has no manifest")
    assignment = AgentAssignment(job_id=job_id, attempt=1, spec=spec, dataset_uri=dataset_uri or "")
    return boundary_for(assignment, job_dir, manifest)


def _check_staged(job_id: str, dataset_uri: str, job_dir: str) -> None:
    """Only the worker writes there: a staged dataset in the bucket of the job directories (stage.py)."""
    bucket, key = storage.split_uri(dataset_uri)
    if (job_dir.startswith("gs://") and bucket != storage.split_uri(job_dir)[0]) \
            or not _STAGED.fullmatch(key):
        raise ValueError(f"job {job_id}: {dataset_uri} is not a staged dataset (gs://BUCKET/datasets/<sha256>)")


# --- as a Credential Access Boundary (https://cloud.google.com/iam/docs/downscoping-short-lived-credentials) ---

READ_ROLE = "inRole:roles/storage.objectViewer"  # objects.get, objects.list
# objects.create/delete/get/list/update and multipart uploads; no IAM or ACL changes (objectAdmin has those).
WRITE_ROLE = "inRole:roles/storage.objectUser"


def access_boundary_rules(boundary: JobBoundary) -> list[dict[str, Any]]:
    """The `accessBoundaryRules` of the job's downscoped token: per bucket, one rule for what it may
    read and one for what it may write, each limited by a condition to the boundary's objects."""
    rules = []
    for role, scopes in ((READ_ROLE, boundary.read), (WRITE_ROLE, boundary.write)):
        for bucket in sorted({s.bucket for s in scopes}):
            expression = " || ".join(_clauses([s for s in scopes if s.bucket == bucket]))
            if len(expression) > MAX_EXPRESSION:
                raise ValueError(f"job {boundary.job_id}: the access condition on bucket {bucket} is "
                                 f"{len(expression)} characters, over the {MAX_EXPRESSION} allowed")
            rules.append({
                "availableResource": f"//storage.googleapis.com/projects/_/buckets/{bucket}",
                "availablePermissions": [role],
                "availabilityCondition": {"title": f"job {boundary.job_id}", "expression": expression},
            })
    if len(rules) > MAX_RULES:
        raise ValueError(f"job {boundary.job_id} reads from too many buckets for one access boundary")
    return rules


def _clauses(scopes: list[Scope]) -> list[str]:
    out = []
    for s in scopes:
        resource = _cel(f"projects/_/buckets/{s.bucket}/objects/{s.key}")
        if not s.is_directory:
            out.append(f"resource.name == {resource}")
            continue
        out.append(f"resource.name.startsWith({resource})")
        # A listing is checked against the bucket, with the prefix asked for as an attribute.
        out.append(f"api.getAttribute('storage.googleapis.com/objectListPrefix', '').startsWith({_cel(s.key)})")
    return out


def _cel(text: str) -> str:
    """A CEL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
