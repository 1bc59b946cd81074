"""What the client verbs print and refuse, without a worker: `trainjobs metrics` against the real API
with a job's metrics.json in storage, spec files that are not a spec, and `status` of a job whose final
metrics hold records (issue 37). Every verb on every state of a real job: tests/e2e/test_cli_verbs.py."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.integration.test_cli import capture_stdout, cli
from trainjobs.loopback import free_port


def test_metrics_prints_a_row_per_epoch_of_the_jobs_metrics_json(api, api_url, bucket, tmp_path):
    """Issue 37: the API answered metrics.json whole under `epochs` and the verb failed on every job with
    an epoch (through the whole product, every state: tests/e2e/test_cli_verbs.py)."""
    from trainjobs import storage
    from trainjobs.job_paths import JobPaths

    job = api.post("/v1/jobs", json={"dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp"}}).json()
    history = [{"attempt": 1, "epoch": e, "loss": 1.0 / e, "accuracy": 0.5 + e / 10, "val_loss": 1.2 / e,
                "val_accuracy": 0.4 + e / 10, "examples_per_sec": 900.0, "step_time_ms": 1.5,
                "input_wait_fraction": 0.1} for e in (1, 2)]
    storage.write_json(JobPaths.for_job(job["id"]).metrics, {"job_id": job["id"], "attempt": 1, "epochs": 2,
                                                              "initial_epoch": 0, "history": history})
    env = {**os.environ, "TRAINJOBS_HOME": str(tmp_path), "TRAINJOBS_API_URL": api_url,
           "TRAINJOBS_API_KEY": api.headers["authorization"].split()[1]}
    rows = cli("metrics", job["id"], env=env).stdout.splitlines()
    assert rows[0].split() == ["EPOCH", "LOSS", "ACCURACY", "VAL", "LOSS", "VAL", "ACC", "EXAMPLES/S", "STEP", "MS",
                               "INPUT", "WAIT"], rows
    assert [row.split()[:3] for row in rows[1:]] == [["1", "1.0000", "0.6000"], ["2", "0.5000", "0.7000"]], rows
    assert [json.loads(line) for line in cli("metrics", job["id"], "--json", env=env).stdout.splitlines()] == history


@pytest.mark.parametrize(("text", "said"), [
    ("", "is empty: a job spec is a YAML or JSON mapping of its fields"),
    ("   \n# nothing but a comment\n", "is empty: a job spec is a YAML or JSON mapping of its fields"),
    ("null\n", "holds a null, not a job spec"),
    ("- name: a\n- name: b\n", "holds a list, not a job spec"),
    ("digits.yaml\n", "holds a string, not a job spec"),
    ("name: [unclosed\n", "is not YAML or JSON (line 2, column 1)"),
], ids=["empty", "blank", "null", "list", "string", "bad yaml"])
@pytest.mark.parametrize("verb", [("submit",), ("submit", "--dry-run"), ("sweep", "submit")])
def test_a_spec_file_that_is_not_a_mapping_is_refused_naming_the_file(tmp_path, text, said, verb):
    from click.testing import CliRunner

    from stack.cli import main

    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    what = "sweep" if verb[0] == "sweep" else "job"
    # No API answers here: the file is refused before any request.
    env = {"TRAINJOBS_HOME": str(tmp_path), "TRAINJOBS_API_URL": f"http://127.0.0.1:{free_port()}"}
    result = CliRunner().invoke(main, [*verb, str(spec)], env=env)
    assert result.exit_code == 1 and result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert f"Error: {spec} {said.replace('job', what)}" in result.output, result.output
    assert "Traceback" not in result.output and "AttributeError" not in result.output


def test_status_shows_a_record_in_the_final_metrics_as_a_line_not_a_dict():
    """The final metrics' records (pruning, distillation, early stopping) and the runtime's dataset,
    in lines of name-value pairs: nothing is printed as a Python dict (issue 37)."""
    from trainjobs.client.terminal import job_detail, show

    layers = {f"dense_{i}": {"sparsity": 0.5 + i / 100, "kernel": [64, 64]} for i in range(40)}
    job = {"id": "j6", "name": "pruned", "status": "SUCCEEDED", "attempt": 1, "spec": {}, "progress": 1.0,
           "created_at": "2026-01-01T00:00:00+00:00",
           "runtime": {"strategy": "default", "replicas": 1, "precision": "float32", "global_batch_size": 32,
                       "steps_per_execution": 4, "notes": ["n1"],
                       "dataset": {"task": "regression", "train_examples": 354, "validation_examples": 88,
                                   "dropped_examples": 0, "feature_shape": [10], "targets": ["target"]}},
           "metrics": {"loss": 0.39, "val_loss": 0.59, "r2": 0.61, "val_r2": 0.47, "epochs": 60,
                       "pruning": {"target_sparsity": 0.5, "schedule": "polynomial", "layers": layers},
                       "early_stopping": "val_r2 did not improve by more than 0 for 3 epochs; best 0.48 at epoch 3"}}
    with capture_stdout() as out:
        show(job_detail(job))
    text = out.getvalue()
    assert "{'" not in text and max(len(line) for line in text.splitlines()) <= 200, text
    assert "runtime      strategy default, 1 replica, precision float32, global batch 32" in text, text
    assert "data: 354 training, 88 validation examples, features [10], task regression" in text, text
    assert re.search(r"^metrics\s+loss 0\.39\s+val_loss 0\.59\s+r2 0\.61$", text, re.M), text
    assert re.search(r"^pruning\s+target_sparsity 0\.5, schedule polynomial, layers \{dense_0 \{sparsity 0\.5, "
                     r"kernel \[64, 64\]\}, .*\(\d+ more\)\}$", text, re.M), text
    assert re.search(r"^\s+early_stopping val_r2 did not improve by more than 0 for 3 epochs; best 0\.48 at epoch 3$",
                     text, re.M), text


def test_a_metrics_stream_that_keeps_dropping_is_polled_on_to_the_end_each_epoch_once(api, api_url, bucket,
                                                                                      monkeypatch):
    """Issue 37: a follow whose stream kept dropping ended without the epochs it had yet to bring. The
    real API answers the polls; only the stream's drop is made (after two epochs, as a network's would)."""
    from trainjobs import storage
    from trainjobs.client import cli as client_cli
    from trainjobs.client.api import ApiError, Client, StreamEvent
    from trainjobs.job_paths import JobPaths

    job = api.post("/v1/jobs", json={"dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp"}}).json()
    # Attempt 2 resumed from its checkpoint after epoch 1: its epochs 2 and 3 are new ones.
    history = [{"attempt": a, "epoch": e, "loss": 1.0 / e} for a, e in ((1, 1), (1, 2), (1, 3), (2, 2), (2, 3))]
    storage.write_json(JobPaths.for_job(job["id"]).metrics, {"attempt": 2, "history": history})
    api.post(f"/v1/jobs/{job['id']}/cancel")

    def dropping(self: Client, job_id: str, what: str, reconnects: int = 5) -> object:
        yield StreamEvent("status", {"status": "RUNNING"}, None)
        for rec in history[:2]:
            yield StreamEvent("metric", rec, f"{rec['attempt']}.{rec['epoch']}")
        raise ApiError(0, {"error": {"error": "stream", "message": f"the {what} stream dropped 6 times in a row"}})

    monkeypatch.setattr(Client, "follow", dropping)
    c = Client(api_url=api_url, api_key=api.headers["authorization"].split()[1])
    events = list(client_cli._stream_or_poll(c, job["id"], "metrics", poll_s=0.01))
    assert [e.data for e in events if e.event == "metric"] == history  # each once, none missing
    assert events[-1] == StreamEvent("end", {"status": "CANCELLED"}, None)

    def refused(self: Client, job_id: str, what: str, reconnects: int = 5) -> object:
        raise ApiError(422, {"error": {"error": "too_large", "message": "metrics.json is over its cap"}})
        yield

    monkeypatch.setattr(Client, "follow", refused)  # what polling cannot help with is said, not polled
    with pytest.raises(ApiError, match="too_large"):
        list(client_cli._stream_or_poll(c, job["id"], "metrics", poll_s=0.01))
