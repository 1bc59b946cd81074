"""Which data and code a job may name: the rules the API applies at submit and the worker again at
staging (a job queued before a rule changed is held to the rule of the day it runs).

- Host paths and file:// are refused unless the operator lists directories in
  TRAINJOBS_HOST_DATA_DIRS (separated by os.pathsep). An allowed path is absolute and resolves,
  symlinks and '..' followed, inside one of them. A refusal reads the same whether the path exists
  or not: it must not tell anyone which host paths exist.
- In trainjobs' own bucket, uploads/<project>/ is that project's and jobs/<id>/ is the job's
  project's; datasets/ holds every project's staged data and the bucket root lists all of it. A job
  may name there only its own project's uploads and jobs, and one staged dataset by its content
  address (datasets/<sha256>/). Any other key of that bucket is refused: the worker stages with its
  own credentials and hands the data to the job, so naming an operator's object would read it as a
  confused deputy (issue 18, finding 4).
- Other buckets only when the operator lists them in TRAINJOBS_SOURCE_BUCKETS (comma-separated
  bucket names), for the same reason: the worker's credentials reach more than any one project should.
- URLs: https://; http:// only for hosts in TRAINJOBS_FETCH_ALLOW_HOSTS (comma-separated), which
  also exempts those hosts from the public-address rule. Submit can only judge literal addresses;
  the fetch (worker/staging/fetch.py) resolves every hop and checks what it connects to.
- A program's requirement that names its own URL (`name @ url`, issue 36 finding 9) is fetched by pip
  on the job's machine, which follows redirects and resolves names where no check of ours sees them. So
  such a line is refused unless it is https:// to a host the operator lists in
  TRAINJOBS_REQUIREMENT_URL_HOSTS (comma-separated host names), or file:// inside TRAINJOBS_HOST_DATA_DIRS
  (a local machine is the worker's host). Whatever the operator lists, never: another scheme (http://,
  git+ssh:// and every VCS, which run git), localhost or a literal private address, and `${` (pip fills
  it in from the machine's environment). A line that names no URL installs from the deployment's index.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from trainjobs import uploads
# The address rules are their own module: the spec checks requirement URLs with them, and this one
# reaches the storage client through uploads.
from trainjobs.addresses import is_public as is_public, literal_address, shown
from trainjobs.job_paths import DATASETS, JOBS, UPLOADS
from trainjobs.requirement_urls import requirement_url, requirement_url_problem

HOST_DATA_DIRS_ENV = "TRAINJOBS_HOST_DATA_DIRS"
FETCH_ALLOW_HOSTS_ENV = "TRAINJOBS_FETCH_ALLOW_HOSTS"
SOURCE_BUCKETS_ENV = "TRAINJOBS_SOURCE_BUCKETS"
REQUIREMENT_URL_HOSTS_ENV = "TRAINJOBS_REQUIREMENT_URL_HOSTS"
_SCHEMES = ("gs://", "https://", "http://", "dataset:", "sklearn:")
_SHA256 = re.compile(r"[0-9a-f]{64}")

OwnJob = Callable[[str], bool]  # is this job id one of the submitting project's jobs?


class SourceRefused(ValueError):
    """A source or module the rules refuse; the message is for the user and names no host facts."""


def is_host_path(source: str) -> bool:
    """A path on the worker's host: file://, or anything without a scheme we know."""
    return not source.startswith(_SCHEMES)


@dataclass(frozen=True)
class DataAccessRules:
    host_dirs: tuple[Path, ...] = ()  # resolved
    fetch_allow_hosts: frozenset[str] = field(default_factory=frozenset)  # lower-case host names
    source_buckets: frozenset[str] = field(default_factory=frozenset)  # buckets other than ours data may come from
    requirement_url_hosts: frozenset[str] = field(default_factory=frozenset)  # lower-case; pip may fetch from them

    @classmethod
    def from_env(cls) -> DataAccessRules:
        dirs = [d for d in os.environ.get(HOST_DATA_DIRS_ENV, "").split(os.pathsep) if d.strip()]
        hosts = [h.strip().lower() for h in os.environ.get(FETCH_ALLOW_HOSTS_ENV, "").split(",") if h.strip()]
        buckets = [b.strip() for b in os.environ.get(SOURCE_BUCKETS_ENV, "").split(",") if b.strip()]
        pip_hosts = [h.strip().lower().rstrip(".") for h in os.environ.get(REQUIREMENT_URL_HOSTS_ENV, "").split(",")
                     if h.strip()]
        return cls(tuple(Path(d.strip()).expanduser().resolve() for d in dirs), frozenset(hosts), frozenset(buckets),
                   frozenset(pip_hosts))

    def host_path(self, source: str) -> Path:
        """The resolved path a host-path source names, or SourceRefused."""
        if not self.host_dirs:
            raise SourceRefused("host paths are not accepted by this deployment: upload the file (trainjobs submit "
                                "uploads local files; or POST /v1/datasets, POST /v1/modules) or name a gs:// or https:// source")
        raw = unquote(source.removeprefix("file://")) if source.startswith("file://") else source
        refused = SourceRefused(f"{shown(source)} is not inside a directory this deployment allows host data from")
        path = Path(raw)
        if not path.is_absolute():
            raise SourceRefused(f"{shown(source)}: a host path must be absolute (inside a directory the operator allows)")
        try:
            resolved = path.resolve()
        except (OSError, ValueError, RuntimeError):  # too long, NUL bytes, a symlink loop: refused like any other
            raise refused from None
        if not any(resolved.is_relative_to(d) for d in self.host_dirs):
            raise refused
        return resolved

    def allows_host(self, host: str) -> bool:
        return host.lower().rstrip(".") in self.fetch_allow_hosts

    def check_url(self, url: str) -> str:
        """The URL's host if the URL may be fetched as far as its text shows, else SourceRefused."""
        parts = urlsplit(url)
        host = (parts.hostname or "").rstrip(".")
        if parts.scheme not in ("https", "http") or not host:
            raise SourceRefused(f"{shown(url)}: only https:// URLs with a host name are fetched")
        if self.allows_host(host):
            return host
        if parts.scheme == "http":
            raise SourceRefused(f"{shown(url)}: plain http:// is not fetched; use https:// (or ask the operator to allow the host)")
        address = literal_address(host)
        if host == "localhost" or host.endswith(".localhost") or (address is not None and not is_public(address)):
            raise SourceRefused(f"{shown(url)}: {host} is not a public address; only public hosts are fetched")
        return host

    def check_requirement(self, line: str) -> None:
        """SourceRefused if pip may not fetch what a requirement line names on this deployment."""
        if problem := requirement_url_problem(line):
            raise SourceRefused(problem)
        url = requirement_url(line)
        if url is None:
            return
        parts = urlsplit(url)
        if parts.scheme == "file":
            self.host_path(url)
        elif (parts.hostname or "").rstrip(".") not in self.requirement_url_hosts:
            raise SourceRefused(f"{shown(url)}: pip fetches a requirement's own URL on the job's machine, past any "
                                f"check of ours, so only from hosts the operator lists ({REQUIREMENT_URL_HOSTS_ENV}); "
                                "or name the package and its versions, installed from the deployment's index")


def check_bucket_uri(uri: str, *, bucket: str, project_id: str, own_job: OwnJob | None,
                     source_buckets: frozenset[str] = frozenset()) -> None:
    """Refuse a gs:// URI that is not the project's own upload or job, or one staged dataset by its
    content address, in trainjobs' own bucket, or anything in a bucket the operator did not list.
    `own_job` None: the caller cannot tell whose a job is (the worker); submit has checked."""
    name, _, key = uri.removeprefix("gs://").partition("/")
    if name != bucket:
        if name not in source_buckets:
            raise SourceRefused(f"{shown(uri)}: data is read from gs://{name} only if the operator allows that bucket "
                                f"({SOURCE_BUCKETS_ENV}); upload the data instead (POST /v1/datasets)")
        return
    top, _, rest = key.partition("/")
    first = rest.partition("/")[0]
    own_uploads = uploads.project_prefix(project_id)
    # GCS keys are literal, but a '..' that any layer (an emulator, a client) might normalise must not
    # turn our own prefix into another project's.
    dotted = any(part in (".", "..") for part in key.split("/"))
    allowed = not dotted and (
        (top == UPLOADS and (key.startswith(own_uploads) or key == own_uploads.rstrip("/")))
        or (top == JOBS and _is_uuid(first) and (own_job is None or own_job(first)))
        # A staged dataset's address is the sha256 of its content: naming one means knowing the data.
        or (top == DATASETS and _SHA256.fullmatch(first) is not None)
    )
    if not allowed:
        where = f"gs://{bucket}/"
        raise SourceRefused(f"{shown(uri)}: in {where} a job may name only its own project's uploads "
                            f"({where}{UPLOADS}/<project>/...) and jobs ({where}{JOBS}/<job id>/...)")


def _is_uuid(text: str) -> bool:
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False


def check_source(value: str, *, rules: DataAccessRules, bucket: str, project_id: str, own_job: OwnJob | None) -> None:
    """SourceRefused if a job of `project_id` may not name `value` as its dataset source or module."""
    if value.startswith("gs://"):
        check_bucket_uri(value, bucket=bucket, project_id=project_id, own_job=own_job,
                         source_buckets=rules.source_buckets)
    elif value.startswith(("https://", "http://")):
        rules.check_url(value)
    elif is_host_path(value):
        rules.host_path(value)
