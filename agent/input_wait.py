"""How long training waits for its input, measured inside tf.data where the wait happens.

Keras pulls batches inside its compiled train function, so Python never sees the wait. The meter
therefore wraps the finished pipeline (after its prefetch) in a zip whose first input is a clock:

    zip(clock, pipeline).map(record)

Zip asks its inputs in order, and neither the clock nor the final map runs ahead of the consumer,
so the clock reads the time the consumer asked for a batch, the map reads the time the batch was
handed over, and the difference is the time the consumer was blocked on input. Summed over an
epoch's training steps and divided by their wall time, that is `input_wait_fraction`: near 0 when
the prefetch buffer is always full, near 1 when the accelerator idles on input.

The sum lives in a host variable that `record` adds to inside the graph, so no Python runs in the
pipeline. The first version handed each wait to Python through tf.numpy_function, which took the
GIL on a tf.data thread while Keras' loop runs Python; the whole meter then cost ~0.15-0.2 ms of
CPU per batch, now ~0.1 ms (bench/README.md, "Trainer throughput").

Under MirroredStrategy and TPUStrategy the consumer is the distributed iterator's own buffer,
which feeds the devices; in steady state it waits exactly as long as the steps it feeds.
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

    def wrap(self, dataset: Any) -> Any:
        import tensorflow as tf

        # tf.timestamp is stateful, so tf.data neither caches nor reorders the clock.
        clock = tf.data.Dataset.from_tensors(0).repeat().map(lambda _: tf.timestamp())
        waited_s = self._waited_s

        def record(asked_at: Any, batch: Any) -> Any:
            added = waited_s.assign_add(tf.timestamp() - asked_at)
            with tf.control_dependencies([added]):
                return tf.nest.map_structure(tf.identity, batch)

        options = tf.data.Options()
        # Either rewrite would run `record` ahead of the consumer and time a background thread instead.
        options.experimental_optimization.map_parallelization = False
        options.experimental_optimization.inject_prefetch = False
        return tf.data.Dataset.zip((clock, dataset)).map(record).with_options(options)
