"""`precision: auto`, measured on a CPU with bfloat16 instructions (issue 24).

On a GPU and a TPU `auto` resolves by hardware (trainjobs/spec/derived.py's resolve_precision). A CPU
resolves to float32, but one with AMX or AVX512-BF16 runs oneDNN's bfloat16 kernels, and whether
they pay depends on the model: measured on the bench machine (2 cores with AMX), mixed_bfloat16 made
the built-in cnn's steps 24% faster (3.98 -> 3.03 ms at batch 128) and the mlp's 5-9% slower (its
matmuls are too small for the casts around them). So the agent tries it, the way jit_compile is tried
on a GPU (agent/xla_trial.py): after steps_per_execution's trial, every layer but the output's computes
in bfloat16 (its variables stay float32, as Keras' mixed_bfloat16 keeps them), a new train function
runs one traced call of one step and then the timed calls of the chosen size as more real steps of
the first epoch, and it is kept if faster per step than float32 by MARGIN. The output layer keeps
float32, as agent/models.py pins it under a mixed policy, so softmax and the loss keep full range.

Same model, same optimizer, same float32 variables: nothing is rebuilt or copied, checkpoints hold the
same values either way, and export's float32 copy (agent/export.py) reads the trained weights as it
always does. A later attempt applies the stored choice before its first step.

Tried on the built-in models only: their layers are flat and take the policy they are given. A
keras.applications backbone nests its layers inside a Model, and a user's model may pin dtypes or
cast inside its own layers; for those, `precision: mixed_bfloat16` asks for it outright.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from agent.tuning import TrialResult, alternative_plan, set_steps_per_execution, try_alternative

log = logging.getLogger("trainjobs.agent")

TRIED = "mixed_bfloat16"
# bfloat16 keeps 8 bits of mantissa: kept only where it pays beyond a shared machine's noise (3-5% between
# interleaved rounds here). It was 10%: the bench's cnn then measured 8-9% in runs where its steady state
# gains 19-24%, and trained in float32.
MARGIN = 0.05
# bfloat16's calls run in two rounds with float32's between them (tuning.try_alternative): its first
# measurement alone, right after its trace, read 4.4 ms per step against float32's 4.3 where the steady
# state is 3.1 against 3.8 (the bench's cnn).
ROUNDS = 2
# A float32 step shorter than this is not tried: it is mostly the per-op work of TensorFlow's executor
# and matmuls too small for oneDNN's bfloat16 kernels to gain on their casts (the bench's mlp: 0.8-1.0
# ms, 5-9% slower in bfloat16), while the trial costs the job about a second (a second trace, three
# more fits); the cnn, 4.0-4.4 ms, gained 19-24%.
MIN_STEP_MS = 2.0


def prefer_bfloat16(float32_s_per_step: float, bfloat16_s_per_step: float) -> bool:
    return bfloat16_s_per_step * (1 + MARGIN) < float32_s_per_step


def why_not(spec: Any, precision: str, cpu_bfloat16: str | None, builtin: bool, replicas: int = 1) -> str | None:
    """Why mixed_bfloat16 is not tried for this job; None: it is."""
    if spec.precision != "auto" or precision != "float32":
        return "not asked" if spec.precision != "auto" else f"{precision} already"
    if cpu_bfloat16 is None:
        return "this CPU has no bfloat16 instructions (AMX or AVX512-BF16), so float32 is faster"
    if replicas > 1:
        # Its rounds call two train functions in turn, and the replicas' all-reduces then disagreed on
        # their shapes (MirroredStrategy over two logical CPUs, TF 2.21).
        return "tried with one replica only; precision: mixed_bfloat16 asks for it"
    if spec.steps_per_execution != "auto":
        return ("it is measured with steps_per_execution auto's trial, which a fixed steps_per_execution skips; "
                "precision: mixed_bfloat16 asks for it")
    if not builtin:
        return ("tried on the built-in models only (a user's or an application's layers may pin their own "
                "dtypes); precision: mixed_bfloat16 asks for it")
    return None


def output_layers(model: Any) -> set[int] | None:
    """The ids of the layers that produce the model's outputs; None for a model without symbolic outputs
    (a subclassed one), whose output layer cannot be told apart."""
    outputs = getattr(model, "outputs", None)
    if not outputs:
        return None
    return {id(t._keras_history[0]) for t in outputs}


def set_compute_policy(model: Any, policy: str) -> bool:
    """Every layer of `model` but its output layers computes under `policy` (their variables keep their
    dtype: float32 under float32 and the mixed policies alike). False, changing nothing, where this
    cannot be done safely: no symbolic outputs, or a layer that nests layers of its own."""
    keep = output_layers(model)
    if keep is None:
        return False
    layers = [layer for layer in model.layers if id(layer) not in keep]
    if any(getattr(layer, "layers", None) for layer in layers):
        return False
    before = [layer.dtype_policy for layer in layers]
    try:
        for layer in layers:
            layer.dtype_policy = policy
    except Exception as exc:  # a Keras whose layers refuse a new policy once built: whatever it raises
        log.warning("precision auto: the layers did not take the %s policy: %s", policy, exc)
        for layer, old in zip(layers, before):
            try:
                layer.dtype_policy = old
            except Exception:  # noqa: BLE001 - as above; the ones that took the new one are put back
                pass
        return False
    return True


def use_bfloat16(model: Any, k: int) -> Any:
    """The model under mixed_bfloat16 but its output, with a train function of its own, installed;
    None (the model unchanged) where set_compute_policy refuses."""
    from agent.step_functions import install_step_functions

    if not set_compute_policy(model, TRIED):
        return None
    train_function = install_step_functions(model, k)
    set_steps_per_execution(model, train_function, k)
    return train_function


def try_bfloat16_after(result: TrialResult, model: Any, plain: Any, dataset: Any, meter: Any, room: int,
                       class_weight: dict[int, float] | None = None,
                       min_step_ms: float = MIN_STEP_MS) -> tuple[Any, TrialResult]:
    """The train function to keep, and `result` with the trial's steps and choice (`precision`,
    `bfloat16_ms_per_step`) added. `room`: the first epoch's steps the trial may still take."""
    k = result.choice.steps_per_execution
    if (ROUNDS * 2 - 1) * alternative_plan(k).steps > room:
        log.info("precision auto: mixed_bfloat16 not tried, %d steps left in the first epoch's trial budget", room)
        return plain, result

    float32_ms = result.choice.measured_ms_per_step[str(k)]
    if float32_ms < min_step_ms:
        log.info("precision auto: mixed_bfloat16 not tried, a float32 step of %.3f ms is under %.1f", float32_ms,
                 min_step_ms)
        return plain, dataclasses.replace(result, choice=dataclasses.replace(
            result.choice, precision="float32", float32_ms_per_step=round(float32_ms, 4)))

    def undo() -> None:
        set_compute_policy(model, "float32")

    function, tried, bf16_s, plain_s = try_alternative(result, model, plain, dataset, meter,
                                                       lambda: use_bfloat16(model, k), undo,
                                                       "precision auto (mixed_bfloat16)", class_weight, rounds=ROUNDS)
    if bf16_s is None:
        return plain, dataclasses.replace(tried, choice=dataclasses.replace(tried.choice, precision="float32"))
    # float32 at k: steps_per_execution's trial and the calls between bfloat16's rounds, each as many steps.
    measured = result.choice.measured_ms_per_step[str(k)] / 1000
    float32_s = measured if plain_s is None else (measured + plain_s) / 2
    keep = prefer_bfloat16(float32_s, bf16_s)
    choice = dataclasses.replace(tried.choice, precision=TRIED if keep else "float32",
                                 bfloat16_ms_per_step=round(1000 * bf16_s, 4),
                                 float32_ms_per_step=round(1000 * float32_s, 4))
    if keep:
        return function, dataclasses.replace(tried, choice=choice)
    undo()
    set_steps_per_execution(model, plain, k)
    return plain, dataclasses.replace(tried, choice=choice)
