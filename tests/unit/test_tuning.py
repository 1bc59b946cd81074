"""`steps_per_execution: auto` measured (agent/tuning.py), without TensorFlow: which candidates the first
epoch tries, and which one a job keeps from what it measured."""

from __future__ import annotations

import pytest

from agent.tuning import (
    MAX_MARGIN, MEASURED_STEPS, TRIAL_SHARE, Trial, TrialPlan, TuningChoice, choose, margin, plan_trial,
)


@pytest.mark.parametrize(("steps_per_epoch", "tried"), [
    (625, (1, 4, 16, 64)),  # the bench's MLP: 80,000 examples at batch 128
    (187, (1, 4, 16)),  # 64 steps twice would pass half the epoch
    (359, (1, 4, 16)),
    (2000, (1, 4, 16, 64)),
    (70, (1, 4)),
])
def test_the_trial_tries_the_candidates_that_fit_in_half_an_epoch(steps_per_epoch: int, tried: tuple[int, ...]) -> None:
    trial = plan_trial(steps_per_epoch)
    assert trial is not None
    assert tuple(k for k, _ in trial.calls) == tried
    assert all(k * n >= MEASURED_STEPS and n >= 2 for k, n in trial.calls)
    # Its steps are real steps of the first epoch, and most of the epoch is left to fit.
    assert trial.steps <= steps_per_epoch * TRIAL_SHARE


@pytest.mark.parametrize("steps_per_epoch", [1, 7, 10, 22, 40])
def test_an_epoch_too_short_for_two_candidates_is_not_measured(steps_per_epoch: int) -> None:
    assert plan_trial(steps_per_epoch) is None


def _trials(ms_per_step: dict[int, float]) -> list[Trial]:
    return [Trial(k, 4, 4 * k * ms / 1000) for k, ms in ms_per_step.items()]


@pytest.mark.parametrize(("measured", "chosen"), [
    ({1: 2.0, 4: 1.2, 16: 1.0, 64: 0.9}, 64),  # the fastest per step
    ({1: 1.0, 4: 1.3, 16: 1.5}, 1),  # more steps per call can be slower (a tf.while_loop of big steps)
    ({1: 2.0, 4: 1.0, 16: 0.99, 64: 0.98}, 64),  # within 3% of the fastest: the most steps per call
    ({1: 2.0, 4: 0.98, 16: 1.0, 64: 1.05}, 16),  # 4 is fastest, 16 within 3% of it, 64 not
    ({1: 2.0, 4: 1.1, 16: 1.0, 64: 1.05}, 16),
    ({1: 1.0, 4: 1.02, 16: 1.2}, 4),
])
def test_the_job_keeps_the_fastest_candidate(measured: dict[int, float], chosen: int) -> None:
    assert choose(_trials(measured)) == chosen


def _rounds(k: int, first_ms: float, second_ms: float) -> Trial:
    """A candidate measured in two rounds of 2 calls each, at these ms per step."""
    first, second = 2 * k * first_ms / 1000, 2 * k * second_ms / 1000
    return Trial(k, 4, first + second, ((2, first), (2, second)))


def test_a_noisy_trial_counts_its_own_spread_as_a_tie() -> None:
    """The cnn's trial in a bench job: 4 steps per call looked 12% faster than 16, but 16's own two rounds
    were 30% apart. Within that noise the two tie, and a tie goes to the most steps per call."""
    trials = [_rounds(1, 12.0, 13.2), _rounds(4, 8.8, 9.1), _rounds(16, 8.6, 11.7)]
    assert margin(trials) == pytest.approx((11.7 - 8.6) / (11.7 + 8.6))
    assert choose(trials) == 16
    # Rounds that agree leave the margin at 3%, and the faster candidate wins.
    steady = [_rounds(1, 12.0, 12.1), _rounds(4, 8.8, 8.9), _rounds(16, 10.0, 10.1)]
    assert margin(steady) == 0.03
    assert choose(steady) == 4
    # However noisy, a candidate more than MAX_MARGIN slower than the fastest is not kept.
    wild = [_rounds(1, 5.0, 5.0), _rounds(4, 7.0, 7.0), _rounds(16, 4.0, 40.0)]
    assert margin(wild) == MAX_MARGIN
    assert choose(wild) == 1


def test_the_choice_says_when_the_trial_s_noise_set_the_margin() -> None:
    note = TuningChoice(16, {"1": 2.0, "4": 1.25, "16": 1.3}, attempt=1, tie_margin=0.15).note()
    assert note.endswith("chose 16 (candidates within 15% of the fastest, the spread between the trial's two "
                         "rounds, counted as ties, and a tie goes to the most steps per call)")


def test_the_choice_says_what_was_measured() -> None:
    note = TuningChoice(16, {"1": 2.0, "4": 1.25, "16": 1.0}, attempt=1).note()
    assert note == ("steps_per_execution auto: measured ms per step by steps per call (1: 2.000, 4: 1.250, "
                    "16: 1.000) on the first steps of attempt 1; chose 16")


def test_a_trial_plan_counts_its_traced_call() -> None:
    assert TrialPlan(1, ((1, 16), (4, 4))).steps == 33


@pytest.mark.parametrize(("plain_ms", "xla_ms", "kept"), [
    (1.0, 0.5, True),
    (1.0, 0.98, False),  # within 3%: not worth a compiled step's rigidity
    (1.0, 5.6, False),  # the bench machine's CPU: XLA 8x slower for the MLP
])
def test_xla_is_kept_only_when_clearly_faster(plain_ms: float, xla_ms: float, kept: bool) -> None:
    from agent.xla_trial import prefer_xla

    assert prefer_xla(plain_ms / 1000, xla_ms / 1000) is kept


@pytest.mark.parametrize(("jit", "xla_ms", "ending"), [
    (True, 0.5, "; jit_compile auto: 0.500 ms per step under XLA, kept"),
    (False, 1.5, "; jit_compile auto: 1.500 ms per step under XLA, not kept"),
    (False, None, "; jit_compile auto: the model did not train under XLA (the job's log says why), so it is off"),
    (None, None, "; chose 16"),
])
def test_the_choice_says_what_xla_measured(jit: bool | None, xla_ms: float | None, ending: str) -> None:
    assert TuningChoice(16, {"1": 2.0, "16": 1.0}, 1, jit, xla_ms).note().endswith(ending)
