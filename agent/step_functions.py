"""The functions model.fit calls once per execution: `steps_per_execution` steps in one tf.function
call, for training and validation, under every strategy.

Keras 3's own multi-step function (seen on 3.15 with TF 2.21) runs each step inside
`tf.cond(the iterator has another batch, step, skip)` so that it can stop part-way through an
execution at the end of finite data. Under MirroredStrategy and MultiWorkerMirroredStrategy the
step then calls `merge_call` (the optimizer's all-reduce and update; under multi-worker also the
metrics') from a cond branch in replica context, which tf.distribute does not support: the graph
asks for a placeholder no one feeds ("You must feed a value for placeholder tensor
'while/cond/Placeholder_1'", keras-team/keras#19246; Keras' LossScaleOptimizer documents the same
rule). Here no step runs inside a cond:

- training runs `steps_per_execution` steps in a tf.while_loop, the loop tf.keras 2 ran under
  every strategy: its input repeats without end. An epoch that is not a whole number of
  executions ends with a shorter call: the loop's trip count is an argument of the traced function
  (one trace serves both lengths), and the function counts the steps of the epoch it is in, since
  Keras would ask for a whole execution there (its epoch iterator steps by steps_per_execution and
  never says how many steps are left). It counts, inside the graph, the steps it ran, so the
  history shows how many steps each call really took;
- validation data is finite, so its loop stops when the data does: the loop condition tests the
  next batch, which is fetched ahead (only that fetch sits in a cond, and it has no merge_call).
"""

from __future__ import annotations

import time
from typing import Any


class CountingTrainFunction:
    """Installed as `model.train_function`; fit() then calls it instead of building its own.

    `start_epochs(steps)` (before each model.fit) says how many steps each epoch of that fit has;
    every call runs min(steps_per_execution, the steps left in the epoch)."""

    def __init__(self, model: Any, steps_per_execution: int, meter: Any = None):
        """meter: an agent.input_wait.InputWaitMeter that every batch is fetched through (None: plain fetches)."""
        import tensorflow as tf

        self.meter = meter
        fetch = meter.next if meter is not None else next
        self.calls = 0
        self.steps_called = 0  # the steps the calls so far were asked to run, counted on the host
        # Wall time inside the calls, and the first call's alone (tracing and compilation): an eager call
        # of a tf.function returns once its outputs are computed, so this is the time the steps took.
        self.seconds = 0.0
        self.first_call_seconds = 0.0
        self.steps_per_execution = steps_per_execution
        self._epoch_steps: int | None = None
        self._done_in_epoch = 0
        self._scheduled: list[int] = []
        # Created outside the strategy scope: a plain host variable, bumped in cross-replica context.
        self._steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="trainjobs_steps_run")
        one_step = _distributed_step(model, model.train_step)

        def execution(iterator: Any, steps: Any) -> Any:
            # The first step outside the loop gives the loop its outputs' structure.
            outputs = one_step(fetch(iterator))
            self._steps.assign_add(1)
            for _ in tf.range(steps - 1):
                outputs = one_step(fetch(iterator))
                self._steps.assign_add(1)
            return outputs

        self._execution = tf.function(execution, reduce_retracing=True)

    def start_epochs(self, steps_per_epoch: int) -> None:
        if steps_per_epoch < 1:
            raise ValueError(f"an epoch needs at least one step, got {steps_per_epoch}")
        self._epoch_steps, self._done_in_epoch = steps_per_epoch, 0

    def steps_for_next_call(self) -> int:
        if self._epoch_steps is None:
            return self.steps_per_execution
        return min(self.steps_per_execution, self._epoch_steps - self._done_in_epoch)

    def __call__(self, iterator: Any) -> Any:
        import tensorflow as tf

        if self._scheduled:
            steps = self._scheduled.pop(0)
        else:
            steps = self.steps_for_next_call()
            if self._epoch_steps is not None:
                self._done_in_epoch = (self._done_in_epoch + steps) % self._epoch_steps
        self.calls += 1
        self.steps_called += steps
        began = time.perf_counter()
        outputs = self._execution(iterator, tf.constant(steps, tf.int32))
        took = time.perf_counter() - began
        self.seconds += took
        if self.calls == 1:
            self.first_call_seconds = took
        return outputs

    def schedule_calls(self, steps: list[int]) -> None:
        """The next calls run exactly these step counts, whatever the epoch's: steps_per_execution's
        measured trial (agent/tuning.py), a fit of its own whose Keras loop calls once per entry."""
        self._scheduled = list(steps)

    @property
    def steps_run(self) -> int:
        """Training steps run so far (reading it waits for the calls in flight)."""
        return int(self._steps.numpy())


def make_test_function(model: Any, steps_per_execution: int) -> Any:
    """Up to `steps_per_execution` validation steps per call, fewer at the end of the data. Keras
    calls it only while at least one batch is left (it knows the count: eval_dataset asserts it)."""
    return _fetch_ahead_function(model, model.test_step, steps_per_execution)


def make_finite_train_function(model: Any, steps_per_execution: int) -> Any:
    """Training on finite data the way validation runs (make_test_function): up to
    `steps_per_execution` steps per call, fewer where the data ends, no step inside a cond. For a
    program's own fit (trainjobs/runtime), whose data and epochs are Keras' to count."""
    return _fetch_ahead_function(model, model.train_step, steps_per_execution)


def _fetch_ahead_function(model: Any, step_fn: Any, steps_per_execution: int) -> Any:
    import tensorflow as tf

    one_step = _distributed_step(model, step_fn)

    def execution(iterator: Any) -> Any:
        outputs = one_step(next(iterator))
        if steps_per_execution == 1:
            return outputs  # nothing to fetch ahead, and a fetch would swallow the next call's batch

        def more(done: Any, upcoming: Any, outputs: Any) -> Any:
            return tf.logical_and(done < steps_per_execution, upcoming.has_value())

        def step(done: Any, upcoming: Any, outputs: Any) -> Any:
            outputs = one_step(upcoming.get_value())
            # The last step of the execution fetches nothing: that batch belongs to the next call.
            upcoming = tf.cond(done + 1 < steps_per_execution, iterator.get_next_as_optional, lambda: upcoming)
            return done + 1, upcoming, outputs

        _, _, outputs = tf.while_loop(more, step, [tf.constant(1), iterator.get_next_as_optional(), outputs])
        return outputs

    return tf.function(execution, reduce_retracing=True)


def install_step_functions(model: Any, steps_per_execution: int, meter: Any = None) -> CountingTrainFunction:
    """After compile (which resets the model's functions), before fit. `meter`: what times the training
    input (agent/input_wait.py); without one, a train function that replaces one of these keeps its meter
    (XLA's and bfloat16's trials install their own train functions and call this without one)."""
    if steps_per_execution < 1:
        raise ValueError(f"steps_per_execution must be >= 1, got {steps_per_execution}")
    if meter is None and isinstance(getattr(model, "train_function", None), CountingTrainFunction):
        meter = model.train_function.meter
    train = CountingTrainFunction(model, steps_per_execution, meter)
    model.train_function = train
    model.test_function = make_test_function(model, steps_per_execution)
    return train


def _distributed_step(model: Any, step: Any) -> Any:
    """One step on every replica, its logs reduced across them: what Keras' one_step_on_data does."""
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer as tf_trainer

    strategy = model.distribute_strategy
    # XLA compiles each replica's step, as Keras' own train function does: a cluster around
    # strategy.run (the cross-replica call and its reduction) failed to run under MirroredStrategy
    # (TF 2.21: "Graph execution error" at the first call).
    replica_step = tf.function(step, jit_compile=True, reduce_retracing=True) if model.jit_compile else step

    def one_step(data: Any) -> Any:
        outputs = strategy.run(replica_step, args=(data,))
        # Looked up on the module at trace time, so keras_compat's multi-worker repair applies.
        return tf_trainer.reduce_per_replica(outputs, strategy, reduction="auto")

    return tf.function(one_step, reduce_retracing=True)
