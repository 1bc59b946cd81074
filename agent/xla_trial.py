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

from agent.tuning import MARGIN, TrialResult, alternative_plan, set_steps_per_execution, try_alternative

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
    if alternative_plan(k).steps > room:
        log.info("jit_compile auto: no XLA trial, %d steps left in the first epoch's trial budget", room)
        return plain, result

    def install() -> Any:
        xla = use_xla(model, k)
        return xla if model.jit_compile else None  # Keras' setter refused XLA for this model

    def undo() -> None:
        model.jit_compile = False

    function, tried, xla_s, _ = try_alternative(result, model, plain, dataset, meter, install, undo,
                                                "jit_compile auto", class_weight)
    if xla_s is None:
        return plain, dataclasses.replace(tried, choice=dataclasses.replace(tried.choice, jit_compile=False))
    keep = prefer_xla(result.choice.measured_ms_per_step[str(k)] / 1000, xla_s)
    choice = dataclasses.replace(tried.choice, jit_compile=keep, xla_ms_per_step=round(1000 * xla_s, 4))
    if keep:
        return function, dataclasses.replace(tried, choice=choice)
    undo()
    set_steps_per_execution(model, plain, k)
    return plain, dataclasses.replace(tried, choice=choice)
