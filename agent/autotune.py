"""What `auto` settles on the first steps of a job (issue 24): steps_per_execution (agent/tuning.py),
then, where each is tried, jit_compile on a GPU (agent/xla_trial.py) and precision on a CPU with
bfloat16 instructions (agent/precision_trial.py); stored for the job's later attempts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agent.plan import RuntimePlan
from agent.precision_trial import TRIED, try_bfloat16_after, use_bfloat16
from agent.tuning import (
    TrialResult, plan_trial, run_trial, set_steps_per_execution, store_choice, stored_choice, use_steps_per_execution,
)
from agent.xla_trial import try_xla_after, use_xla


def tune(spec: Any, plan: RuntimePlan, model: Any, train_function: Any, dataset: Any, meter: Any,
         checkpoints_uri: str, attempt: int, *, chief: bool, may_measure: bool, try_xla: bool,
         try_bfloat16: bool = False,
         class_weight: dict[int, float] | None = None) -> tuple[RuntimePlan, Any, TrialResult | None]:
    """The plan with `steps_per_execution: auto` (and `jit_compile: auto` where `try_xla`) settled, the
    train function to use, and the trial that trained the first steps (if one ran; fit then starts at
    its end: `fit_plan`). An integer in the spec is kept as the plan has it. `may_measure`: false where
    the trial's calls would skip work fit's callbacks do after every call. `try_bfloat16`: precision
    auto may try mixed_bfloat16 (precision_trial.why_not said nothing against it); the plan's precision
    says what was kept."""
    if spec.steps_per_execution != "auto" or plan.initial_epoch >= plan.epochs:
        return plan, train_function, None
    if (stored := stored_choice(checkpoints_uri)) is not None:
        k = min(stored.steps_per_execution, plan.steps_per_epoch)
        plan = use_steps_per_execution(plan, model, train_function, k, f"{stored.note()}; attempt {attempt} reuses it")
        if stored.jit_compile and spec.jit_compile == "auto":
            train_function = use_xla(model, k)
        if stored.precision == TRIED and try_bfloat16 and (bf16 := use_bfloat16(model, k)) is not None:
            train_function, plan = bf16, replace(plan, precision=TRIED)
        return plan, train_function, None
    why = None
    if not may_measure:
        why = "training.pruning updates its masks after every call, which the trial's calls would skip"
    elif spec.workers > 1:
        why = "every worker of a multi-worker job must run the same calls, and timings differ between hosts"
    elif plan.initial_epoch or plan.initial_step:
        why = "this attempt resumes from a checkpoint taken before any measurement was stored"
    elif (trial := plan_trial(plan.steps_per_epoch)) is None:
        why = f"an epoch of {plan.steps_per_epoch} steps is too short to try candidates in"
    if why is not None:
        return replace(plan, notes=plan.notes + (f"steps_per_execution auto: {plan.steps_per_execution}, not "
                                                 f"measured: {why}",)), train_function, None
    assert trial is not None
    result = run_trial(model, train_function, dataset, meter, trial, attempt, class_weight)
    k = result.choice.steps_per_execution
    set_steps_per_execution(model, train_function, k)
    if try_xla:
        train_function, result = try_xla_after(result, model, train_function, dataset, meter,
                                               plan.steps_per_epoch - result.steps - 1, class_weight)
    if try_bfloat16:
        train_function, result = try_bfloat16_after(result, model, train_function, dataset, meter,
                                                    plan.steps_per_epoch - result.steps - 1, class_weight)
        if result.choice.precision == TRIED:
            plan = replace(plan, precision=TRIED)
    if chief:
        store_choice(checkpoints_uri, result.choice)
    return replace(plan, steps_per_execution=k, notes=plan.notes + (result.choice.note(),)), train_function, result
