"""The input-wait meter (agent/input_wait.py) times what the train function waits for each batch: a
pipeline that takes 20 ms a batch shows as most of the training time, a cached one as next to none.
In this process, on the agent's own train function."""

from __future__ import annotations

import time

import numpy as np
import pytest

pytestmark = pytest.mark.tf

STEPS, SLOW_S = 24, 0.02


def _train(slow: bool, steps_per_execution: int) -> tuple[float, float, int]:
    """(seconds waited, seconds the fit took, steps run) for one epoch of STEPS steps."""
    import keras
    import tensorflow as tf

    from agent.input_wait import InputWaitMeter
    from agent.step_functions import install_step_functions

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", steps_per_execution=steps_per_execution)
    meter = InputWaitMeter()
    train_function = install_step_functions(model, steps_per_execution, meter)
    rng = np.random.default_rng(0)
    data = tf.data.Dataset.from_tensor_slices((rng.random((40, 3), np.float32), rng.integers(0, 2, 40)))
    data = data.batch(4, drop_remainder=True).cache().repeat()
    if slow:  # every batch takes SLOW_S to come, after any buffer: the steps wait for each one
        def slowly(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            tf.py_function(lambda: time.sleep(SLOW_S), [], [])
            return x, y

        data = data.map(slowly)
    else:
        data = data.prefetch(8)
    train_function.start_epochs(1)
    model.fit(data, epochs=1, steps_per_epoch=1, verbose=0)  # traces
    meter.reset()
    train_function.start_epochs(STEPS)
    began = time.perf_counter()
    model.fit(data, epochs=1, steps_per_epoch=STEPS, verbose=0)
    return meter.waited_s, time.perf_counter() - began, train_function.steps_run


@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_a_slow_input_is_most_of_the_wait_and_a_cached_one_next_to_none(steps_per_execution: int) -> None:
    waited, took, steps = _train(slow=True, steps_per_execution=steps_per_execution)
    assert steps == 1 + STEPS  # the trace's step and the epoch's
    # Each of the epoch's batches slept SLOW_S before the step could have it (less where a step overlapped).
    assert STEPS * SLOW_S * 0.8 <= waited <= took, (waited, took)
    fast_waited, fast_took, _ = _train(slow=False, steps_per_execution=steps_per_execution)
    assert fast_waited < waited / 4, (fast_waited, fast_took, waited)
