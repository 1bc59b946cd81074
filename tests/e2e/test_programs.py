"""Program jobs (issue 20): the user's own TensorFlow code, run through the whole product (API, worker,
staging, the local provisioner's machines, the agent, the runtime) and judged by what comes back
through the API: the artifacts are downloaded and scored here, on data the job never saw.

The programs are real code nobody here wrote for trainjobs (tests/programs/): the keras.io Simple MNIST
convnet with the runtime's lines, a custom training loop in the tf.distribute guide's pattern, and a
script written for Vertex AI that knows nothing of trainjobs. Every job of the module is submitted at
once to one stack and runs two at a time; each test judges one. Resuming after a kill, without the
control plane: tests/e2e/test_program_runs.py.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support import scaled
from tests.support.jobs import ModuleJobs, finished, make_key, module_jobs, submit_all
from tests.support.local import local_stack_running
from tests.support.streams import sse
from tests.support.wheels import make_wheel

pytestmark = pytest.mark.tf

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
CPU2 = {"type": "cpu", "replicas": 2}


def _upload(client: httpx.Client, name: str, data: bytes) -> str:
    r = client.post("/v1/modules", files={"file": (name, data)})
    assert r.status_code == 201, r.text
    return str(r.json()["module"])


def _zip(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return buf.getvalue()


FAILING = '''
import sys
from trainjobs import runtime as tj
print("about to fail, with", tj.replicas, "replicas")
def load():
    raise ValueError("the CSV has no column 'price'")
load()
'''


REQUIRING = '''
import os
import sys
from pathlib import Path

import numpy
import tjgreet

Path(os.environ["AIP_MODEL_DIR"], "greeting.txt").write_text(f"{tjgreet.hello()} {numpy.__version__} {sys.executable}")
'''

# A program's attacks on what is outside its job, and on what the agent reads from it (issue 20; the
# same storage attacks from model code: tests/e2e/test_code_tenancy.py). No TensorFlow: it needs none.
ATTACKING = '''
import json
import os
import sys
from pathlib import Path

from trainjobs import storage

params = json.loads(sys.argv[1])
report = {"environment": sorted(k for k, v in os.environ.items() if k in params["secrets"] or "postgresql" in v
                                or "s3cr3t" in v)}


def attempt(what, action):
    try:
        action()
        report[what] = "done"
    except Exception as exc:
        report[what] = f"{type(exc).__name__}: {str(exc)[:300]}"


bucket = params["bucket"]
attempt("list the uploads", lambda: list(storage.client().list_blobs(bucket, prefix="uploads/")))
attempt("list the bucket", lambda: list(storage.client().list_blobs(bucket)))
attempt("read another project's module", lambda: storage.blob(params["module"]).download_as_bytes())
attempt("read another project's dataset", lambda: storage.blob(params["dataset"]).download_as_bytes())
# The model directory becomes artifacts: a link out of it must not carry the machine's files along.
model_dir = Path(os.environ["TRAINJOBS_MODEL_DIR"])
os.symlink(params["outside"], model_dir / "leak.txt")
os.symlink("report.json", model_dir / "report-link.json")  # inside: an ordinary artifact
# The reports file the agent follows: lines the runtime never writes, among two it might.
with open(os.environ["TRAINJOBS_REPORTS"], "a") as f:
    f.write("not json\\n")
    f.write(json.dumps({"kind": "metrics", "epoch": "first", "metrics": {"loss": 1}}) + "\\n")
    f.write(json.dumps({"kind": "progress", "fraction": "all"}) + "\\n")
    f.write(json.dumps({"kind": "metrics", "epoch": 10**9, "metrics": {"loss": 1}}) + "\\n")
    f.write(json.dumps({"kind": "metrics", "epoch": 1, "metrics": {f"m{i}": i for i in range(10_000)}}) + "\\n")
    f.write("x" * (3 << 20) + "\\n")
    f.write(json.dumps({"kind": "metrics", "epoch": 2, "epochs": 2, "metrics": {"loss": 0.5, "note": "y" * 10_000}})
            + "\\n")
(model_dir / "report.json").write_text(json.dumps(report))
'''


WHEELS = "wheels"  # the requirements' wheels, in the one folder the operator allows


def _specs(client: httpx.Client, alpha: httpx.Client, bucket: str, scratch: Path) -> dict[str, dict[str, Any]]:
    from trainjobs import storage

    mnist = _upload(client, "mnist_convnet.py", (PROGRAMS / "mnist_convnet.py").read_bytes())
    loop = _upload(client, "regression_loop.py", (PROGRAMS / "regression_loop.py").read_bytes())
    vertex = _upload(client, "trainer.zip", _zip({
        "trainer/task.py": (PROGRAMS / "vertex_ai_task.py").read_text(), "trainer/__init__.py": ""}))
    failing = _upload(client, "failing.py", FAILING.encode())
    no_main = _upload(client, "pkg.zip", _zip({"pkg/train.py": "print('hi')\n", "pkg/util.py": ""}))
    requiring = _upload(client, "requiring.py", REQUIRING.encode())
    wheels = scratch / WHEELS
    wheels.mkdir()
    wheel = make_wheel(wheels, "tjgreet", "0.1", {"tjgreet/__init__.py": "def hello():\n    return 'hi'\n"})
    # What the attacker goes for: another project's upload and dataset, a file of the machine's.
    theirs = _upload(alpha, "alpha_model.py", b"SECRET = 1\n")
    dataset = alpha.post("/v1/datasets", files={"file": ("alpha.csv", b"x,label\n1,0\n2,1\n")}).json()["sha256"]
    dataset_uri = next(f"gs://{bucket}/{b.name}" for b in storage.client().list_blobs(bucket, prefix="uploads/")
                       if dataset in b.name)
    outside = scratch / "another-jobs-file.txt"
    outside.write_text("not yours")
    attack = {"bucket": bucket, "module": theirs, "dataset": dataset_uri, "outside": str(outside),
              "secrets": ["TRAINJOBS_DATABASE_URL", "TRAINJOBS_WORKER_SECRET", "TRAINJOBS_TEST_DATABASE_URL"]}
    return {
        "mnist": {"accelerator": CPU2, "strategy": "mirrored", "steps_per_execution": "auto",
                  "program": {"source": mnist}, "training": {"epochs": 8}},
        "loop": {"accelerator": {"type": "cpu"}, "workers": 2, "strategy": "multi_worker_mirrored",
                 "precision": "mixed_bfloat16",
                 "program": {"source": loop, "args": ["--units", "32"]},
                 "training": {"epochs": 6, "global_batch_size": 32}},
        "fit_two_workers": {"accelerator": {"type": "cpu"}, "workers": 2, "strategy": "multi_worker_mirrored",
                            "program": {"source": _upload(client, "long_fit.py", (PROGRAMS / "long_fit.py").read_bytes())},
                            "training": {"epochs": 3, "global_batch_size": 32}},
        "vertex": {"accelerator": {"type": "cpu"}, "strategy": "default",
                   "program": {"source": vertex, "entrypoint": "task.py",
                               "args": ["--epochs", "5", "--distribute", "single"], "env": {"MY_FLAG": "1"}}},
        "failing": {"accelerator": {"type": "cpu"}, "program": {"source": failing}},
        "no_entrypoint": {"accelerator": {"type": "cpu"}, "program": {"source": no_main}},
        "replaces_numpy": {"accelerator": {"type": "cpu"}, "program": {"source": failing, "requirements": ["numpy<1"]}},
        "requirements": {"accelerator": {"type": "cpu"},
                         "program": {"source": requiring, "requirements": [f"tjgreet @ {wheel.as_uri()}"]}},
        "bad_requirement": {"accelerator": {"type": "cpu"}, "program": {"source": failing, "requirements": [
            f"tjmissing @ {(wheels / 'nowhere' / 'tjmissing-1.0-py3-none-any.whl').as_uri()}"]}},
        "attacker": {"accelerator": {"type": "cpu"},
                     "program": {"source": _upload(client, "attacker.py", ATTACKING.encode()),
                                 "args": [json.dumps(attack)]}},
    }


Jobs = ModuleJobs


@pytest.fixture(scope="module")
def jobs(database_url: str, api_url: str, gcs_emulator: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    import os

    with module_jobs(database_url, api_url, "programs") as (client, factory, monkey):
        monkey.setenv("TRAINJOBS_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        # What a worker holds, which no job's program may see: the database URL and a secret of the operator's.
        monkey.setenv("TRAINJOBS_DATABASE_URL", database_url)
        monkey.setenv("TRAINJOBS_WORKER_SECRET", "s3cr3t")
        scratch = tmp_path_factory.mktemp("programs")
        # A requirement's file:// URL only from a folder the operator allows (issue 36, finding 9).
        monkey.setenv("TRAINJOBS_HOST_DATA_DIRS", str(scratch / WHEELS))
        with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {make_key(factory, 'alpha')}"},
                          timeout=scaled(30)) as alpha:
            specs = _specs(client, alpha, os.environ["TRAINJOBS_BUCKET"], scratch)
        ids = submit_all(client, specs)
        with local_stack_running(database_url, tmp_path_factory.mktemp("stack")):
            yield client, ids


_done = finished


def _download(jobs: Jobs, name: str, path: str, to: Path) -> Path:
    client, ids = jobs
    r = client.get(f"/v1/jobs/{ids[name]}/artifacts/{path}")
    assert r.status_code == 200, r.text
    to.parent.mkdir(parents=True, exist_ok=True)
    to.write_bytes(r.content)
    return to


def _held_out_digits() -> tuple[np.ndarray, np.ndarray]:
    """The examples mnist_convnet.py holds out, made the way it makes them (scikit-learn's digits,
    shuffled by seed 0, resized to 28x28, the last 297)."""
    import keras
    from sklearn.datasets import load_digits

    d = load_digits()
    order = np.random.default_rng(0).permutation(len(d.target))
    x = d.images[order][-297:] * (255 / 16)
    x = keras.ops.convert_to_numpy(keras.ops.image.resize(x[..., None], (28, 28)))
    return (x / 255).astype("float32"), d.target[order][-297:]


def test_the_keras_mnist_example_trains_as_a_program_and_its_model_scores_on_held_out_digits(
        jobs: Jobs, tmp_path: Path) -> None:
    import keras

    job = _done(jobs, "mnist")
    assert job["status"] == "SUCCEEDED", job.get("error")
    runtime = job["runtime"]
    assert (runtime["strategy"], runtime["replicas"], runtime["precision"]) == ("mirrored", 2, "float32")
    assert runtime["steps_per_execution"] == 4  # `auto` on a CPU
    client, ids = jobs
    listed = {a["path"]: a for a in client.get(f"/v1/jobs/{ids['mnist']}/artifacts").json()["artifacts"]}
    assert "model.keras" in listed
    local = _download(jobs, "mnist", "model.keras", tmp_path / "model.keras")
    import hashlib

    assert hashlib.sha256(local.read_bytes()).hexdigest() == listed["model.keras"]["sha256"]
    model = keras.saving.load_model(local)
    x, y = _held_out_digits()
    accuracy = float(np.mean(model.predict(x, verbose=0).argmax(axis=-1) == y))
    assert accuracy >= 0.95, accuracy
    # What the callbacks reported: one entry per epoch, in the job's metrics and history.
    history = client.get(f"/v1/jobs/{ids['mnist']}/metrics").json()["epochs"]
    assert [e["epoch"] for e in history] == list(range(1, 9))
    assert all(0.0 <= e["val_accuracy"] <= 1.0 for e in history)
    assert job["progress"] == 1.0


def test_a_custom_training_loop_on_two_workers_in_bfloat16_reports_its_metrics_and_its_model_predicts(
        jobs: Jobs, tmp_path: Path) -> None:
    import keras
    from sklearn.datasets import load_diabetes

    job = _done(jobs, "loop")
    assert job["status"] == "SUCCEEDED", job.get("error")
    assert (job["runtime"]["strategy"], job["runtime"]["replicas"], job["runtime"]["workers"]) == (
        "multi_worker_mirrored", 2, 2)
    assert job["runtime"]["precision"] == "mixed_bfloat16"
    client, ids = jobs
    history = client.get(f"/v1/jobs/{ids['loop']}/metrics").json()["epochs"]
    assert [e["epoch"] for e in history] == list(range(1, 7))
    assert history[-1]["loss"] < history[0]["loss"]
    # The metrics stream a watcher follows gives the same epochs, then ends with the job.
    with client.stream("GET", f"/v1/jobs/{ids['loop']}/metrics", params={"follow": "true"}) as r:
        events = list(sse(r))
    streamed = [e.data for e in events if e.name == "metric"]
    assert [e["epoch"] for e in streamed] == list(range(1, 7)) and streamed[-1]["loss"] == history[-1]["loss"], events
    assert events[-1].name == "end" and events[-1].data["status"] == "SUCCEEDED"
    model = keras.saving.load_model(_download(jobs, "loop", "regressor.keras", tmp_path / "regressor.keras"))
    x, y = load_diabetes(return_X_y=True)
    x = ((x - x.mean(axis=0)) / x.std(axis=0)).astype("float32")
    held_out, truth = x[-88:], y[-88:] / 100.0
    mae = float(np.mean(np.abs(model.predict(held_out, verbose=0)[:, 0] - truth)))
    baseline = float(np.mean(np.abs(np.mean(y[:-88] / 100.0) - truth)))  # always the training mean
    assert mae < 0.85 * baseline, (mae, baseline)


def test_keras_fit_in_a_program_trains_on_two_workers_under_multi_worker_mirrored(jobs: Jobs, tmp_path: Path) -> None:
    """Keras 3 cannot fit under MultiWorkerMirroredStrategy as it ships (keras-team/keras#20585): the
    runtime applies the managed trainer's repairs to the program's models too."""
    import keras
    from sklearn.datasets import load_digits

    job = _done(jobs, "fit_two_workers")
    assert job["status"] == "SUCCEEDED", job.get("error")
    assert (job["runtime"]["strategy"], job["runtime"]["workers"], job["runtime"]["replicas"]) == (
        "multi_worker_mirrored", 2, 2)
    assert any("keras multi-worker repair" in note for note in job["runtime"]["notes"]), job["runtime"]
    client, ids = jobs
    assert [e["epoch"] for e in client.get(f"/v1/jobs/{ids['fit_two_workers']}/metrics").json()["epochs"]] == [
        1, 2, 3]
    model = keras.saving.load_model(_download(jobs, "fit_two_workers", "model.keras", tmp_path / "model.keras"))
    x, y = load_digits(return_X_y=True)
    assert float(np.mean(model.predict(x / 16.0, verbose=0).argmax(axis=-1) == y)) >= 0.8


def test_a_script_written_for_vertex_ai_runs_unchanged_and_its_saved_model_serves(jobs: Jobs, tmp_path: Path) -> None:
    import tensorflow as tf
    from sklearn.datasets import load_breast_cancer

    job = _done(jobs, "vertex")
    assert job["status"] == "SUCCEEDED", job.get("error")
    client, ids = jobs
    listed = [a["path"] for a in client.get(f"/v1/jobs/{ids['vertex']}/artifacts").json()["artifacts"]]
    saved = tmp_path / "saved"
    for path in listed:
        if path == "saved_model.pb" or path.startswith("variables/"):
            _download(jobs, "vertex", path, saved / path)
    served = tf.saved_model.load(str(saved))
    x, y = load_breast_cancer(return_X_y=True)
    x = ((x - x.mean(axis=0)) / x.std(axis=0)).astype("float32")
    probs = served.serve(tf.constant(x[-100:])).numpy()[:, 0]
    assert float(np.mean((probs > 0.5) == y[-100:])) >= 0.9
    log = client.get(f"/v1/jobs/{ids['vertex']}/logs").json()
    assert "num_replicas_in_sync = 1" in str(log)


def test_a_failing_program_fails_the_job_with_its_exit_status_and_traceback(jobs: Jobs) -> None:
    job = _done(jobs, "failing")
    assert job["status"] == "FAILED"
    assert "exited with status 1" in job["error"]
    assert "ValueError: the CSV has no column 'price'" in job["error"]
    assert "about to fail, with 1 replicas" in job["error"]


def test_a_program_without_its_entrypoint_fails_at_staging_before_any_machine(jobs: Jobs) -> None:
    job = _done(jobs, "no_entrypoint")
    assert job["status"] == "FAILED"
    assert "no __main__.py" in job["error"] and "train.py" in job["error"], job["error"]
    client, ids = jobs
    events = client.get(f"/v1/jobs/{ids['no_entrypoint']}/events").json()["events"]
    assert "PROVISIONING" not in {e["to_status"] for e in events}, events


def test_a_requirement_that_would_replace_numpy_fails_before_training(jobs: Jobs) -> None:
    job = _done(jobs, "replaces_numpy")
    assert job["status"] == "FAILED"
    assert "'numpy<1' would replace this machine's numpy" in job["error"], job["error"]
    client, ids = jobs
    log = str(client.get(f"/v1/jobs/{ids['replaces_numpy']}/logs").json())
    assert "about to fail" not in log  # the program never started


def test_a_programs_requirement_is_installed_over_the_image_in_a_phase_of_its_own(jobs: Jobs, tmp_path: Path) -> None:
    from importlib import metadata

    job = _done(jobs, "requirements")
    assert job["status"] == "SUCCEEDED", job.get("error")
    assert job["runtime"]["install_s"] > 0
    hello, numpy_version, python = _download(jobs, "requirements", "greeting.txt", tmp_path / "g.txt").read_text().split()
    assert (hello, numpy_version) == ("hi", metadata.version("numpy"))  # the package, and the image's NumPy
    assert "/requirements/" in python  # the environment made for the requirements ran the program
    client, ids = jobs
    assert "requirements: installing tjgreet @ file://" in str(client.get(f"/v1/jobs/{ids['requirements']}/logs").json())


def test_a_requirement_pip_cannot_install_fails_the_job_with_pips_message_before_the_program_runs(jobs: Jobs) -> None:
    job = _done(jobs, "bad_requirement")
    assert job["status"] == "FAILED"
    assert "pip could not install the requirements" in job["error"], job["error"]
    assert "tjmissing-1.0-py3-none-any.whl" in job["error"], job["error"]
    client, ids = jobs
    assert "about to fail" not in str(client.get(f"/v1/jobs/{ids['bad_requirement']}/logs").json())


def test_a_programs_own_code_reaches_nothing_outside_its_job_and_cannot_make_the_agent_trust_its_files(
        jobs: Jobs, tmp_path: Path) -> None:
    job = _done(jobs, "attacker")
    assert job["status"] == "SUCCEEDED", job.get("error")
    client, ids = jobs
    listed = {a["path"] for a in client.get(f"/v1/jobs/{ids['attacker']}/artifacts").json()["artifacts"]}
    # The link out of model_dir was not followed (metrics.json and history.json are the agent's).
    assert listed == {"report.json", "report-link.json", "metrics.json", "history.json"}
    report = json.loads(_download(jobs, "attacker", "report.json", tmp_path / "report.json").read_text())
    assert report.pop("environment") == []
    assert {what: "403" in outcome and "Forbidden" in outcome for what, outcome in report.items()} == {
        "list the uploads": True, "list the bucket": True, "read another project's module": True,
        "read another project's dataset": True}
    log = str(client.get(f"/v1/jobs/{ids['attacker']}/logs").json())
    assert log.count("not uploaded: leak.txt is a link to") == 1  # the directory is walked once
    assert log.count("ignored a report line") == 5  # not JSON, epoch 'first', fraction 'all', epoch 10**9, 3 MiB
    # What the agent kept of the reports it could read: two epochs, each within its bounds.
    history = client.get(f"/v1/jobs/{ids['attacker']}/metrics").json()["epochs"]
    assert [e["epoch"] for e in history] == [1, 2]
    assert len([k for k in history[0] if k.startswith("m")]) == 64
    assert history[1]["loss"] == 0.5 and history[1]["note"] == "y" * 200
