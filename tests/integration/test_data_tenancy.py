"""Issue 8, section 1 (data): one project's uploads, host paths, URLs and error messages reach only
that project. Against the real API, PostgreSQL, the GCS emulator and local HTTP servers."""

from __future__ import annotations

import functools
import io
import os
import socket
import threading
import zipfile
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support.jobs import make_key
from tests.support.staging import stage
from tests.support.tenancy import job, project_id, refusal
from tests.support import scaled
from trainjobs import storage
from trainjobs.source_rules import FETCH_ALLOW_HOSTS_ENV, HOST_DATA_DIRS_ENV, DataAccessRules
from trainjobs.spec import JobSpec
from trainjobs.tfrecord import frame
from worker.ports import DatasetError, StagingStopped
from worker.staging.budget import StagingLimits
from worker.staging_adapter import GcsStager

CSV = b"a,b,label\n1,2,0\n3,4,1\n5,6,0\n7,8,1\n"


@pytest.fixture
def other(db, api_url: str) -> Iterator[httpx.Client]:
    """A client of project 'beta', beside `api` (project 'alpha')."""
    key = make_key(db, "beta")
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
        yield client


def upload(client: httpx.Client, name: str, data: bytes, kind: str = "datasets") -> dict[str, Any]:
    r = client.post(f"/v1/{kind}", files={"file": (name, data)})
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


# --- 1. uploads are one project's ---------------------------------------------------------------


def test_the_same_bytes_uploaded_by_two_projects_are_two_objects(api, other, db, bucket):
    mine, theirs = upload(api, "a.csv", CSV), upload(other, "a.csv", CSV)

    stored = sorted(b.name for b in storage.client().list_blobs(bucket, prefix="uploads/") if ".incoming" not in b.name)
    assert mine["sha256"] == theirs["sha256"]
    assert stored == sorted(f"uploads/{project_id(db, p)}/{mine['sha256']}/a.csv" for p in ("alpha", "beta"))


def test_a_dataset_uploaded_by_another_project_does_not_resolve(api, db, bucket, tmp_path):
    sha = upload(api, "a.csv", CSV)["sha256"]

    with pytest.raises(DatasetError, match=f"no dataset {sha} was uploaded by this project"):
        stage(f"dataset:{sha}", work_dir=tmp_path, project=project_id(db, "beta"), rules=DataAccessRules())
    assert stage(f"dataset:{sha}", work_dir=tmp_path,
                 project=project_id(db, "alpha"), rules=DataAccessRules()).manifest["num_classes"] == 2


def test_a_module_uploaded_by_another_project_is_refused_at_submit(api, other, bucket):
    module = upload(api, "my_model.py", b"def build_model(shape, classes, params): ...\n", kind="modules")["module"]

    assert refusal(other.post("/v1/jobs", json=job(module=module)))["field"] == "model.module"
    assert api.post("/v1/jobs", json=job(module=module)).status_code == 201


def test_the_stager_refuses_another_projects_module(api, db, bucket, tmp_path):
    module = upload(api, "my_model.py", b"def build_model(shape, classes, params): ...\n", kind="modules")["module"]
    spec = JobSpec.model_validate(job(module=module))

    with pytest.raises(DatasetError, match="model.module"):
        GcsStager(tmp_path)(spec, "j1", project_id=project_id(db, "beta"))


def _paths_of_others(bucket: str, alpha: str, beta: str, beta_job: str) -> list[str]:
    return [
        f"gs://{bucket}/uploads/{alpha}/{'0' * 64}/a.csv",  # another project's upload
        f"gs://{bucket}/uploads/{alpha}/",
        f"gs://{bucket}/uploads/{beta}/../{alpha}/{'0' * 64}/a.csv",
        f"gs://{bucket}/uploads/",  # every project's uploads
        f"gs://{bucket}/uploads",
        f"gs://{bucket}/uploads/.incoming/x",
        f"gs://{bucket}/jobs/{beta_job}/artifacts/",  # another project's job
        f"gs://{bucket}/jobs/",
        f"gs://{bucket}/jobs/not-a-job-id/",
        f"gs://{bucket}/datasets/",  # every project's staged data
        f"gs://{bucket}/datasets",
    ]


@pytest.mark.parametrize("field", ["dataset.source", "model.module"])
def test_paths_into_another_projects_uploads_and_jobs_are_refused_at_submit(api, other, db, bucket, field):
    beta_job = other.post("/v1/jobs", json=job()).json()["id"]
    alpha, beta = project_id(db, "alpha"), project_id(db, "beta")

    for uri in _paths_of_others(bucket, alpha, beta, beta_job):
        spec = job(source=uri) if field == "dataset.source" else job(module=uri)
        answer = refusal(other.post("/v1/jobs", json=spec) if "uploads" in uri else api.post("/v1/jobs", json=spec))
        assert answer["field"] == field, uri
        assert "only its own project's uploads" in answer["reason"]


def test_a_project_may_name_its_own_uploads_and_jobs(api, db, bucket):
    first = api.post("/v1/jobs", json=job()).json()["id"]
    # Other buckets and other folders of ours: tests/test_source_rules.py (issue 18, finding 4).
    own = [f"gs://{bucket}/uploads/{project_id(db, 'alpha')}/{'0' * 64}/a.csv", f"gs://{bucket}/jobs/{first}/",
           f"gs://{bucket}/uploads/{project_id(db, 'alpha')}", f"gs://{bucket}/datasets/{'a' * 64}/"]

    for uri in own:
        assert api.post("/v1/jobs", json=job(source=uri)).status_code == 201, uri


# --- 2. host paths --------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["dataset.source", "model.module"])
def test_host_paths_are_refused_at_submit_and_the_answer_says_nothing_about_existence(api, tmp_path, field):
    real = tmp_path / "real.csv"
    real.write_bytes(CSV)
    reasons = set()
    for path in (str(real), str(tmp_path / "missing.csv"), f"file://{real}", "relative/data.csv"):
        spec = job(source=path) if field == "dataset.source" else job(module=path)
        answer = refusal(api.post("/v1/jobs", json=spec))
        assert answer["field"] == field
        reasons.add(answer["reason"])
    assert len(reasons) == 1 and "host paths are not accepted" in reasons.pop()


def test_the_client_uploads_a_local_folder_so_no_host_path_is_needed(api, db, bucket, tmp_path):
    from PIL import Image

    from trainjobs.client.api import Client

    for name, color in (("red", (255, 0, 0)), ("blue", (0, 0, 255))):
        (tmp_path / "shapes" / name).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (8, 8), color).save(tmp_path / "shapes" / name / f"{i}.png")
    client = Client(str(api.base_url), api.headers["Authorization"].removeprefix("Bearer "))

    source = client.upload_dataset(tmp_path / "shapes")["dataset"]

    assert stage(source, work_dir=tmp_path / "work",
                 project=project_id(db, "alpha"), rules=DataAccessRules()).manifest["class_names"] == ["blue", "red"]


@pytest.fixture
def allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory the operator allows host data from, and a secret beside it."""
    folder = tmp_path / "allowed"
    folder.mkdir()
    (folder / "data.csv").write_bytes(CSV)
    (tmp_path / "secret.csv").write_bytes(b"SECRET=hunter2,label\n1,0\n")
    (folder / "link.csv").symlink_to(tmp_path / "secret.csv")
    monkeypatch.setenv(HOST_DATA_DIRS_ENV, str(folder))
    return folder


def test_an_allowed_directory_admits_paths_inside_it(api, allowed):
    assert api.post("/v1/jobs", json=job(source=str(allowed / "data.csv"))).status_code == 201
    assert api.post("/v1/jobs", json=job(source=f"file://{allowed}/data.csv")).status_code == 201


@pytest.mark.parametrize("escape", ["../secret.csv", "link.csv", "../allowed-not/x.csv"])
def test_dot_dot_and_symlinks_cannot_leave_an_allowed_directory(api, allowed, escape):
    answer = refusal(api.post("/v1/jobs", json=job(source=f"{allowed}/{escape}")))
    assert answer["field"] == "dataset.source" and "not inside a directory this deployment allows" in answer["reason"]


def test_staging_refuses_host_paths_the_operator_does_not_allow(allowed, bucket, tmp_path):
    with pytest.raises(DatasetError, match="host paths are not accepted"):
        stage(str(allowed / "data.csv"), work_dir=tmp_path / "work",
              project="6d1f4a52-5d0e-4c3a-9a53-2a4f4f0f1b11", rules=DataAccessRules())


def test_a_path_too_long_for_the_filesystem_is_bad_data_not_a_crash(allowed, bucket, tmp_path):
    with pytest.raises(DatasetError, match="no file or folder at"):
        stage(f"{allowed}/{'x' * 1000}.csv", work_dir=tmp_path / "work",
              project=PROJECT, rules=DataAccessRules.from_env())


def test_staging_refuses_a_link_inside_an_allowed_folder_that_leads_out(allowed, bucket, tmp_path):
    rules = DataAccessRules.from_env()
    with pytest.raises(DatasetError) as err:
        stage(str(allowed), work_dir=tmp_path / "work", project="6d1f4a52-5d0e-4c3a-9a53-2a4f4f0f1b11", rules=rules)
    assert "link.csv in allowed links outside" in str(err.value) and "hunter2" not in str(err.value)


# --- 3. errors about data never quote it ----------------------------------------------------------

SECRET = "hunter2"


def _npz_named_by_secret() -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{SECRET: np.zeros((4, 2))})
    return buf.getvalue()


# Example{features{feature{"hunter2": Feature{int64_list{1}}}}}
_SECRET_EXAMPLE = b"\x0a\x12\x0a\x10\x0a\x07" + SECRET.encode() + b"\x12\x05\x1a\x03\x0a\x01\x01"


@pytest.mark.parametrize(("name", "content", "says"), [
    ("passwd.csv", b"root:x:0:0:" + SECRET.encode() + b":/root:/bin/bash\n", "passwd.csv has no label column 'label'"),
    # A column of numbers but for the secret (9 in 10): numeric with a bad cell, named by place.
    ("values.csv", b"a,b,label\n" + b"1,2,0\n" * 9 + b"3," + SECRET.encode() + b",1\n", "values.csv line 11, column 2"),
    ("one-class.csv", b"a,label\n1," + SECRET.encode() + b"\n2," + SECRET.encode() + b"\n", "found only 1"),
    ("fraction.csv", b"a,label\n1,0.25\n2,1\n", "fraction.csv: the label column looks continuous (numbers that are not whole)"),
    ("arrays.npz", _npz_named_by_secret(), "arrays.npz has no array 'x'"),
    ("features.tfrecord", frame(_SECRET_EXAMPLE), "features.tfrecord record 0 is not in our TFRecord schema"),
], ids=["header", "value", "label", "number", "npz-names", "tfrecord-names"])
def test_data_errors_name_the_file_and_place_not_the_bytes(bucket, tmp_path, name, content, says):
    (tmp_path / name).write_bytes(content)
    rules = DataAccessRules(host_dirs=(tmp_path.resolve(),))

    with pytest.raises(DatasetError) as err:
        stage(str(tmp_path / name), work_dir=tmp_path / "work",
              project="6d1f4a52-5d0e-4c3a-9a53-2a4f4f0f1b11", rules=rules)
    assert says in str(err.value)
    assert SECRET not in str(err.value) and "0.25" not in str(err.value)


# --- 4. URLs: https to public hosts, unless the operator allow-lists one -------------------------


@pytest.mark.parametrize("url", [
    "http://example.com/data.csv", "https://127.0.0.1/data.csv", "https://169.254.169.254/latest/meta-data/",
    "https://[::1]/data.csv", "https://localhost/data.csv", "https://2130706433/data.csv", "https://10.0.0.8/x.csv",
    "https://[::ffff:192.168.0.1]/x.csv",
])
def test_urls_the_worker_would_not_fetch_are_refused_at_submit(api, url):
    assert refusal(api.post("/v1/jobs", json=job(source=url)))["field"] == "dataset.source"


def test_an_allow_listed_host_may_be_fetched_over_http(api, monkeypatch):
    monkeypatch.setenv(FETCH_ALLOW_HOSTS_ENV, "data.internal")

    assert api.post("/v1/jobs", json=job(source="http://data.internal:8000/d.csv")).status_code == 201


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a stalled answer must not hold up the test's teardown


class Site:
    """A local HTTP server whose answers a test sets, and which counts the requests it got."""

    def __init__(self, root: Path):
        self.hits, self.redirect_to, self.stall_s = 0, "", 0.0
        self.closing = threading.Event()
        site = self

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (the http.server API)
                site.hits += 1
                if site.redirect_to:
                    self.send_response(302)
                    self.send_header("Location", site.redirect_to)
                    self.end_headers()
                elif site.stall_s:
                    self.send_response(200)
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    site.closing.wait(site.stall_s)
                else:
                    super().do_GET()

        self.server = _Server(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sites(tmp_path: Path) -> Iterator[tuple[Site, Site]]:
    """Two local servers: the first allow-listed by address (127.0.0.1), the second not."""
    (tmp_path / "www").mkdir()
    np.savez(tmp_path / "www" / "data.npz", x=np.zeros((1 << 16, 4)), y=np.arange(1 << 16) % 2)
    a, b = Site(tmp_path / "www"), Site(tmp_path / "www")
    yield a, b
    a.close()
    b.close()


LOCAL_ALLOWED = DataAccessRules(fetch_allow_hosts=frozenset({"127.0.0.1"}))
PROJECT = "6d1f4a52-5d0e-4c3a-9a53-2a4f4f0f1b11"


def test_a_host_name_that_resolves_to_a_private_address_is_not_contacted(bucket, tmp_path, sites):
    _, target = sites
    this_machine = socket.gethostname()  # resolves to a loopback or private address, never a public one

    with pytest.raises(DatasetError, match=f"{this_machine} is not a public address"):
        stage(f"https://{this_machine}:{target.port}/data.npz", work_dir=tmp_path / "work",
              project=PROJECT, rules=DataAccessRules())
    assert target.hits == 0


@pytest.mark.parametrize("where", ["https://{host}:{port}/data.npz", "http://169.254.169.254/latest/meta-data/"])
def test_every_redirect_is_held_to_the_same_rules(bucket, tmp_path, sites, where):
    start, target = sites
    start.redirect_to = where.format(host=socket.gethostname(), port=target.port)

    with pytest.raises(DatasetError, match="public|plain http"):
        stage(f"http://127.0.0.1:{start.port}/data.npz", work_dir=tmp_path / "work",
              project=PROJECT, rules=LOCAL_ALLOWED)
    assert start.hits == 1 and target.hits == 0


def test_redirects_are_followed_a_bounded_number_of_times(bucket, tmp_path, sites):
    start, _ = sites
    start.redirect_to = f"http://127.0.0.1:{start.port}/again"

    with pytest.raises(DatasetError, match="more than 5 redirects"):
        stage(f"http://127.0.0.1:{start.port}/data.npz", work_dir=tmp_path / "work",
              project=PROJECT, rules=LOCAL_ALLOWED)
    assert start.hits == 6


def test_a_download_past_the_size_cap_fails(bucket, tmp_path, sites):
    start, _ = sites
    with pytest.raises(DatasetError, match="more than 100000 bytes"):
        stage(f"http://127.0.0.1:{start.port}/data.npz", work_dir=tmp_path / "work",
              project=PROJECT, rules=LOCAL_ALLOWED, limits=StagingLimits(max_bytes=100_000))


def test_a_download_that_stalls_fails_at_its_deadline(bucket, tmp_path, sites):
    start, _ = sites
    start.stall_s = scaled(30)
    with pytest.raises(DatasetError, match="did not answer in time|took longer"):
        stage(f"http://127.0.0.1:{start.port}/data.npz", work_dir=tmp_path / "work",
              project=PROJECT, rules=LOCAL_ALLOWED, limits=StagingLimits(fetch_timeout_s=0.5))


def test_an_allow_listed_local_server_is_fetched(bucket, tmp_path, sites):
    start, _ = sites
    staged = stage(f"http://127.0.0.1:{start.port}/data.npz", work_dir=tmp_path / "work",
                   project=PROJECT, rules=LOCAL_ALLOWED)
    assert staged.manifest["feature"]["shape"] == [4]


# --- 5. huge trees fail early, and cancel stops staging -------------------------------------------


def test_a_tree_with_too_many_files_fails_while_walking(bucket, tmp_path):
    for i in range(30):
        (tmp_path / "tree" / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (tmp_path / "tree" / f"d{i % 3}" / f"{i}.tfrecord").write_bytes(b"")
    rules = DataAccessRules(host_dirs=(tmp_path.resolve(),))

    with pytest.raises(DatasetError, match="tree holds more than 10 files"):
        stage(str(tmp_path / "tree"), work_dir=tmp_path / "work",
              project=PROJECT, rules=rules, limits=StagingLimits(max_files=10))


def test_a_huge_file_fails_on_its_size_without_being_read(bucket, tmp_path):
    (tmp_path / "tree").mkdir()
    with (tmp_path / "tree" / "huge.tfrecord").open("wb") as f:
        f.truncate(1 << 40)  # sparse: a terabyte that costs no disk, and takes hours to hash
    rules = DataAccessRules(host_dirs=(tmp_path.resolve(),))

    with pytest.raises(DatasetError, match=f"more than {StagingLimits().max_bytes} bytes"):
        stage(str(tmp_path / "tree"), work_dir=tmp_path / "work", project=PROJECT, rules=rules)


def test_an_archive_with_too_many_members_fails_before_it_is_unpacked(bucket, tmp_path):
    with zipfile.ZipFile(tmp_path / "many.zip", "w") as z:
        for i in range(30):
            z.writestr(f"a/{i}.csv", "x,label\n1,0\n")
    rules = DataAccessRules(host_dirs=(tmp_path.resolve(),))

    with pytest.raises(DatasetError, match="many.zip holds more than 10 files"):
        stage(str(tmp_path / "many.zip"), work_dir=tmp_path / "work",
              project=PROJECT, rules=rules, limits=StagingLimits(max_files=10))
    assert not any((tmp_path / "work").rglob("*.csv"))


def stop_after(calls: int) -> Callable[[], bool]:
    """A should_stop that turns true on its `calls`-th question: a cancel arriving mid-staging."""
    asked = iter(range(calls, 0, -1))
    return lambda: next(asked, 0) <= 1


@pytest.mark.parametrize("source", ["tree", "www"])
def test_cancel_stops_staging_between_files_and_chunks(bucket, tmp_path, sites, source):
    for i in range(20):
        (tmp_path / "tree" / str(i % 2)).mkdir(parents=True, exist_ok=True)
        (tmp_path / "tree" / str(i % 2) / f"{i}.tfrecord").write_bytes(os.urandom(1 << 16))
    start, _ = sites
    where = str(tmp_path / "tree") if source == "tree" else f"http://127.0.0.1:{start.port}/data.npz"
    rules = DataAccessRules(host_dirs=(tmp_path.resolve(),), fetch_allow_hosts=frozenset({"127.0.0.1"}))

    with pytest.raises(StagingStopped):
        stage(where, work_dir=tmp_path / "work", project=PROJECT, rules=rules, should_stop=stop_after(3))
    assert storage.list_uris(f"gs://{bucket}/datasets/") == []


def test_the_stager_passes_the_drivers_stop_to_staging(bucket, tmp_path):
    spec = JobSpec.model_validate(job())
    with pytest.raises(StagingStopped):
        GcsStager(tmp_path)(spec, "j1", project_id=PROJECT, should_stop=lambda: True)
