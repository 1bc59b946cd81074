"""Jobs on the fake Google clouds, Cloud TPU and Compute Engine, the whole way: the startup script boots
the real agent on CPU devices standing in for the chips or GPUs. What a job does the same way on both
clouds is one test parametrised over them. The control plane without training (capacity, cancel,
adoption, quota, the reaper): tests/integration/test_gcp_tpu_jobs.py, test_gcp_gpu_jobs.py."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support.jobs import TERMINAL_STATUSES as TERMINAL
from tests.support.jobs import wait_for_job as wait
from tests.support import eventually
from tests.support.gcp import CLOUDS, Cloud, gpu_spec, tpu_spec
from trainjobs import storage
from trainjobs.spec import JobSpec
from trainjobs.spec.derived import hourly_price_usd, spot_hourly_price_usd
from trainjobs.vm_metadata import STARTUP_SCRIPT_KEY
from worker.gcs_channel import GcsJobChannel

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"


@pytest.mark.tf
@pytest.mark.parametrize("cloud", CLOUDS.values(), ids=CLOUDS.keys())
def test_a_preempted_machine_is_replaced_and_the_new_attempt_resumes_from_the_checkpoint(
        cloud: Cloud, request: pytest.FixtureRequest, api: Any, database_url: str, tmp_path: Path) -> None:
    gcp = request.getfixturevalue(cloud.stack)(boot=True)
    gcp.start_worker(database_url, tmp_path / "staging")
    # Small batches, one step per call: epochs long enough that the preemption lands mid-training.
    job = api.post("/v1/jobs", json=cloud.spec(spot=True, steps_per_execution=1,
                                               training={"epochs": 3, "per_replica_batch_size": 4})).json()
    job_dir = GcsJobChannel().job_dir(job["id"])
    taken = eventually(lambda: storage.read_json(f"{job_dir}/checkpoints/latest.json"), 600,
                       "the first attempt wrote a checkpoint", every=0.5)
    [machine] = cloud.machines(gcp.fake)
    gcp.fake.preempt(machine)
    done = wait(api, job["id"], lambda j: j["status"] in TERMINAL, timeout=600)
    assert (done["status"], done["attempt"]) == ("SUCCEEDED", 2), done
    # The first attempt may save again between the read above and its end (an epoch ends, or the
    # agent checkpoints in the preemption's grace), so the resume is from that checkpoint or a later
    # one, and not from the end of training.
    assert 1 <= taken["epoch"] <= done["runtime"]["initial_epoch"] < 3, (taken, done["runtime"])
    history = storage.read_json(f"{job_dir}/artifacts/history.json")
    assert history is not None and [e["epoch"] for e in history] == [1, 2, 3]
    assert cloud.machines(gcp.fake) == []
    # The advisor prices the attempts' machine time (issue 24): spot at its dearest against on-demand, from
    # the catalogue. A spot VM the cloud deleted itself has no end on the row, so it is not counted.
    [spot] = [a for a in done["advice"] if a["rule"] == "spot_cost"]
    held = [(datetime.fromisoformat(m["deleted_at"]) - datetime.fromisoformat(m["requested_at"])).total_seconds()
            for m in done["machines"] if m["deleted_at"] and m["requested_at"]]
    spec = JobSpec.model_validate(done["spec"])
    assert spot["evidence"]["attempts"] == 2 and spot["evidence"]["machine_hours"] == pytest.approx(sum(held) / 3600,
                                                                                                    abs=1e-4)
    assert spot["evidence"]["on_demand_usd_per_hour"] == round(hourly_price_usd(spec), 4)
    assert spot["evidence"]["spot_usd_at_most"] == pytest.approx(sum(held) / 3600 * spot_hourly_price_usd(spec), abs=1e-4)


@pytest.mark.tf
def test_a_tpu_job_trains_through_the_startup_script_and_its_node_is_deleted(api: Any, make_gcp: Any,
                                                                              database_url: str, tmp_path: Path) -> None:
    gcp = make_gcp(boot=True)
    gcp.start_worker(database_url, tmp_path / "staging")
    job = api.post("/v1/jobs", json=tpu_spec(training={"epochs": 1})).json()
    done = wait(api, job["id"], lambda j: j["status"] in TERMINAL, timeout=600)
    assert done["status"] == "SUCCEEDED", done
    assert done["runtime"]["strategy"] == "mirrored" and done["runtime"]["precision"] == "mixed_bfloat16"
    assert gcp.fake.node_names() == []
    [create] = [r for r in gcp.fake.requests if r.method == "POST" and r.path.endswith("/nodes")]
    assert "-m agent --job-dir" in create.body["metadata"][STARTUP_SCRIPT_KEY]  # type: ignore[index]


@pytest.mark.tf
def test_a_two_gpu_job_trains_on_one_vm_and_the_vm_is_deleted(api: Any, make_gce: Any, database_url: str,
                                                              tmp_path: Path) -> None:
    gce = make_gce(boot=True)
    gce.start_worker(database_url, tmp_path / "staging")
    job = api.post("/v1/jobs", json=gpu_spec(count=2, training={"epochs": 1})).json()
    done = wait(api, job["id"], lambda j: j["status"] in TERMINAL, timeout=600)
    assert done["status"] == "SUCCEEDED", done
    assert (done["runtime"]["strategy"], done["runtime"]["replicas"]) == ("mirrored", 2)
    assert gce.fake.instance_names() == []
    # The figures (issue 10 §4): each machine's timeline in order, and the wait for the first step.
    [machine] = done["machines"]
    times = [machine[k] for k in ("requested_at", "ready_at", "first_report_at", "deleted_at")]
    assert machine["attempt"] == 1 and all(times) and times == sorted(times), machine
    assert done["first_step_at"] > machine["first_report_at"] and done["time_to_first_step_s"] > 0
    [insert] = [r for r in gce.fake.requests if r.method == "POST" and r.path.endswith("/instances")]
    assert insert.body["machineType"].endswith("/g2-standard-24")



@pytest.mark.tf
def test_two_vms_train_together_under_multi_worker_mirrored(api: Any, make_gce: Any, database_url: str,
                                                           tmp_path: Path) -> None:
    gce = make_gce(boot=True, local_devices=1)
    gce.start_worker(database_url, tmp_path / "staging")
    job = api.post("/v1/jobs", json=gpu_spec(count=1, workers=2, training={"epochs": 1})).json()
    done = wait(api, job["id"], lambda j: j["status"] in TERMINAL, timeout=600)
    assert done["status"] == "SUCCEEDED", done
    assert (done["runtime"]["strategy"], done["runtime"]["replicas"]) == ("multi_worker_mirrored", 2)
    cluster = storage.read_json(f"{GcsJobChannel().job_dir(job['id'])}/cluster/attempt-1.json")
    assert cluster is not None and len(cluster["worker"]) == 2
    assert gce.fake.instance_names() == []


@pytest.mark.tf
@pytest.mark.parametrize("where", ["tpu", "two-vms"])
def test_a_program_job_trains_on_a_fake_cloud_and_the_chiefs_model_comes_back(
        where: str, request: pytest.FixtureRequest, api: Any, database_url: str, tmp_path: Path) -> None:
    """Issue 20 on the clouds, through the startup script: the program (a custom training loop that
    reports with tj.report) runs on a Cloud TPU VM, and on two Compute Engine VMs with the TF_CONFIG
    each host's startup script exports, where the runtime makes it multi-worker mirrored. Only the
    chief's model directory becomes the artifacts; the model is scored here on held-out patients."""
    import keras
    import numpy as np
    from sklearn.datasets import load_diabetes

    if where == "tpu":
        stack = request.getfixturevalue("make_gcp")(boot=True)
        accelerator: dict[str, Any] = {"accelerator": {"type": "tpu", "tpu_type": "v5litepod-8"}}
    else:
        stack = request.getfixturevalue("make_gce")(boot=True, local_devices=1)
        accelerator = {"accelerator": {"type": "gpu", "gpu_type": "nvidia-l4", "count": 1}, "workers": 2}
    stack.start_worker(database_url, tmp_path / "staging")
    source = api.post("/v1/modules", files={"file": ("regression_loop.py", PROGRAMS.joinpath(
        "regression_loop.py").read_bytes())}).json()["module"]
    spec = {**accelerator, "strategy": "auto", "program": {"source": source, "args": ["--units", "32"]},
            "training": {"epochs": 4, "global_batch_size": 32}}
    job = api.post("/v1/jobs", json=spec)
    assert job.status_code == 201, job.text
    done = wait(api, job.json()["id"], lambda j: j["status"] in TERMINAL, timeout=600)
    assert done["status"] == "SUCCEEDED", done
    runtime = done["runtime"]
    if where == "tpu":  # the fake's TPU host is CPU devices: the stand-in strategy, the TPU's precision
        assert (runtime["strategy"], runtime["precision"]) == ("mirrored", "mixed_bfloat16"), runtime
    else:
        assert (runtime["strategy"], runtime["workers"], runtime["replicas"]) == ("multi_worker_mirrored", 2, 2), runtime
        assert len([r for r in stack.fake.requests if r.method == "POST" and r.path.endswith("/instances")]) == 2
    history = api.get(f"/v1/jobs/{done['id']}/metrics").json()["epochs"]
    assert [e["epoch"] for e in history] == [1, 2, 3, 4]
    saved = tmp_path / "regressor.keras"
    saved.write_bytes(api.get(f"/v1/jobs/{done['id']}/artifacts/regressor.keras").content)
    x, y = load_diabetes(return_X_y=True)
    x = ((x - x.mean(axis=0)) / x.std(axis=0)).astype("float32")
    mae = float(np.mean(np.abs(keras.saving.load_model(saved).predict(x[-88:], verbose=0)[:, 0] - y[-88:] / 100.0)))
    assert mae < 0.85 * float(np.mean(np.abs(np.mean(y[:-88] / 100.0) - y[-88:] / 100.0)))
    assert (stack.fake.node_names() if where == "tpu" else stack.fake.instance_names()) == []
