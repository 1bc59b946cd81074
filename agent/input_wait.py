"""How long training waits for its input, measured where training asks for each batch.

Keras pulls batches inside its compiled train function, so Python never sees the wait. The agent's
train function (agent/step_functions.py, CountingTrainFunction) asks for every batch through
`InputWaitMeter.next`, which reads the clock before the fetch and again once the batch is there,
inside the graph, and adds the difference to a host variable: the time the steps were blocked on
input. Summed over an epoch's training steps and divided by their wall time, that is
`input_wait_fraction`: near 0 when the prefetch buffer is always full, near 1 when the accelerator
idles on input. Under MirroredStrategy and TPUStrategy the fetch is the distributed iterator's, so
the wait is the one the replicas' steps see.

The first version handed each wait to Python through tf.numpy_function, about 0.15-0.2 ms of CPU per
batch. The second timed the pipeline from inside tf.data, a zip with a clock and a map that added
to the variable: about 0.1 ms per batch by itself, and 0.17-0.21 ms of the mlp's 0.7 ms step on the
AMD bench host, where three more stages of tf.data ran per batch (bench/README.md, 2026-12-07). Timed
in the graph, the clock and the sum are three small ops of the step loop.
"""

from __future__ import annotations

from typing import Any


class InputWaitMeter:
    """Create it after the strategy (TensorFlow's runtime must be configured first), outside its
    scope: the sum is a plain variable on this host's CPU, not one mirrored over the replicas."""

    def __init__(self) -> None:
        import tensorflow as tf

        with tf.device("/cpu:0"):
            self._waited_s = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="trainjobs_input_wait_s")

    def reset(self) -> None:
        self._waited_s.assign(0.0)

    @property
    def waited_s(self) -> float:
        return float(self._waited_s.numpy())

    def next(self, iterator: Any) -> Any:
        """`next(iterator)` inside a train function's graph, its wait added to the sum. The clock is read
        before the fetch starts and after every tensor of the batch is there."""
        import tensorflow as tf

        # The clock ops go where the function's host ops go (the host that fetches), the sum with its variable.
        asked = tf.timestamp()
        with tf.control_dependencies([asked]):
            batch = next(iterator)
        with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
            self._waited_s.assign_add(tf.timestamp() - asked)  # stateful: the function runs it before it returns
        return batch
