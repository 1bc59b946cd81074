"""Every epoch runs all of its steps, whatever steps_per_execution is: an epoch that is not a whole
number of executions ends with a shorter train-function call (issue 11: epochs of 7 steps used to
be cut to 4 at steps_per_execution 4).

The training runs in one child process for the module, because it splits the CPU into two logical
devices, which TensorFlow allows only before its runtime starts. Multi-worker training is covered
by tests/test_trainer_matrix.py, whose step count divides no epoch.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import scaled

pytestmark = pytest.mark.tf

REPO = Path(__file__).resolve().parents[2]
# (strategy, steps per epoch, steps_per_execution, resumed at step, steps_per_execution auto's trial:
# (steps per call, calls) after one traced step, then jit_compile auto's XLA trial: "" none, "trains", or
# "either" where the TensorFlow version decides; or "bf16", precision auto's trial): none of them divides evenly.
Case = tuple[str, int, int, int, tuple[tuple[int, int], ...], str]
CASES: list[Case] = [
    ("default", 7, 4, 0, (), ""),
    ("one_device", 22, 4, 0, (), ""),
    ("mirrored", 7, 4, 0, (), ""),
    ("mirrored", 30, 4, 0, (), ""),
    ("mirrored", 7, 4, 3, (), ""),  # a mid-epoch checkpoint, off this plan's execution boundaries
    ("default", 5, 8, 0, (), ""),  # steps_per_execution above the epoch: the plan caps it, here the call does
    ("default", 30, 4, 0, ((1, 2), (4, 2)), ""),  # the trial trains the first 11 steps of the first epoch
    ("mirrored", 30, 4, 0, ((1, 2), (2, 3)), ""),
    # XLA's trial (on a CPU here; the agent tries it on a GPU only): 1 + 4 x 4 steps more. Under
    # MirroredStrategy on a CPU the XLA step fails on TF 2.21: training goes on without it, and only the
    # steps that trained count.
    ("default", 40, 4, 0, ((1, 2), (4, 2)), "trains"),
    ("mirrored", 40, 4, 0, ((1, 2), (4, 2)), "either"),
    # precision auto's trial (agent/precision_trial.py; the agent tries it with one replica on a CPU with
    # bfloat16 instructions, tried here whatever this CPU has): a model with a hidden layer, whose policy
    # changes, 3 x (1 + 4 x 4) steps more.
    ("default", 70, 4, 0, ((1, 2), (4, 2)), "bf16"),
    ("one_device", 70, 4, 0, ((1, 2), (4, 2)), "bf16"),
]
EPOCHS = 2
# training.profile's window in each case, (epoch, steps): whole executions from the epoch's first step.
# The resumed case asks for its first epoch, which the attempt began past: it is not traced.
PROFILED = [(2, 5), (2, 5), (2, 5), (2, 5), (1, 5), (2, 5), (2, 5), (2, 5), (2, 5), (2, 5), (2, 5), (2, 5)]


def _train(strategy_name: str, steps: int, spe: int, resumed_at: int, trial_calls: tuple[tuple[int, int], ...],
           xla: str, window: tuple[int, int]) -> dict[str, Any]:
    """Child process only: a tiny model trained with the agent's train function and fit loop, a profiler
    window open (agent/profiling.py)."""
    import dataclasses
    import functools
    import tempfile

    import keras
    import numpy as np
    import tensorflow as tf

    from trainjobs.spec import JobSpec
    from agent.devices import build_strategy
    from agent.input_wait import InputWaitMeter
    from agent.plan import Hardware, resolve_plan
    from agent.profiling import TraceWindow
    from agent.step_time import step_time_breakdown
    from tests.support.profile import xspace_planes
    from agent.step_functions import install_step_functions
    from agent.train import EpochRecorder, fit
    from agent.tuning import TrialPlan, fit_plan, run_trial, use_steps_per_execution
    from agent.xla_trial import try_xla_after
    from agent.precision_trial import try_bfloat16_after

    job = JobSpec.model_validate({"dataset": {"source": "sklearn:iris"}, "model": {"name": "mlp"},
                                  "training": {"epochs": EPOCHS, "global_batch_size": 4}})
    hardware = Hardware("cpu", 2, local_devices=2)
    strategy = build_strategy(strategy_name, hardware)
    plan = resolve_plan(job, hardware, strategy_name, strategy.num_replicas_in_sync, train_examples=4 * steps)
    plan = dataclasses.replace(plan, steps_per_execution=spe, initial_step=resumed_at,
                               initial_global_step=resumed_at)
    hidden = [keras.layers.Dense(8, activation="relu")] if xla == "bf16" else []
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), *hidden, keras.layers.Dense(2, activation="softmax")])
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", steps_per_execution=spe)
    meter = InputWaitMeter()
    train_function = install_step_functions(model, spe, meter)
    rng = np.random.default_rng(0)
    data = tf.data.Dataset.from_tensor_slices((rng.random((40, 3), np.float32), rng.integers(0, 2, 40))).repeat()
    batches = data.batch(4, drop_remainder=True)
    trial = None
    if trial_calls:  # as agent/tuning.py runs it, then the case's steps_per_execution whatever was measured
        trial = run_trial(model, train_function, batches, meter, TrialPlan(1, trial_calls), attempt=1)
        plan = use_steps_per_execution(plan, model, train_function, spe, "chosen by the test")
        if xla:  # measured against the case's steps_per_execution, whatever the trial chose
            trial = dataclasses.replace(trial, choice=dataclasses.replace(trial.choice, steps_per_execution=spe))
            # The bf16 trial's model is too small for the agent to try it (MIN_STEP_MS): tried all the same.
            alternative = functools.partial(try_bfloat16_after, min_step_ms=0.0) if xla == "bf16" else try_xla_after
            train_function, trial = alternative(trial, model, train_function, batches, meter, steps - trial.steps - 1)
    entries: list[dict[str, Any]] = []
    calls: list[list[int]] = []
    logdir = Path(tempfile.mkdtemp())
    trace = TraceWindow(logdir, *window, plan)

    def after_call(at: Any) -> None:
        trace.after_call(at)
        calls.append([at.epoch, at.step, at.global_step])

    recorder = EpochRecorder(fit_plan(plan, trial), 1, meter, train_function, lambda e, at: entries.append(e),
                             after_call, lambda p: None, before_call=trace.before_call, trial=trial)
    fit(model, fit_plan(plan, trial), batches, None, recorder)
    trace.close(recorder.position)
    profile = trace.report(entries, 1)
    planes = {name: xspace_planes((logdir / name).read_bytes()) for name in profile.get("files", [])}
    return {"plan_steps": plan.steps_per_epoch, "iterations": int(model.optimizer.iterations.numpy()),
            # XLA's and bfloat16's trials ran on a train function of their own: the one kept counts only its own steps.
            "steps_run": None if xla else train_function.steps_run, "calls": calls,
            "xla_note": trial.choice.note() if xla and trial is not None else None,
            "precision": trial.choice.precision if trial is not None else None,
            "policies": [layer.dtype_policy.name for layer in model.layers],
            "epochs": [{"steps": e["steps"], "executions": e["executions"], "resumed_at_step": e.get("resumed_at_step")}
                       for e in entries],
            "entries": entries, "breakdown": step_time_breakdown(entries, 1, spe), "profile": profile,
            "planes": planes}


def _child() -> None:
    from agent.devices import configure_local_devices

    configure_local_devices(2)
    print(json.dumps([_train(*case, window) for case, window in zip(CASES, PROFILED, strict=True)]))


@pytest.fixture(scope="module")
def trained() -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, __file__], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=scaled(300))
    assert proc.returncode == 0, proc.stderr[-5000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _calls(steps: int, spe: int, first: int) -> list[int]:
    """The step each call of one epoch ends at, from `first`."""
    ends, at = [], first
    while at < steps:
        at = min(at + spe, steps)
        ends.append(at)
    return ends


@pytest.mark.parametrize(("index", "case"), list(enumerate(CASES)), ids=[f"{c[0]}-{c[1]}steps-spe{c[2]}-from{c[3]}"
                                                                          f"{'-trial' if c[4] else ''}"
                                                                          f"{'-xla-' + c[5] if c[5] else ''}" for c in CASES])
def test_every_epoch_runs_all_its_steps(trained: list[dict[str, Any]], index: int,
                                        case: Case) -> None:
    strategy, steps, spe, resumed_at, trial_calls, xla = case
    result = trained[index]
    assert result["plan_steps"] == steps  # the plan keeps the epoch the data and batch imply
    total = EPOCHS * steps - resumed_at
    assert result["iterations"] == total
    assert result["steps_run"] in (total, None)
    # A trial's steps and calls are the first epoch's: fit goes on from where it stopped.
    xla_calls: tuple[tuple[int, int], ...] = ()
    trained_under_xla = bool(xla) and re.search(r"; jit_compile auto: [0-9.]+ ms per step under XLA, (not )?kept$",
                                                result["xla_note"]) is not None
    trained_in_bfloat16 = xla == "bf16" and re.search(
        r"; precision auto: [0-9.]+ ms per step in mixed_bfloat16 against [0-9.]+ in float32, (not )?kept$",
        result["xla_note"]) is not None
    if trained_under_xla:  # its traced step, then 16 timed steps, kept or not
        xla_calls = ((1, 1), (spe, 4))
    elif trained_in_bfloat16:  # bfloat16's two rounds with float32's between them, each a traced step and 16 more
        xla_calls = ((1, 1), (spe, 4)) * 3
    elif xla:
        assert xla == "either", result["xla_note"]
        assert result["xla_note"].endswith("the model did not train under XLA (the job's log says why), so it is off")
    tried = sum(k * n for k, n in ((1, 1), *trial_calls, *xla_calls))
    fit_from = resumed_at + (tried if trial_calls else 0)
    trial_executions = 1 + sum(n for _, n in (*trial_calls, *xla_calls)) if trial_calls else 0
    first = [{"steps": steps - resumed_at, "executions": trial_executions + len(_calls(steps, spe, fit_from)),
              "resumed_at_step": resumed_at or None}]
    rest = [{"steps": steps, "executions": len(_calls(steps, spe, 0)), "resumed_at_step": None}] * (EPOCHS - 1)
    assert result["epochs"] == first + rest
    expected = [[0, end, end] for end in _calls(steps, spe, fit_from)]
    expected += [[1, end, steps + end] for end in _calls(steps, spe, 0)]
    assert result["calls"] == expected


@pytest.mark.parametrize(("index", "case"), list(enumerate(CASES)), ids=[f"{c[0]}-{c[1]}steps-spe{c[2]}-from{c[3]}"
                                                                          f"{'-trial' if c[4] else ''}"
                                                                          f"{'-xla-' + c[5] if c[5] else ''}" for c in CASES])
def test_the_profile_traces_whole_executions_from_its_epochs_first_step(trained: list[dict[str, Any]], index: int,
                                                                       case: Case) -> None:
    """At least the steps asked (capped at the epoch's), ending with the first call that reaches them;
    the trace is an XSpace where TensorBoard's profile plugin looks, with this host's plane in it. An
    attempt that began past the window's first step does not trace it."""
    _, steps, spe, resumed_at, _, _ = case
    epoch, asked = PROFILED[index]
    profile = trained[index]["profile"]
    if (epoch - 1, 0) < (0, resumed_at):
        assert "not traced again" in profile["error"] and "files" not in profile
        return
    assert (profile["epoch"], profile["steps"]) == (epoch, next(e for e in _calls(steps, spe, 0) if e >= min(asked, steps)))
    assert profile["seconds"] > 0 and "error" not in profile
    if steps > spe:  # the first epoch's steps after its first call say what an untraced step takes
        assert profile["overhead_seconds"] is not None
    [name] = profile["files"]
    assert re.fullmatch(r"plugins/profile/[^/]+/[^/]+\.xplane\.pb", name), name
    assert "/host:CPU" in trained[index]["planes"][name]


@pytest.mark.parametrize(("index", "case"), list(enumerate(CASES)), ids=[f"{c[0]}-{c[1]}steps-spe{c[2]}-from{c[3]}"
                                                                          f"{'-trial' if c[4] else ''}"
                                                                          f"{'-xla-' + c[5] if c[5] else ''}" for c in CASES])
def test_the_step_time_breakdown_adds_up_to_the_training_time(trained: list[dict[str, Any]], index: int,
                                                             case: Case) -> None:
    """Each epoch: its training part, pauses and validation are its wall time, host time is what the calls
    leave of the training part; the attempt's first epoch alone has the first call's time. The attempt:
    compile + input wait + host + device is its training time."""
    entries, breakdown = trained[index]["entries"], trained[index]["breakdown"]
    for entry in entries:
        parts = entry["train_seconds"] + entry["pause_seconds"] + entry["validation_seconds"]
        assert parts == pytest.approx(entry["epoch_seconds"], abs=0.003)
        assert 0 <= entry["host_seconds"] <= entry["train_seconds"]
    assert 0 < entries[0]["first_call_seconds"] <= entries[0]["train_seconds"]
    assert all("first_call_seconds" not in e for e in entries[1:])
    parts = sum(breakdown[k] for k in ("compile_seconds", "input_wait_seconds", "host_seconds", "device_seconds"))
    assert parts == pytest.approx(breakdown["train_seconds"], abs=0.005)
    assert breakdown["compile_seconds"] > 0 and breakdown["device_seconds"] >= 0
    steps = sum(e["steps"] for e in entries)
    rounding = 1000 * 0.0005 / steps + 0.001  # device_seconds is given to the millisecond
    assert breakdown["device_ms_per_step"] == pytest.approx(1000 * breakdown["device_seconds"] / steps, abs=rounding)


def test_a_profiler_that_cannot_start_is_reported_and_training_goes_on(tmp_path: Path) -> None:
    """One profiler session per process: with another one running (a program's, a debugging user's),
    the window says why it has no trace instead of failing the job."""
    import tensorflow as tf

    from trainjobs.spec import JobSpec
    from agent.plan import Hardware, TrainingPosition, resolve_plan
    from agent.profiling import TraceWindow

    job = JobSpec.model_validate({"dataset": {"source": "sklearn:iris"}, "model": {"name": "mlp"},
                                  "training": {"epochs": 2, "global_batch_size": 4}})
    plan = resolve_plan(job, Hardware("cpu", 1, local_devices=1), "default", 1, train_examples=40)
    window = TraceWindow(tmp_path / "tb", 2, 5, plan)
    tf.profiler.experimental.start(str(tmp_path / "elsewhere"))
    try:
        window.before_call(TrainingPosition(1, 0, plan.steps_per_epoch))
        window.after_call(TrainingPosition(1, 5, plan.steps_per_epoch + 5))
    finally:
        tf.profiler.experimental.stop()
    report = window.report([], 1)
    assert report["epoch"] == 2 and "the profiler did not start" in report["error"], report
    assert not (tmp_path / "tb").exists()


@pytest.mark.parametrize("index", [i for i, c in enumerate(CASES) if c[5] == "bf16"])
def test_precision_autos_trial_leaves_the_policy_it_chose(trained: list[dict[str, Any]], index: int) -> None:
    """Kept: the hidden layer computes in bfloat16, the output layer in float32 (softmax and the loss keep
    full range); not kept: both in float32 again. Either way the steps above all counted."""
    result = trained[index]
    assert result["precision"] in ("mixed_bfloat16", "float32"), result["xla_note"]
    hidden = "mixed_bfloat16" if result["precision"] == "mixed_bfloat16" else "float32"
    assert result["policies"] == [hidden, "float32"]


if __name__ == "__main__":
    _child()
