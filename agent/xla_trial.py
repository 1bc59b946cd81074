"""`jit_compile: auto` (issue 24): XLA tried the way steps_per_execution is (agent/tuning.py), on a GPU.

After steps_per_execution's trial has chosen its steps per call, a train function compiled with XLA
runs one call of one step (its trace and XLA compile, untimed) and then the timed calls of the chosen
size, as more real steps of the first epoch; it is kept if it is faster per step than the same size
without XLA by tuning.MARGIN. A model Keras says cannot compile (`model.jit_compile` refuses true), or
one whose compile fails, keeps training without it. Not on a CPU: measured on the bench machine, XLA
made the built-in MLP 8x and the CNN 3x slower per step (bench/README.md), so trying would only cost
each job its compile; a TPU compiles every step with XLA anyway.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from agent.tuning import MARGIN, MEASURED_STEPS, TrialPlan, TrialResult, set_steps_per_execution, timed_fit

log = logging.getLogger("trainjobs.agent")


def prefer_xla(plain_s_per_step: float, xla_s_per_step: float) -> bool:
    return xla_s_per_step * (1 + MARGIN) < plain_s_per_step


def use_xla(model: Any, k: int) -> Any:
    """A train function compiled with XLA, installed; the model's own if Keras refuses XLA for it."""
    from agent.step_functions import install_step_functions

    model.jit_compile = True  # Keras' setter turns it back off, with a warning, for a model it cannot compile
    train_function = install_step_functions(model, k)
    set_steps_per_execution(model, train_function, k)
    return train_function


def try_xla_after(result: TrialResult, model: Any, plain: Any, dataset: Any, meter: Any, room: int,
                  class_weight: dict[int, float] | None = None) -> tuple[Any, TrialResult]:
    """The train function to keep, and `result` with the XLA trial's steps and choice added. `room`: the
    first epoch's steps the trial may still take."""
    k = result.choice.steps_per_execution
    calls = max(2, -(-MEASURED_STEPS // k))
    trial = TrialPlan(1, ((k, calls),))
    if trial.steps > room:
        log.info("jit_compile auto: no XLA trial, %d steps left in the first epoch's trial budget", room)
        return plain, result
    plain_s = result.choice.measured_ms_per_step[str(k)] / 1000
    xla = use_xla(model, k)
    if not model.jit_compile:
        set_steps_per_execution(model, plain, k)
        return plain, dataclasses.replace(result, choice=dataclasses.replace(result.choice, jit_compile=False))
    before = int(model.optimizer.iterations.numpy())
    try:
        timed = timed_fit(model, xla, dataset, meter, trial, class_weight)
    except Exception as exc:  # XLA's compile refuses an op: the error is TensorFlow's, of whichever class
        log.warning("jit_compile auto: the model did not train under XLA: %s", str(exc).splitlines()[0][:300])
        model.jit_compile = False
        set_steps_per_execution(model, plain, k)
        # The steps that did train. Not the function's own count: it is bumped beside the XLA cluster,
        # which still runs when the cluster fails (seen under MirroredStrategy on a CPU, TF 2.21).
        trained = int(model.optimizer.iterations.numpy()) - before
        return plain, dataclasses.replace(result, steps=result.steps + trained,
                                          choice=dataclasses.replace(result.choice, jit_compile=False))
    xla_s = timed.trials[0].seconds_per_step
    keep = prefer_xla(plain_s, xla_s)
    choice = dataclasses.replace(result.choice, jit_compile=keep, xla_ms_per_step=round(1000 * xla_s, 4))
    merged = dataclasses.replace(result, choice=choice, steps=result.steps + timed.steps,
                                 executions=result.executions + timed.executions,
                                 seconds=result.seconds + timed.seconds, waited_s=result.waited_s + timed.waited_s,
                                 inside_seconds=result.inside_seconds + timed.inside_seconds)
    if keep:
        return xla, merged
    model.jit_compile = False
    set_steps_per_execution(model, plain, k)
    return plain, merged
