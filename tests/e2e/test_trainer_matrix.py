"""Every strategy x precision the validator accepts for a CPU run trains for real on the local
provisioner (agent processes; two with TF_CONFIG for multi-worker) and exports a SavedModel and a
TFLite model; every pair the validator refuses says why. steps_per_execution (1 and 3) and the four
TFLite quantizations are spread over the pairs: each strategy and each precision runs under both step
counts and is exported under every quantization. The full product (every pair under both step counts)
was twice the jobs, a fifth of the whole suite's CPU time on two cores (issue 19).

The combinations come from the validator: each is tried through JobSpec.model_validate, so a rule
added to the spec changes what this module trains. All accepted jobs are submitted at once to one
API + worker for the module and run a few at a time; each test then judges one job.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from pydantic import ValidationError

from tests.support.jobs import module_jobs, wait_for_job
from trainjobs import storage
from trainjobs.job_paths import ARTIFACT_HISTORY, ARTIFACT_METRICS, JobPaths
from trainjobs.spec import JobSpec, describe_errors
from trainjobs.spec.task import LOSSES
from trainjobs.states import TERMINAL

pytestmark = pytest.mark.tf

STRATEGIES = ("auto", "default", "one_device", "mirrored", "multi_worker_mirrored")
PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
# 3: `auto` resolves to 4 on a CPU, and 3 divides none of the epochs here (10 or 20 steps), so every
# strategy runs a shorter last call in each epoch (issue 11: steps used to be dropped instead).
STEPS_PER_EXECUTION = (1, 3)
QUANTIZATIONS = ("none", "dynamic", "float16", "int8")
TASKS = ("classification", "binary", "multilabel", "regression")  # issue 21: each on its own data (_write_datasets)
# The CPU devices each strategy needs: (replicas per worker, workers). `auto` over two devices
# resolves to mirrored.
PLACEMENT = {"auto": (2, 1), "default": (1, 1), "one_device": (1, 1), "mirrored": (2, 1),
             "multi_worker_mirrored": (1, 2)}
RESOLVED_STRATEGY = {"auto": "mirrored"}
RESOLVED_PRECISION = {"auto": "float32"}  # precision `auto` on a CPU

EXAMPLES, FEATURES, CLASSES = 400, 16, 4  # 320 train / 80 validation
EPOCHS, PER_REPLICA_BATCH = 2, 16
JOB_S = 420  # how long one job of the matrix may take, before scaling
PARALLEL_MACHINES = 4


@dataclass(frozen=True)
class Case:
    strategy: str
    precision: str
    steps_per_execution: int
    quantization: str
    task: str = "classification"
    loss: str | None = None

    @property
    def id(self) -> str:
        return f"{self.strategy}-{self.precision}-spe{self.steps_per_execution}-{self.quantization}-{self.task}"

    def spec(self, folder: str) -> dict[str, Any]:
        replicas, workers = PLACEMENT[self.strategy]
        return {
            "name": self.id, "accelerator": {"type": "cpu", "replicas": replicas}, "workers": workers,
            "strategy": self.strategy, "precision": self.precision, "steps_per_execution": self.steps_per_execution,
            "task": self.task, "dataset": {"source": f"{folder}/{self.task}.npz"}, "model": {"name": "mlp"},
            "training": {"epochs": EPOCHS, "per_replica_batch_size": PER_REPLICA_BATCH, "learning_rate": 0.01,
                         "loss": self.loss},
            "export": {"tflite": {"quantization": self.quantization, "calibration_examples": 32}},
        }


def _combinations() -> tuple[list[Case], list[tuple[Case, list[dict[str, str]]]]]:
    """(accepted, refused with the validator's reasons). Steps per execution alternate like a
    checkerboard over strategy x precision, and the quantization turns along the same diagonals, so
    each strategy and each precision meets both step counts, all four quantizations and all three tasks."""
    accepted, refused = [], []
    for (s, strategy), (p, precision) in itertools.product(enumerate(STRATEGIES), enumerate(PRECISIONS)):
        spe = STEPS_PER_EXECUTION[(s + p) % len(STEPS_PER_EXECUTION)]
        task = TASKS[(s + p) % len(TASKS)]
        losses = LOSSES[task]  # each task's losses turn with the strategy
        case = Case(strategy, precision, spe, QUANTIZATIONS[(s + p) % len(QUANTIZATIONS)], task, losses[s % len(losses)])
        try:
            JobSpec.model_validate(case.spec("/data"))
        except ValidationError as exc:
            refused.append((case, describe_errors(exc.errors())))
        else:
            accepted.append(case)
    return accepted, refused


ACCEPTED, REFUSED = _combinations()


def test_every_combination_is_trained_or_refused_with_a_reason() -> None:
    assert len(ACCEPTED) + len(REFUSED) == len(STRATEGIES) * len(PRECISIONS)
    for case, errors in REFUSED:
        assert errors and all(e["field"] != "body" and e["reason"] for e in errors), (case.id, errors)
    for option in (*STRATEGIES, *PRECISIONS):
        cases = [c for c in ACCEPTED if option in (c.strategy, c.precision)]
        assert {c.steps_per_execution for c in cases} == set(STEPS_PER_EXECUTION), option
        assert {c.quantization for c in cases} == set(QUANTIZATIONS), option
        assert {c.task for c in cases} == set(TASKS), option
    assert {c.loss for c in ACCEPTED} == {loss for losses in LOSSES.values() for loss in losses}


# --- one stack for the module, every accepted job submitted up front ------------------------------


def _write_datasets(folder: Path) -> None:
    """Well separated clusters: a few dozen steps learn them, so scores say whether an export predicts,
    not how lucky the initialisation was. Classes: the cluster; binary: its parity; regression: a
    linear function of the features in units far from 0 (the model answers in them); multilabel: three
    tags, each a rule over the cluster."""
    rng = np.random.default_rng(0)
    centers = rng.normal(0, 4, (CLASSES, FEATURES))
    y = rng.integers(0, CLASSES, EXAMPLES)
    x = (centers[y] + rng.normal(0, 1, (EXAMPLES, FEATURES))).astype(np.float32)
    np.savez(folder / "classification.npz", x=x, y=y.astype(np.int64))
    np.savez(folder / "binary.npz", x=x, y=(y % 2).astype(np.int64))
    tags = np.stack([y % 2 == 0, y >= 2, y == 1], axis=1)  # three tags per example, from its cluster
    np.savez(folder / "multilabel.npz", x=x, y=tags.astype(np.int64))
    target = 300.0 + 20.0 * x @ rng.normal(0, 1, FEATURES) / np.sqrt(FEATURES)
    np.savez(folder / "regression.npz", x=x, y=(target + rng.normal(0, 2, EXAMPLES)).astype(np.float32))


MatrixJobs = tuple[httpx.Client, dict[str, str]]  # the API client, and each accepted case's job id


@pytest.fixture(scope="module")
def matrix_jobs(database_url: str, api_url: str, gcs_emulator: Any, tmp_path_factory: pytest.TempPathFactory,
                request: pytest.FixtureRequest) -> Iterator[MatrixJobs]:
    from service.db.session import get_engine
    from worker.driver import DriverConfig
    from worker.gcs_channel import GcsJobChannel
    from worker.loop import Worker, WorkerConfig
    from worker.local.provisioner import LocalProvisioner
    from worker.staging_adapter import GcsStager

    tmp = tmp_path_factory.mktemp("matrix")
    with module_jobs(database_url, api_url, "matrix") as (client, _, monkey):
        # Agents inherit this environment: one compute thread each, as several share two cores.
        monkey.setenv("TF_NUM_INTRAOP_THREADS", "1")
        monkey.setenv("TF_NUM_INTEROP_THREADS", "2")
        monkey.setenv("TRAINJOBS_HEARTBEAT_S", "2")
        _write_datasets(tmp)
        monkey.setenv("TRAINJOBS_HOST_DATA_DIRS", str(tmp))  # host paths are off unless the operator allows them

        provisioner = LocalProvisioner(tmp / "machines", devices=2, slots=PARALLEL_MACHINES)
        worker = Worker(get_engine(database_url), provisioner, GcsJobChannel(), GcsStager(tmp / "staging"),
                        WorkerConfig(concurrency=PARALLEL_MACHINES + 2, lease_s=60, heartbeat_s=2, poll_s=0.3,
                                     name="matrix", driver=DriverConfig(poll_s=0.3)))
        jobs = {}
        # Only the jobs of the tests selected (`-k multi_worker` trains the multi-worker cases alone).
        # Multi-worker jobs first: they hold two processes each, so they gain most from an idle machine.
        selected = _selected_cases(request.session.items)
        for case in sorted(selected, key=lambda c: c.strategy != "multi_worker_mirrored"):
            r = client.post("/v1/jobs", json=case.spec(str(tmp)))
            assert r.status_code == 201, (case.id, r.text)
            jobs[case.id] = r.json()["id"]
        worker.start()
        try:
            yield client, jobs
        finally:
            worker.shutdown(timeout=10)
            for machine in provisioner.list({}):
                provisioner.delete(machine.name)
            provisioner.close()


def _selected_cases(items: list[pytest.Item]) -> list[Case]:
    """The accepted cases that selected tests of this module judge."""
    wanted = set()
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.module is not None and item.module.__name__ == __name__ and isinstance(params.get("case"), Case):
            wanted.add(params["case"])
    return [c for c in ACCEPTED if c in wanted]


@pytest.mark.parametrize("case", ACCEPTED, ids=[c.id for c in ACCEPTED])
def test_accepted_combination_trains_as_asked_and_exports(case: Case, matrix_jobs: MatrixJobs) -> None:
    client, jobs = matrix_jobs
    job = wait_for_job(client, jobs[case.id], TERMINAL, timeout=JOB_S)
    assert job["status"] == "SUCCEEDED", job.get("error")
    assert job["attempt"] == 1  # no machine was lost and replaced on the way

    runtime = job["runtime"]
    replicas, workers = PLACEMENT[case.strategy]
    strategy = RESOLVED_STRATEGY.get(case.strategy, case.strategy)
    assert (runtime["requested_strategy"], runtime["strategy"]) == (strategy, strategy)
    assert (runtime["replicas"], runtime["workers"]) == (replicas * workers, workers)
    assert runtime["precision"] == RESOLVED_PRECISION.get(case.precision, case.precision)
    assert runtime["steps_per_execution"] == case.steps_per_execution
    assert runtime["loss_scaling"] == (runtime["precision"] == "mixed_float16")

    # Each epoch ran all the steps its data and batch imply, steps_per_execution of them per
    # train-function call but the last, which ran the rest.
    assert runtime["steps_per_epoch"] == (EXAMPLES - EXAMPLES // 5) // runtime["global_batch_size"]
    paths = JobPaths.for_job(jobs[case.id])
    history = storage.read_json(paths.artifact(ARTIFACT_HISTORY))
    assert [e["epoch"] for e in history] == list(range(1, EPOCHS + 1))
    for entry in history:
        assert entry["steps"] == runtime["steps_per_epoch"]
        assert entry["executions"] == -(-runtime["steps_per_epoch"] // case.steps_per_execution)
        assert entry[{"regression": "val_r2", "multilabel": "val_f1_micro"}.get(case.task, "val_accuracy")] is not None

    manifest = {e["path"] for e in storage.read_json(paths.artifact_manifest)}
    assert {"saved_model/saved_model.pb", "model.tflite", ARTIFACT_METRICS, ARTIFACT_HISTORY} <= manifest
    final = storage.read_json(paths.final_metrics)
    assert final["tflite_quantization"] == case.quantization
    if case.task == "regression":  # scored from the exported models on the validation split
        assert final["saved_model_r2"] > 0.5, final
        assert final["tflite_r2"] >= final["saved_model_r2"] - 0.1, final
    elif case.task == "multilabel":
        assert final["saved_model_f1_micro"] > 0.9, final
        assert final["tflite_f1_micro"] >= final["saved_model_f1_micro"] - 0.05, final
    else:
        assert final["saved_model_accuracy"] > 0.9, final
        assert final["tflite_accuracy"] >= final["saved_model_accuracy"] - 0.05, final

    if workers > 1:
        # The other agent trained every epoch with the chief and never exported. The worker deletes
        # the machine as soon as the chief reports, wherever the other agent is then: waiting for the
        # chief, or still uploading its last epoch's status (phase still "training": a storage answer
        # seconds late keeps it there past the chief's export, issue 19). Either way its last word is
        # in: succeeded (it saw the chief finish) or terminated (the delete's SIGTERM), never a state
        # that says it still runs.
        other = storage.read_json(paths.status_of(1))
        assert (other["task_index"], other["epoch"], other["progress"]) == (1, EPOCHS, 1.0), other
        assert (other["state"], other["phase"]) in {("succeeded", "waiting_for_chief"), ("terminated", "training"),
                                                     ("terminated", "waiting_for_chief")}, other


@pytest.mark.parametrize("case", ACCEPTED, ids=[c.id for c in ACCEPTED])
def test_each_job_gets_the_advice_its_own_numbers_support(case: Case, matrix_jobs: MatrixJobs) -> None:
    """The advisor (trainjobs/advice.py) on jobs that really trained. Only what the numbers fix is asserted:
    whether a short step counts as dispatch-bound depends on how loaded the machine is (the rule itself:
    tests/unit/test_advice.py)."""
    client, jobs = matrix_jobs
    job = wait_for_job(client, jobs[case.id], TERMINAL, timeout=JOB_S)
    rules = {a["rule"]: a for a in job["advice"]}
    runtime = job["runtime"]
    # Two CPU replicas on one machine each get 10 steps an epoch, one replica would get 20; a multi-worker
    # job has one replica a worker, and no fewer replicas to offer.
    if case.strategy in ("auto", "mirrored"):
        oversized = rules["oversized_machine"]
        assert oversized["suggestion"] == "accelerator.replicas: 1", oversized
        assert oversized["evidence"]["steps_per_epoch"] == runtime["steps_per_epoch"] == 10, oversized
    else:
        assert "oversized_machine" not in rules, rules
    assert not {"mixed_precision", "small_batch", "spot_cost", "steps_per_execution_capped"} & rules.keys(), rules
    if (dispatch := rules.get("dispatch_bound")) is not None:  # without a step split, only at one step a call
        assert dispatch["evidence"]["steps_per_execution"] == case.steps_per_execution, dispatch
        assert "host_share" in dispatch["evidence"] or case.steps_per_execution == 1, dispatch
        assert dispatch["suggestion"] == f"steps_per_execution: {runtime['steps_per_epoch']}", dispatch
