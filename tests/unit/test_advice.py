"""The advisor's rules (trainjobs/advice.py): for each, a job built to trigger it and jobs built not to,
from the shapes a real job has: the runtime is agent/plan.py's own plan for the spec, the epochs are
EpochRecorder's entries, the machines the worker's timings. No advice without the numbers behind it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agent.plan import Hardware, resolve_plan
from trainjobs.advice import (
    DISPATCH_SMALL_STEP_MS, INPUT_BOUND_WAIT_FRACTION, OVERSIZED_STEPS_PER_EPOCH, Advice, advise,
)
from trainjobs.advice_facts import job_facts
from trainjobs.catalogue import GPU_TYPES, SPOT_PRICE_FRACTION_MAX
from trainjobs.spec import JobSpec
from worker.advising import JobAdvisor
from worker.memory_cloud import MemoryCloud

L4 = {"type": "gpu", "gpu_type": "nvidia-l4"}
T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def _spec(**overrides: Any) -> JobSpec:
    base: dict[str, Any] = {"dataset": {"source": "sklearn:digits"}, "model": {"name": "mlp"}, "accelerator": L4,
                            "training": {"epochs": 5, "per_replica_batch_size": 256}}
    training = {**base["training"], **overrides.pop("training", {})}
    return JobSpec.model_validate({**base, **overrides, "training": training})


def _runtime(spec: JobSpec, train_examples: int = 50_000) -> dict[str, Any]:
    acc = spec.accelerator
    kind = acc.type
    cc = GPU_TYPES[acc.gpu_type].compute_capability if kind == "gpu" else None  # type: ignore[union-attr]
    replicas = spec.num_replicas
    plan = resolve_plan(spec, Hardware(kind, replicas, cc), spec.resolved_strategy, replicas, train_examples)
    return plan.as_dict() | {"dataset": {"train_examples": train_examples, "validation_examples": 10_000}}


def _epochs(n: int = 5, *, wait: float = 0.02, step_ms: float = 41.0, batch: int = 256, **more: float) -> list[dict[str, Any]]:
    """EpochRecorder's entries: the first epoch traces and compiles, ten times slower and all waiting."""
    out = []
    for epoch in range(1, n + 1):
        ms = step_ms * (10 if epoch == 1 else 1)
        out.append({"epoch": epoch, "attempt": 1, "loss": 0.3, "accuracy": 0.9, "learning_rate": 0.001,
                    "examples_per_sec": round(batch * 1000 / ms, 2), "step_time_ms": ms,
                    "input_wait_fraction": 0.9 if epoch == 1 else wait, "train_seconds": 8.0, "epoch_seconds": 9.0,
                    "executions": 25, "steps": 195, **more})
    return out


_HEALTHY: Any = object()  # stands for _epochs(): None is a history too (no metrics.json)


def _advice(spec: JobSpec, *, runtime: dict[str, Any] | None = None, history: Any = _HEALTHY, metrics: Any = None,
            machines: Any = None, attempts: int = 1) -> dict[str, Advice]:
    facts = job_facts(spec, runtime=_runtime(spec) if runtime is None else runtime,
                      history=_epochs() if history is _HEALTHY else history, metrics=metrics, machines=machines,
                      attempts=attempts)
    return {a.rule: a for a in advise(facts)}


def test_a_well_configured_job_gets_no_advice() -> None:
    assert _advice(_spec()) == {}


# --- input_bound ----------------------------------------------------------------------------------------------


def test_an_input_bound_job_is_told_to_cache_with_its_wait_over_the_epochs_after_the_first() -> None:
    advice = _advice(_spec(), history=_epochs(wait=0.42))["input_bound"]
    assert advice.evidence == {"input_wait_fraction": 0.42, "epochs": "2-5", "threshold": INPUT_BOUND_WAIT_FRACTION}
    assert advice.suggestion.startswith("training.cache_dataset: true")
    assert advice.expected_gain == "up to 1.7x: the 42% of step time spent waiting on input"


@pytest.mark.parametrize("training, shard_examples, suggested", [
    ({"cache_dataset": True}, 4096, "dataset.options.shard_examples: 1000 "),
    ({"cache_dataset": True}, 1000, "the pipeline already caches"),
], ids=["few-shards", "nothing-left-in-the-spec"])
def test_a_cached_input_bound_job_is_told_what_is_left(training: dict[str, Any], shard_examples: int,
                                                        suggested: str) -> None:
    spec = _spec(training=training, dataset={"source": "sklearn:digits", "options": {"shard_examples": shard_examples}})
    advice = _advice(spec, runtime=_runtime(spec, train_examples=8000), history=_epochs(wait=0.5))["input_bound"]
    assert advice.suggestion.startswith(suggested)


@pytest.mark.parametrize("history", [_epochs(wait=0.1), _epochs(n=1, wait=0.9)], ids=["little-wait", "only-compile-epoch"])
def test_a_job_that_does_not_wait_on_input_steadily_is_not_input_bound(history: list[dict[str, Any]]) -> None:
    assert "input_bound" not in _advice(_spec(), history=history)


# --- dispatch_bound ------------------------------------------------------------------------------------------


def test_small_steps_one_per_call_are_dispatch_bound_and_the_evidence_says_no_split_was_reported() -> None:
    spec = _spec(steps_per_execution=1)
    advice = _advice(spec, history=_epochs(step_ms=3.2))["dispatch_bound"]
    assert advice.suggestion == "steps_per_execution: 32"
    assert advice.evidence["steps_per_execution"] == 1 and advice.evidence["step_time_ms"] == 3.2
    assert "no host/device split" in str(advice.evidence["basis"]) and advice.expected_gain.startswith("not measured")


def test_with_the_step_split_the_host_share_decides_and_bounds_the_gain() -> None:
    spec = _spec(steps_per_execution=4)
    split = {"step_time_breakdown": {"device_ms_per_step": 2.0, "host_ms_per_step": 2.0, "input_wait_ms_per_step": 0.0}}
    advice = _advice(spec, history=_epochs(step_ms=4.0), metrics=split)["dispatch_bound"]
    assert advice.evidence["host_share"] == 0.5 and advice.expected_gain.startswith("up to 2x")
    quiet = {"step_time_breakdown": {"device_ms_per_step": 9.0, "host_ms_per_step": 1.0, "input_wait_ms_per_step": 0.0}}
    assert "dispatch_bound" not in _advice(spec, history=_epochs(step_ms=4.0), metrics=quiet)


@pytest.mark.parametrize("spe, step_ms", [("auto", 3.2), (1, DISPATCH_SMALL_STEP_MS * 3)], ids=["spe-auto", "long-steps"])
def test_auto_steps_per_execution_or_long_steps_are_not_dispatch_bound(spe: Any, step_ms: float) -> None:
    assert "dispatch_bound" not in _advice(_spec(steps_per_execution=spe), history=_epochs(step_ms=step_ms))


# --- mixed_precision -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("accelerator, suggested", [
    (L4, "precision: mixed_float16"),
    ({"type": "gpu", "gpu_type": "nvidia-tesla-t4"}, "precision: mixed_float16"),
    ({"type": "tpu", "tpu_type": "v5litepod-8"}, "precision: mixed_bfloat16"),
], ids=["l4", "t4", "tpu"])
def test_float32_on_hardware_with_fast_low_precision_is_told_the_precision_auto_would_pick(
        accelerator: dict[str, Any], suggested: str) -> None:
    spec = _spec(accelerator=accelerator, precision="float32", training={"per_replica_batch_size": 128})
    advice = _advice(spec, runtime=_runtime(spec, train_examples=500_000))["mixed_precision"]
    assert advice.suggestion == suggested and advice.evidence["precision"] == "float32"


@pytest.mark.parametrize("accelerator, precision", [
    ({"type": "gpu", "gpu_type": "nvidia-tesla-p100"}, "auto"),  # no tensor cores: float32 is its fast precision
    (L4, "auto"),
    ({"type": "cpu", "replicas": 1}, "float32"),
], ids=["p100", "l4-auto", "cpu"])
def test_no_mixed_precision_advice_where_float32_is_the_fast_choice_or_not_chosen(accelerator: dict[str, Any],
                                                                                   precision: str) -> None:
    assert "mixed_precision" not in _advice(_spec(accelerator=accelerator, precision=precision))


# --- small_batch ---------------------------------------------------------------------------------------------


def test_a_small_batch_on_a_gpu_is_told_a_larger_one_with_sqrt_scaling() -> None:
    spec = _spec(training={"per_replica_batch_size": 16})
    advice = _advice(spec, history=_epochs(batch=16, step_ms=2.0))["small_batch"]
    assert advice.suggestion == "training.per_replica_batch_size: 64 with training.lr_scaling: sqrt"
    assert advice.evidence["per_replica_batch_size"] == 16 and advice.expected_gain.startswith("at most 4x")


@pytest.mark.parametrize("batch, train_examples", [(64, 50_000), (16, 900)], ids=["batch-fills", "too-little-data"])
def test_no_small_batch_advice_for_a_full_batch_or_data_too_small_for_a_larger_one(batch: int, train_examples: int) -> None:
    spec = _spec(training={"per_replica_batch_size": batch})
    assert "small_batch" not in _advice(spec, runtime=_runtime(spec, train_examples), history=_epochs(batch=batch))


# --- steps_per_execution_capped -----------------------------------------------------------------------------


def test_steps_per_execution_capped_by_a_short_epoch_with_most_time_outside_training() -> None:
    spec = _spec(steps_per_execution=64, training={"epochs": 20})
    runtime = _runtime(spec, train_examples=2560)  # 10 steps an epoch
    advice = _advice(spec, runtime=runtime, history=_epochs(train_seconds=0.8, epoch_seconds=2.0))
    capped = advice["steps_per_execution_capped"]
    assert capped.evidence["steps_per_execution_asked"] == 64 and capped.evidence["steps_per_epoch"] == 10
    assert capped.evidence["outside_training_share"] == 0.6
    assert capped.suggestion.startswith("training.checkpoint_every_epochs: 5")


@pytest.mark.parametrize("train_examples, train_s", [(50_000, 0.8), (2560, 1.9)], ids=["long-epoch", "little-overhead"])
def test_no_capped_advice_for_an_epoch_long_enough_or_little_time_outside_training(train_examples: int,
                                                                                    train_s: float) -> None:
    spec = _spec(steps_per_execution=64, training={"epochs": 20})
    advice = _advice(spec, runtime=_runtime(spec, train_examples),
                     history=_epochs(train_seconds=train_s, epoch_seconds=2.0))
    assert "steps_per_execution_capped" not in advice


# --- spot_cost ---------------------------------------------------------------------------------------------


def _machines(*held: tuple[float, float]) -> list[dict[str, Any]]:
    """jobs.machines for attempts holding a machine (seconds held, seconds to the agent's first report)."""
    out, at = [], T0
    for attempt, (seconds, startup) in enumerate(held, 1):
        out.append({"name": f"m-{attempt}", "attempt": attempt, "requested_at": at.isoformat(),
                    "ready_at": None, "first_report_at": (at + timedelta(seconds=startup)).isoformat(),
                    "deleted_at": (at + timedelta(seconds=seconds)).isoformat()})
        at += timedelta(seconds=seconds)
    return out


def test_a_preempted_spot_job_gets_its_cost_against_on_demand_from_the_catalogue_prices() -> None:
    spec = _spec(accelerator={**L4, "spot": True})
    advice = _advice(spec, machines=_machines((1800, 120), (1200, 180)), attempts=2)["spot_cost"]
    price = GPU_TYPES["nvidia-l4"].usd_per_gpu_hour
    assert advice.evidence["machine_hours"] == round(3000 / 3600, 4)
    assert advice.evidence["spot_usd_at_most"] == round(3000 / 3600 * price * SPOT_PRICE_FRACTION_MAX, 4)
    assert advice.evidence["on_demand_usd_at_most"] == round((3000 - 180) / 3600 * price, 4)
    assert advice.suggestion.startswith("keep accelerator.spot: true") and advice.expected_gain.startswith("spot cost at most")


def test_a_spot_job_whose_restarts_outweigh_its_discount_is_told_to_run_on_demand() -> None:
    spec = _spec(accelerator={**L4, "spot": True})
    # Three restarts, each waiting most of an hour for capacity before its agent reported.
    machines = _machines((600, 60), (3600, 3000), (3600, 3000), (3600, 3000))
    advice = _advice(spec, machines=machines, attempts=4)["spot_cost"]
    assert advice.suggestion == "accelerator.spot: false"
    assert advice.evidence["spot_usd_at_most"] > advice.evidence["on_demand_usd_at_most"]


@pytest.mark.parametrize("spot, attempts", [(False, 2), (True, 1)], ids=["on-demand", "never-preempted"])
def test_no_spot_advice_without_a_preempted_spot_machine(spot: bool, attempts: int) -> None:
    spec = _spec(accelerator={**L4, "spot": spot})
    assert "spot_cost" not in _advice(spec, machines=_machines(*[(900, 60)] * attempts), attempts=attempts)


# --- oversized_machine -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("accelerator, train_examples, suggested", [
    ({"type": "gpu", "gpu_type": "nvidia-l4", "count": 4}, 8192, "accelerator.count: 2"),
    ({"type": "cpu", "replicas": 4}, 5120, "accelerator.replicas: 1"),
    ({"type": "tpu", "tpu_type": "v5litepod-8"}, 20_000, "accelerator.tpu_type: v5litepod-4"),
], ids=["gpus", "cpus", "tpu"])
def test_a_machine_too_large_for_the_data_is_told_the_size_that_keeps_full_epochs(
        accelerator: dict[str, Any], train_examples: int, suggested: str) -> None:
    spec = _spec(accelerator=accelerator, precision="auto")
    advice = _advice(spec, runtime=_runtime(spec, train_examples))["oversized_machine"]
    assert advice.suggestion == suggested
    assert advice.evidence["steps_per_epoch"] < OVERSIZED_STEPS_PER_EPOCH
    assert advice.evidence["train_examples"] == train_examples


def test_a_machine_whose_epochs_are_long_enough_is_not_oversized() -> None:
    spec = _spec(accelerator={"type": "gpu", "gpu_type": "nvidia-l4", "count": 4})
    assert "oversized_machine" not in _advice(spec)


# --- what the job's own code wrote -----------------------------------------------------------------------


HOSTILE: list[Any] = [
    None, "epochs", [None, 1, "x", {"epoch": True}], [{"epoch": 2, "attempt": 1, "examples_per_sec": float("nan"),
                                                       "step_time_ms": 1e400, "input_wait_fraction": 7}],
    [{"epoch": "2", "attempt": 1, "examples_per_sec": "fast", "step_time_ms": [1], "input_wait_fraction": {"a": 1}}],
]


@pytest.mark.parametrize("history", HOSTILE)
def test_a_history_the_job_garbled_gives_no_throughput_advice_and_no_error(history: Any) -> None:
    spec = _spec(steps_per_execution=1)
    assert _advice(spec, history=history) == {}


def test_a_runtime_the_job_garbled_gives_no_plan_advice() -> None:
    spec = _spec(precision="float32", steps_per_execution=1)
    runtime = {**_runtime(spec), "precision": "<img src=x onerror=alert(1)>", "steps_per_execution": 1e300}
    assert _advice(spec, runtime=runtime, history=_epochs(step_ms=3.0)) == {}


# --- where it is shown --------------------------------------------------------------------------------------


def test_trainjobs_status_prints_each_advice_with_its_numbers_and_gain_as_plain_text(capsys: Any) -> None:
    from trainjobs.client.terminal import job_detail, show

    spec = _spec(steps_per_execution=1)
    advice = [a.as_dict() for a in advise(job_facts(spec, runtime=_runtime(spec), history=_epochs(step_ms=3.2),
                                                    metrics=None, machines=None, attempts=1))]
    advice.append({"rule": "[red]x[/red]", "evidence": {"n": 1}, "suggestion": "s", "expected_gain": "g"})
    show(job_detail({"id": "j1", "name": "n", "status": "RUNNING", "attempt": 1, "spec": {}, "progress": 0.5,
                     "created_at": "2026-01-01T00:00:00+00:00", "advice": advice}))
    lines = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
    at = lines.index("advice dispatch_bound: steps_per_execution: 32")
    assert lines[at + 1].startswith("because steps_per_execution 1, step_time_ms 3.2, epochs 2-5")
    assert lines[at + 2].startswith("gain not measured")
    assert "advice [red]x[/red]: s" in lines  # a rule's text is never read as markup


# --- the worker's side: read metrics.json on a new epoch, write only a change --------------------------------


class _Channel(MemoryCloud):
    """The in-memory cloud's channel with a metrics.json: counts the reads of it."""

    def __init__(self, history: list[dict[str, Any]]):
        super().__init__()
        self.epochs, self.reads = history, 0

    def history(self, job_id: str) -> Any:  # type: ignore[override]
        self.reads += 1
        return self.epochs


def test_the_worker_reads_the_history_once_an_epoch_and_hands_back_only_changed_advice() -> None:
    spec = _spec(steps_per_execution=1)
    channel = _Channel(_epochs(n=3, step_ms=3.2))
    advisor = JobAdvisor(channel, "job", stored=None)

    def poll(epoch: int, final: bool = False) -> Any:
        return advisor.changed(spec, runtime=_runtime(spec), metrics={"epoch": epoch, "attempt": 1}, machines=None,
                               attempts=1, final=final)

    first = poll(3)
    assert [a["rule"] for a in first] == ["dispatch_bound"] and channel.reads == 1
    assert poll(3) is None and channel.reads == 1  # the same epoch: nothing read, nothing to write
    channel.epochs = _epochs(n=4, step_ms=60.0)  # the fourth epoch's steps are long: no advice any more
    assert poll(4) == [] and channel.reads == 2
    assert poll(4, final=True) is None and channel.reads == 3  # the end always reads; unchanged, not written


def test_a_resumed_attempts_first_epoch_is_left_out_and_the_evidence_names_the_epochs_read() -> None:
    history = _epochs(n=5, wait=0.42)
    history[2] = {**history[2], "attempt": 2, "input_wait_fraction": 0.95}  # epoch 3: a new attempt compiles
    history[3:] = [{**e, "attempt": 2} for e in history[3:]]
    advice = _advice(_spec(), history=history, attempts=2)["input_bound"]
    assert advice.evidence["epochs"] == "2, 4-5" and advice.evidence["input_wait_fraction"] == 0.42


@pytest.mark.parametrize("host_seconds, fires", [(4.0, True), (0.8, False)], ids=["half-on-host", "tenth-on-host"])
def test_while_running_the_epochs_host_seconds_give_the_host_share(host_seconds: float, fires: bool) -> None:
    spec = _spec(steps_per_execution=4)
    advice = _advice(spec, history=_epochs(step_ms=4.0, host_seconds=host_seconds))  # of 8 train seconds
    assert ("dispatch_bound" in advice) is fires
    if fires:
        assert advice["dispatch_bound"].evidence["host_share"] == 0.5


def test_an_input_bound_program_is_told_what_to_change_in_its_own_pipeline() -> None:
    spec = JobSpec.model_validate({"program": {"source": "train.py"}, "accelerator": L4})
    facts = job_facts(spec, runtime=None, history=_epochs(wait=0.6), metrics=None, machines=None, attempts=1)
    [advice] = advise(facts)
    assert advice.rule == "input_bound" and advice.suggestion.startswith("in the program's input pipeline")
