"""`precision: auto` measured on a CPU (agent/precision_trial.py), without TensorFlow: which CPUs and jobs
try mixed_bfloat16, which timings keep it, and what the runtime notes say. The trial itself trains in
tests/e2e/test_epoch_steps.py; a job that runs it, in tests/e2e/test_agent_runs.py."""

from __future__ import annotations

import dataclasses

import pytest

from trainjobs.spec import JobSpec
from agent.devices import cpu_bfloat16
from agent.precision_trial import prefer_bfloat16, why_not
from agent.tuning import TuningChoice

# /proc/cpuinfo as Linux writes it, one processor's block, flags cut to the ones that matter here.
CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu vme sse sse2 avx avx2 avx512f avx512_vnni {extra} fma
bogomips\t: 4200.00
"""


@pytest.mark.parametrize(("extra", "found"), [
    ("avx512_bf16 amx_bf16 amx_tile amx_int8", "amx_bf16"),  # Sapphire Rapids and later: AMX first
    ("avx512_bf16", "avx512_bf16"),  # Cooper Lake, Zen 4
    ("", None),
    ("amx_tile amx_int8", None),  # AMX without its bfloat16 part
])
def test_the_cpus_bfloat16_instructions_come_from_its_flags(extra: str, found: str | None) -> None:
    assert cpu_bfloat16(CPUINFO.format(extra=extra)) == found
    # A flag's name is a whole word: "avx512_bf16x" is not avx512_bf16.
    assert cpu_bfloat16(CPUINFO.format(extra="avx512_bf16x")) is None


def _spec(**fields: object) -> JobSpec:
    return JobSpec.model_validate({"dataset": {"source": "sklearn:digits"}, "model": {"name": "cnn"}, **fields})


@pytest.mark.parametrize(("fields", "precision", "cpu", "builtin", "replicas", "reason"), [
    ({}, "float32", "amx_bf16", True, 1, None),
    ({}, "float32", None, True, 1, "no bfloat16 instructions"),
    ({"precision": "float32"}, "float32", "amx_bf16", True, 1, "not asked"),
    ({}, "float32", "amx_bf16", False, 1, "built-in models only"),
    ({}, "float32", "amx_bf16", True, 2, "one replica only"),
    ({"steps_per_execution": 8}, "float32", "amx_bf16", True, 1, "fixed steps_per_execution"),
])
def test_mixed_bfloat16_is_tried_where_it_can_pay_and_be_measured(fields: dict[str, object], precision: str,
                                                                 cpu: str | None, builtin: bool, replicas: int,
                                                                 reason: str | None) -> None:
    why = why_not(_spec(**fields), precision, cpu, builtin, replicas)
    assert why is None if reason is None else (why is not None and reason in why), why


@pytest.mark.parametrize(("float32_ms", "bfloat16_ms", "kept"), [
    (3.98, 3.03, True),  # the bench's cnn in steady state: 24% faster
    (0.81, 0.85, False),  # its mlp: slower
    (1.0, 0.97, False),  # 3%: within what a shared machine moves, and bfloat16 rounds more
    (1.0, 0.93, True),  # the cnn's 8-9% where the machine ran slow
])
def test_bfloat16_is_kept_only_when_clearly_faster(float32_ms: float, bfloat16_ms: float, kept: bool) -> None:
    assert prefer_bfloat16(float32_ms / 1000, bfloat16_ms / 1000) is kept


@pytest.mark.parametrize(("precision", "bf16_ms", "ending"), [
    ("mixed_bfloat16", 3.1, "; precision auto: 3.100 ms per step in mixed_bfloat16 against 3.900 in float32, kept"),
    ("float32", 4.2, "; precision auto: 4.200 ms per step in mixed_bfloat16 against 3.900 in float32, not kept"),
    ("float32", None, "; precision auto: the model did not train in mixed_bfloat16 (the job's log says why), so float32"),
    (None, None, "; chose 16"),
    ("float32", "short", "; precision auto: float32, mixed_bfloat16 not tried: a step of 3.900 ms is too short "
                         "for it to pay (agent/precision_trial.py)"),
])
def test_the_choice_says_what_bfloat16_measured(precision: str | None, bf16_ms: float | str | None, ending: str) -> None:
    measured = isinstance(bf16_ms, float)
    choice = TuningChoice(16, {"1": 5.8, "16": 3.9}, 1, precision=precision,
                          bfloat16_ms_per_step=bf16_ms if isinstance(bf16_ms, float) else None,
                          float32_ms_per_step=3.9 if measured or bf16_ms == "short" else None)
    assert choice.note().endswith(ending)
    # Stored beside the checkpoints and read back by a later attempt as it was.
    assert TuningChoice(**dataclasses.asdict(choice)) == choice


def test_a_step_too_short_to_gain_is_not_tried() -> None:
    """Before anything trains or the model is touched (none is given here): the choice says float32 and why."""
    from agent.precision_trial import MIN_STEP_MS, try_bfloat16_after
    from agent.tuning import TrialResult

    result = TrialResult(TuningChoice(64, {"1": 2.1, "64": 0.9}, 1), steps=65, executions=5, seconds=0.2, waited_s=0.0)
    plain = object()
    kept, tried = try_bfloat16_after(result, None, plain, None, None, room=500)
    assert kept is plain and tried.steps == result.steps
    assert (tried.choice.precision, tried.choice.float32_ms_per_step, tried.choice.bfloat16_ms_per_step) == ("float32", 0.9, None)
    assert 0.9 < MIN_STEP_MS
