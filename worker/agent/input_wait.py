"""How long training waits for its input, measured inside tf.data where the wait happens.

Keras pulls batches inside its compiled train function, so Python never sees the wait. The meter
therefore wraps the finished pipeline (after its prefetch) in a zip whose first input is a clock:

    zip(clock, pipeline).map(record)

Zip asks its inputs in order, and neither the clock nor the final map runs ahead of the consumer,
so the clock reads the time the consumer asked for a batch, the map reads the time the batch was
handed over, and the difference is the time the consumer was blocked on input. Summed over an
epoch's training steps and divided by their wall time, that is `input_wait_fraction`: near 0 when
the prefetch buffer is always full, near 1 when the accelerator idles on input.

Under MirroredStrategy and TPUStrategy the consumer is the distributed iterator's own buffer,
which feeds the devices; in steady state it waits exactly as long as the steps it feeds.
"""

from __future__ import annotations

import threading
from typing import Any


class InputWaitMeter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waited_s = 0.0

    def _add(self, seconds: Any) -> Any:
        import numpy as np

        with self._lock:
            self._waited_s += float(seconds)
        return np.float32(0)

    def reset(self) -> None:
        with self._lock:
            self._waited_s = 0.0

    @property
    def waited_s(self) -> float:
        with self._lock:
            return self._waited_s

    def wrap(self, dataset: Any) -> Any:
        import tensorflow as tf

        # tf.timestamp is stateful, so tf.data neither caches nor reorders the clock.
        clock = tf.data.Dataset.from_tensors(0).repeat().map(lambda _: tf.timestamp())

        def record(asked_at: Any, batch: Any) -> Any:
            waited = tf.timestamp() - asked_at
            token = tf.numpy_function(self._add, [waited], tf.float32, stateful=True)
            with tf.control_dependencies([token]):
                return tf.nest.map_structure(tf.identity, batch)

        options = tf.data.Options()
        # Either rewrite would run `record` ahead of the consumer and time a background thread instead.
        options.experimental_optimization.map_parallelization = False
        options.experimental_optimization.inject_prefetch = False
        return tf.data.Dataset.zip((clock, dataset)).map(record).with_options(options)
