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
# "either" where the TensorFlow version decides): none of them divides evenly.
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
]
EPOCHS = 2


def _train(strategy_name: str, steps: int, spe: int, resumed_at: int, trial_calls: tuple[tuple[int, int], ...],
           xla: str) -> dict[str, Any]:
    """Child process only: a tiny model trained with the agent's train function and fit loop."""
    import dataclasses

    import keras
    import numpy as np
    import tensorflow as tf

    from trainjobs.spec import JobSpec
    from agent.devices import build_strategy
    from agent.input_wait import InputWaitMeter
    from agent.plan import Hardware, resolve_plan
    from agent.step_functions import install_step_functions
    from agent.train import EpochRecorder, fit
    from agent.tuning import TrialPlan, fit_plan, run_trial, use_steps_per_execution
    from agent.xla_trial import try_xla_after

    job = JobSpec.model_validate({"dataset": {"source": "sklearn:iris"}, "model": {"name": "mlp"},
                                  "training": {"epochs": EPOCHS, "global_batch_size": 4}})
    hardware = Hardware("cpu", 2, local_devices=2)
    strategy = build_strategy(strategy_name, hardware)
    plan = resolve_plan(job, hardware, strategy_name, strategy.num_replicas_in_sync, train_examples=4 * steps)
    plan = dataclasses.replace(plan, steps_per_execution=spe, initial_step=resumed_at,
                               initial_global_step=resumed_at)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", steps_per_execution=spe)
    train_function = install_step_functions(model, spe)
    rng = np.random.default_rng(0)
    data = tf.data.Dataset.from_tensor_slices((rng.random((40, 3), np.float32), rng.integers(0, 2, 40))).repeat()
    meter = InputWaitMeter()
    batches = meter.wrap(data.batch(4, drop_remainder=True))
    trial = None
    if trial_calls:  # as agent/tuning.py runs it, then the case's steps_per_execution whatever was measured
        trial = run_trial(model, train_function, batches, meter, TrialPlan(1, trial_calls), attempt=1)
        plan = use_steps_per_execution(plan, model, train_function, spe, "chosen by the test")
        if xla:  # measured against the case's steps_per_execution, whatever the trial chose
            trial = dataclasses.replace(trial, choice=dataclasses.replace(trial.choice, steps_per_execution=spe))
            train_function, trial = try_xla_after(trial, model, train_function, batches, meter,
                                                  steps - trial.steps - 1)
    entries: list[dict[str, Any]] = []
    calls: list[list[int]] = []
    recorder = EpochRecorder(fit_plan(plan, trial), 1, meter, train_function, lambda e, at: entries.append(e),
                             lambda at: calls.append([at.epoch, at.step, at.global_step]), lambda p: None,
                             trial=trial)
    fit(model, fit_plan(plan, trial), batches, None, recorder)
    return {"plan_steps": plan.steps_per_epoch, "iterations": int(model.optimizer.iterations.numpy()),
            # XLA's trial ran on a train function of its own: the one kept counts only its own steps.
            "steps_run": None if xla else train_function.steps_run, "calls": calls,
            "xla_note": trial.choice.note() if xla and trial is not None else None,
            "epochs": [{"steps": e["steps"], "executions": e["executions"], "resumed_at_step": e.get("resumed_at_step")}
                       for e in entries]}


def _child() -> None:
    from agent.devices import configure_local_devices

    configure_local_devices(2)
    print(json.dumps([_train(*case) for case in CASES]))


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
    if trained_under_xla:  # its traced step, then 16 timed steps, kept or not
        xla_calls = ((1, 1), (spe, 4))
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


if __name__ == "__main__":
    _child()
