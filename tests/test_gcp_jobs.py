"""What a job does the same way on both Google clouds, Cloud TPU and Compute Engine: one test per
behaviour, parametrised over the clouds (each cloud's own behaviour: test_gcp_tpu_jobs.py,
test_gcp_gpu_jobs.py). The startup script boots the real agent on CPU devices standing in for the
chips or GPUs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TERMINAL_STATUSES as TERMINAL
from tests.conftest import wait_for_job as wait
from tests.support import eventually
from tests.support.gcp import gpu_spec, make_gce, make_gcp, tpu_spec  # noqa: F401 - fixtures
from trainjobs import storage
from worker.gcs_channel import GcsJobChannel


@dataclass(frozen=True)
class Cloud:
    """What differs between the clouds for these tests: how to stand one up, a one-machine spot job's
    accelerator, and the fake's machines."""

    stack: str  # the fixture that makes its stack
    spot_spec: Callable[..., dict[str, Any]]
    machines: Callable[[Any], list[str]]  # the fake's machine names


CLOUDS = {
    "tpu": Cloud("make_gcp", lambda **o: tpu_spec(spot=True, **o), lambda fake: fake.node_names()),
    "gpu": Cloud("make_gce", lambda **o: gpu_spec(count=1, spot=True, **o), lambda fake: fake.instance_names()),
}


@pytest.mark.tf
@pytest.mark.parametrize("cloud", CLOUDS.values(), ids=CLOUDS.keys())
def test_a_preempted_machine_is_replaced_and_the_new_attempt_resumes_from_the_checkpoint(
        cloud: Cloud, request: pytest.FixtureRequest, api: Any, database_url: str, tmp_path: Path) -> None:
    gcp = request.getfixturevalue(cloud.stack)(boot=True)
    gcp.start_worker(database_url, tmp_path / "staging")
    # Small batches, one step per call: epochs long enough that the preemption lands mid-training.
    job = api.post("/v1/jobs", json=cloud.spot_spec(steps_per_execution=1,
                                                    training={"epochs": 3, "per_replica_batch_size": 4})).json()
    job_dir = GcsJobChannel().job_dir(job["id"])
    taken = eventually(lambda: storage.read_json(f"{job_dir}/checkpoints/latest.json"), 600,
                       "the first attempt wrote a checkpoint", every=0.5)
    [machine] = cloud.machines(gcp.fake)
    gcp.fake.preempt(machine)
    done = wait(api, job["id"], lambda j: j["status"] in TERMINAL, timeout=600)
    assert (done["status"], done["attempt"]) == ("SUCCEEDED", 2), done
    assert done["runtime"]["initial_epoch"] == taken["epoch"] >= 1
    history = storage.read_json(f"{job_dir}/artifacts/history.json")
    assert history is not None and [e["epoch"] for e in history] == [1, 2, 3]
    assert cloud.machines(gcp.fake) == []
