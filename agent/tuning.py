"""`steps_per_execution: auto`, measured (issue 24): the first training steps of a job try a few
steps-per-call candidates and the job keeps the fastest.

The candidates run as real training steps of the first epoch, in a short fit call of their own before
training's: Keras' fit loop fixes how many calls an epoch gets (its epoch iterator steps by
`model.steps_per_execution`, read once per fit), so the count cannot change inside one fit call. The
trial's steps are then where the first epoch stands, exactly as a mid-epoch checkpoint is (train.fit:
the rest of that epoch, then the others), and the recorder folds them into the first epoch's entry:
every step trained counts, none twice.

The train function's step count is an argument of one traced function (step_functions.py), so only
the trial's first call traces; it is left out of the measurements. The choice is stored beside the
checkpoints, and every later attempt of the job uses it without measuring again.

The trial iterates the training pipeline on its own, and fit starts another pass over it: the first
epoch's batches after the trial come from a new shuffle, as after any resume (the pipeline's position
is not checkpointed).
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from trainjobs import storage
from agent.plan import RuntimePlan

log = logging.getLogger("trainjobs.agent")

CANDIDATES = (1, 4, 16, 64)
MEASURED_STEPS = 16  # timed steps per candidate at least (two calls of the larger ones)
TRIAL_SHARE = 0.5  # of the first epoch's steps, at most, spent trying candidates
# Candidates within this much of the fastest are ties, and a tie goes to the most steps per call: each
# call pays Keras' loop around it (about 2 ms on the bench's CPU, whatever the model: the bench's cnn
# ran 5.8 ms per step at 1 step per call, 4.0 at 16), which a trial's 16 steps per candidate cannot
# tell from a shared machine's noise between 4 and 16. Measured that way the cnn chose 4 where 16 was
# 10% faster in steady state. (It used to go the other way, for finer progress; a call is still short
# next to a checkpoint's interval.)
MARGIN = 0.03
# Where the trial's two rounds of a candidate disagree by more than that, the machine's own noise is the
# margin (half the largest relative spread between rounds), up to this: on a shared 2-core host the same
# calls ran 10-30% apart a round later, and the cnn kept 4 steps per call in 2 of 6 bench jobs that way.
MAX_MARGIN = 0.25
CHOICE_NAME = "tuning.json"


@dataclass(frozen=True)
class Trial:
    """One candidate's measurement: `calls` calls of `steps_per_execution` steps took `seconds`."""

    steps_per_execution: int
    calls: int
    seconds: float
    rounds: tuple[tuple[int, float], ...] = ()  # (calls, seconds) of each round, where the calls were split

    @property
    def seconds_per_step(self) -> float:
        return self.seconds / (self.calls * self.steps_per_execution)

    @property
    def spread(self) -> float:
        """Half the relative difference between its rounds' times per step (0 with fewer than two)."""
        per_step = [s / (n * self.steps_per_execution) for n, s in self.rounds if n]
        if len(per_step) < 2 or min(per_step) <= 0:
            return 0.0
        return (max(per_step) - min(per_step)) / (max(per_step) + min(per_step))


@dataclass(frozen=True)
class TrialPlan:
    """What the trial runs: one untimed call (the trace), then each candidate's calls."""

    trace_steps: int
    calls: tuple[tuple[int, int], ...]  # (steps_per_execution, calls)

    @property
    def steps(self) -> int:
        return self.trace_steps + sum(k * n for k, n in self.calls)


def plan_trial(steps_per_epoch: int) -> TrialPlan | None:
    """The candidates that fit in TRIAL_SHARE of the epoch with MEASURED_STEPS each (so none passes
    the epoch); None when fewer than two do (nothing to choose between)."""
    budget = int(steps_per_epoch * TRIAL_SHARE) - 1  # one step traces
    calls: list[tuple[int, int]] = []
    for k in CANDIDATES:
        n = max(2, -(-MEASURED_STEPS // k))
        if k * n > budget:
            break
        budget -= k * n
        calls.append((k, n))
    return TrialPlan(1, tuple(calls)) if len(calls) >= 2 else None


def margin(trials: list[Trial]) -> float:
    """How close to the fastest a candidate must be to tie: MARGIN, or the trial's own noise (the largest
    spread between a candidate's rounds), up to MAX_MARGIN."""
    return min(MAX_MARGIN, max([MARGIN, *(t.spread for t in trials)]))


def choose(trials: list[Trial]) -> int:
    """The candidate with the least time per step; of those within `margin` of it, the largest."""
    best = min(trials, key=lambda t: t.seconds_per_step)
    good_enough = best.seconds_per_step * (1 + margin(trials))
    return max(t.steps_per_execution for t in trials if t.seconds_per_step <= good_enough)


@dataclass(frozen=True)
class TuningChoice:
    """What the job chose and what it measured; stored for the job's later attempts."""

    steps_per_execution: int
    measured_ms_per_step: dict[str, float] = field(default_factory=dict)  # by candidate
    attempt: int = 1
    jit_compile: bool | None = None  # jit_compile auto's choice (agent/xla_trial.py); None: not tried
    xla_ms_per_step: float | None = None  # at the chosen steps_per_execution
    precision: str | None = None  # precision auto's choice on a CPU (agent/precision_trial.py); None: not tried
    bfloat16_ms_per_step: float | None = None  # at the chosen steps_per_execution
    float32_ms_per_step: float | None = None  # what bfloat16's was compared with (precision_trial)
    tie_margin: float | None = None  # `margin` of the measurements, where the trial's noise set it above MARGIN

    def note(self) -> str:
        timings = ", ".join(f"{k}: {v:.3f}" for k, v in self.measured_ms_per_step.items())
        note = (f"steps_per_execution auto: measured ms per step by steps per call ({timings}) on the first "
                f"steps of attempt {self.attempt}; chose {self.steps_per_execution}")
        if self.tie_margin is not None:
            note += (f" (candidates within {100 * self.tie_margin:.0f}% of the fastest, the spread between the "
                     f"trial's two rounds, counted as ties, and a tie goes to the most steps per call)")
        if self.jit_compile is not None and self.xla_ms_per_step is not None:
            note += (f"; jit_compile auto: {self.xla_ms_per_step:.3f} ms per step under XLA, "
                     f"{'kept' if self.jit_compile else 'not kept'}")
        elif self.jit_compile is False:
            note += "; jit_compile auto: the model did not train under XLA (the job's log says why), so it is off"
        if self.precision is not None and self.bfloat16_ms_per_step is not None and self.float32_ms_per_step is not None:
            note += (f"; precision auto: {self.bfloat16_ms_per_step:.3f} ms per step in mixed_bfloat16 against "
                     f"{self.float32_ms_per_step:.3f} in float32, {'kept' if self.precision != 'float32' else 'not kept'}")
        elif self.precision is not None and self.float32_ms_per_step is not None:
            note += (f"; precision auto: float32, mixed_bfloat16 not tried: a step of {self.float32_ms_per_step:.3f} ms "
                     "is too short for it to pay (agent/precision_trial.py)")
        elif self.precision is not None:
            note += "; precision auto: the model did not train in mixed_bfloat16 (the job's log says why), so float32"
        return note


@dataclass(frozen=True)
class TrialResult:
    """The choice, and the trial's own share of the first epoch for its history entry."""

    choice: TuningChoice
    steps: int
    executions: int
    seconds: float
    waited_s: float
    inside_seconds: float = 0.0  # in train-function calls (EpochRecorder's host_seconds leave it out)
    first_call_seconds: float = 0.0  # the trial's first call: tracing and compilation, and one step


def stored_choice(checkpoints_uri: str) -> TuningChoice | None:
    doc = storage.read_json(f"{checkpoints_uri.rstrip('/')}/{CHOICE_NAME}")
    if doc is None:
        return None
    return TuningChoice(int(doc["steps_per_execution"]), dict(doc.get("measured_ms_per_step", {})),
                        int(doc.get("attempt", 1)), doc.get("jit_compile"), doc.get("xla_ms_per_step"),
                        doc.get("precision"), doc.get("bfloat16_ms_per_step"), doc.get("float32_ms_per_step"),
                        doc.get("tie_margin"))


def store_choice(checkpoints_uri: str, choice: TuningChoice) -> None:
    storage.write_json(f"{checkpoints_uri.rstrip('/')}/{CHOICE_NAME}", asdict(choice))


@dataclass(frozen=True)
class TimedFit:
    trials: list[Trial]
    steps: int
    executions: int
    seconds: float
    waited_s: float
    inside_seconds: float
    first_call_seconds: float


def timed_fit(model: Any, train_function: Any, dataset: Any, meter: Any, trial: TrialPlan,
              class_weight: dict[int, float] | None = None) -> TimedFit:
    """Train trial.steps steps of the first epoch, timing each candidate's calls. They run in a fit of
    their own (Keras builds the model's metrics and loss state there, before any step traces: a first
    trace outside fit under MirroredStrategy creates them in a cond branch, which tf.distribute cannot
    feed), called once per scheduled call (model.steps_per_execution 1), so each candidate pays the
    overhead per call of Keras' loop that the rest of training will pay."""
    import keras

    # Two rounds, each candidate's calls split between them: a neighbour's burst on a shared machine then
    # slows every candidate alike instead of whichever ran during it (seen at load 5-7 on 2 cores).
    blocks = [(k, n // 2) for k, n in trial.calls] + [(k, n - n // 2) for k, n in trial.calls]
    schedule = [trial.trace_steps] + [k for k, n in blocks for _ in range(n)]
    ends = list(itertools.accumulate([1] + [n for _, n in blocks]))  # calls done at each boundary
    stamps: list[float] = []

    class Clock(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            self.calls += 1
            if self.calls in ends:
                _ = train_function.steps_run  # reading the count waits for the calls (a GPU runs ahead)
                stamps.append(time.perf_counter())

    train_function.schedule_calls(schedule)
    asked = model.steps_per_execution
    model.steps_per_execution = 1
    meter.reset()
    inside_before, calls_before = train_function.seconds, train_function.calls
    began = time.perf_counter()
    try:
        # class_weight as training's fit has it: Keras turns it into the batches' sample weights.
        model.fit(dataset, epochs=1, steps_per_epoch=len(schedule), callbacks=[Clock()], shuffle=False, verbose=0,
                  class_weight=class_weight)
    finally:
        model.steps_per_execution = asked
        train_function.schedule_calls([])
    spent = [stamps[i + 1] - stamps[i] for i in range(len(blocks))]
    half = len(trial.calls)
    trials = [Trial(k, n, spent[i] + spent[half + i], ((blocks[i][1], spent[i]), (blocks[half + i][1], spent[half + i])))
              for i, (k, n) in enumerate(trial.calls)]
    first_call = train_function.first_call_seconds if calls_before == 0 else 0.0
    return TimedFit(trials, trial.steps, len(schedule), time.perf_counter() - began, meter.waited_s,
                    train_function.seconds - inside_before, first_call)


def run_trial(model: Any, train_function: Any, dataset: Any, meter: Any, trial: TrialPlan, attempt: int,
              class_weight: dict[int, float] | None = None) -> TrialResult:
    """steps_per_execution's trial: the candidates' calls (timed_fit), and the choice."""
    timed = timed_fit(model, train_function, dataset, meter, trial, class_weight)
    noise = margin(timed.trials)
    choice = TuningChoice(choose(timed.trials), {str(t.steps_per_execution): round(1000 * t.seconds_per_step, 4)
                                                 for t in timed.trials}, attempt,
                          tie_margin=round(noise, 3) if noise > MARGIN else None)
    log.info("%s", choice.note())
    return TrialResult(choice, timed.steps, timed.executions, timed.seconds, timed.waited_s, timed.inside_seconds,
                       timed.first_call_seconds)


def fit_plan(plan: RuntimePlan, trial: TrialResult | None) -> RuntimePlan:
    """Where fit starts: after the trial's steps, which belong to the plan's first epoch."""
    if trial is None:
        return plan
    return replace(plan, initial_step=plan.initial_step + trial.steps,
                   initial_global_step=plan.initial_global_step + trial.steps)


def use_steps_per_execution(plan: RuntimePlan, model: Any, train_function: Any, k: int, note: str) -> RuntimePlan:
    set_steps_per_execution(model, train_function, k)
    return replace(plan, steps_per_execution=k, notes=plan.notes + (note,))


def set_steps_per_execution(model: Any, train_function: Any, k: int) -> None:
    from agent.step_functions import make_test_function

    # Keras' fit reads model.steps_per_execution for how many calls an epoch gets; validation's
    # function bakes its count in, so it is made again.
    model.steps_per_execution = train_function.steps_per_execution = k
    model.train_function = train_function
    model.test_function = make_test_function(model, k)


def alternative_plan(steps_per_execution: int) -> TrialPlan:
    """What trying one more way to run the chosen steps per call takes (try_alternative): one traced
    call of one step, then MEASURED_STEPS timed steps (two calls at least) of the chosen size."""
    k = steps_per_execution
    return TrialPlan(1, ((k, max(2, -(-MEASURED_STEPS // k))),))


def try_alternative(result: TrialResult, model: Any, plain: Any, dataset: Any, meter: Any, install: Any, undo: Any,
                    what: str, class_weight: dict[int, float] | None = None,
                    rounds: int = 1) -> tuple[Any, TrialResult, float | None, float | None]:
    """One more way to run the chosen steps per call (agent/xla_trial.py, agent/precision_trial.py),
    tried as more real steps of the first epoch: `install()` puts it in place and returns its train
    function, or None where the model refuses it (nothing trains). Each round is alternative_plan's
    calls of the alternative; with `rounds` > 1 the plain function runs the same calls between them,
    so a neighbour's burst on a shared machine slows both alike (the plain function is traced already,
    and the alternative after its first round: the other rounds' first call is only untimed).

    Returns the train function in place now, `result` with the steps trained added, the alternative's
    seconds per step and the plain function's between its rounds (None where none ran). The first is
    None where the alternative was refused or raised: then `undo()` has run and the plain function is
    back. The caller keeps the alternative or undoes it; it checks that the rounds fit the epoch first."""
    k = result.choice.steps_per_execution
    before = int(model.optimizer.iterations.numpy())
    alternative = install()
    if alternative is None:
        undo()
        set_steps_per_execution(model, plain, k)
        return plain, result, None, None
    timed: list[TimedFit] = []
    plain_timed: list[TimedFit] = []
    try:
        for i in range(rounds):
            if i:
                set_steps_per_execution(model, plain, k)
                plain_timed.append(timed_fit(model, plain, dataset, meter, alternative_plan(k), class_weight))
                set_steps_per_execution(model, alternative, k)
            timed.append(timed_fit(model, alternative, dataset, meter, alternative_plan(k), class_weight))
    except Exception as exc:  # a compile or a kernel refuses the model: the error is TensorFlow's, of any class
        log.warning("%s: the model did not train this way: %s", what, str(exc).splitlines()[0][:300])
        undo()
        set_steps_per_execution(model, plain, k)
        # The steps that did train. Not the function's own count: under XLA it is bumped beside the
        # cluster, which still runs when the cluster fails (seen under MirroredStrategy on a CPU, TF 2.21).
        trained = int(model.optimizer.iterations.numpy()) - before
        return plain, replace(result, steps=result.steps + trained), None, None
    merged = result
    for t in timed + plain_timed:
        merged = replace(merged, steps=merged.steps + t.steps, executions=merged.executions + t.executions,
                         seconds=merged.seconds + t.seconds, waited_s=merged.waited_s + t.waited_s,
                         inside_seconds=merged.inside_seconds + t.inside_seconds)

    def per_step(runs: list[TimedFit]) -> float | None:
        return sum(t.trials[0].seconds for t in runs) / sum(t.trials[0].calls * k for t in runs) if runs else None

    return alternative, merged, per_step(timed), per_step(plain_timed)
