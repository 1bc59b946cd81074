"""Repairs to Keras 3's TensorFlow backend, each applied only where the Keras at hand needs it: on the
TPU and Deep Learning VM images the agent trains with the image's Keras, which is older than the dev
venv's (`make test-images` runs the agent under each default image's).

Before the model is built (`repair_before_build`), for older Keras (3.4 and 3.6, the Keras of the
TF 2.17 and 2.18 images), what newer Keras does itself:

- Metric variables that read one replica. Older Keras creates them as plain TF variables, which a
  strategy mirrors and updates on each replica apart, and a metric's result read on the host is
  replica 0's alone: every reported loss and accuracy covered one replica's share of the data (one
  GPU's of several, one TPU core's of eight, one worker's). Newer Keras creates them `ON_READ` with
  `SUM` aggregation, so that a read adds up every replica's state (across workers too).
- uint32 seed states (Keras 3.4): under MultiWorkerMirroredStrategy every variable's initial value is
  broadcast from the chief, and the collective takes no uint32 ("Value for attr 'T' of uint32 is not in
  the list of allowed values"), so any model with Dropout failed to build. Newer Keras keeps the seed
  state of its TF backend in int64.

After it is built, under MultiWorkerMirroredStrategy (`repair_multi_worker_fit`): Keras 3 (seen on 3.15
with TF 2.21) cannot fit under that strategy at all (keras-team/keras#20585, tensorflow/tensorflow#72388,
both open):

1. `Trainer._maybe_symbolic_build` passes the whole (x, y) batch of PerReplica values to
   `strategy.reduce`, which the collective implementation cannot take ("Attempt to convert a value
   (PerReplica...)"). The batch is only used for its shapes, so the repair takes this worker's first
   replica's batch instead of reducing across workers. (Keras 3.4 has no `_maybe_symbolic_build`.)
2. `reduce_per_replica` reduces scalar losses and metrics with `axis=0` under this strategy, which
   fails for scalars ("Invalid reduction dimension 0 for input with 0 dimensions"). The repair
   averages across replicas (axis=None), which is what the other strategies' path computes.

Each applies only where the Keras internals still have the shape it was written against; otherwise the
unrepaired error will say what changed.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("trainjobs.agent")


def repair_before_build() -> list[str]:
    """Before the model and its metrics are built. Returns a note per repair applied, for the runtime plan."""
    notes = _repair_metric_variables() + _repair_seed_dtype()
    for note in notes:
        log.info(note)
    return notes


def _repair_metric_variables() -> list[str]:
    import tensorflow as tf
    from keras.src.backend.tensorflow import core

    variable = core.Variable
    if hasattr(variable, "_map_synchronization") or getattr(variable, "_trainjobs_repaired", False):
        return []  # newer Keras creates them so itself; or repaired already in this process
    original = variable._initialize

    def initialize(self: Any, value: Any) -> None:
        # Only metrics' variables are "sum" in these versions (weights "mean", the optimizer's step
        # "only_first_replica"); ON_READ takes only variables that are not trained.
        if self.aggregation != "sum" or self.trainable:
            return original(self, value)  # type: ignore[no-any-return]
        self._value = tf.Variable(value, dtype=self._dtype, trainable=False, name=self.name,
                                  synchronization=tf.VariableSynchronization.ON_READ,
                                  aggregation=tf.VariableAggregation.SUM)

    variable._initialize = initialize
    if "_initialize_with_initializer" in vars(variable):  # 3.6 creates deferred variables here, not in _initialize
        variable._initialize_with_initializer = lambda self, init: self._initialize(
            lambda: init(self._shape, dtype=self._dtype))
    variable._trainjobs_repaired = True
    return ["keras repair: metrics read every replica's state (ON_READ variables, as in newer Keras)"]


def _repair_seed_dtype() -> list[str]:
    from keras.src import backend
    from keras.src.random import seed_generator

    generator = seed_generator.SeedGenerator
    if hasattr(backend, "random_seed_dtype") or getattr(generator, "_trainjobs_repaired", False):
        return []  # newer Keras picks the backend's seed type itself; or repaired already in this process
    original = generator.__init__

    def __init__(self: Any, seed: Any = None, name: Any = None, **kwargs: Any) -> None:
        # The generator makes its state, and later its increments, through the backend it is given.
        if kwargs.get("backend") is None:
            kwargs["backend"] = _Int64Seeds(backend)
        original(self, seed, name, **kwargs)

    generator.__init__ = __init__
    generator._trainjobs_repaired = True
    return ["keras repair: seed states in int64, which the multi-worker broadcast takes (as in newer Keras)"]


class _Int64Seeds:
    """Keras' backend as a SeedGenerator sees it, with uint32 (its state's type) read as int64."""

    def __init__(self, backend: Any):
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def Variable(self, *args: Any, dtype: Any = None, **kwargs: Any) -> Any:  # noqa: N802 - the backend's name
        return self._backend.Variable(*args, dtype="int64" if dtype == "uint32" else dtype, **kwargs)

    def convert_to_tensor(self, x: Any, dtype: Any = None, **kwargs: Any) -> Any:
        return self._backend.convert_to_tensor(x, dtype="int64" if dtype == "uint32" else dtype, **kwargs)


def repair_multi_worker_fit(model: Any, strategy: Any) -> list[str]:
    """Returns a note per repair applied, for the runtime plan. `model` is one model, or None for every
    model of this process (a program's, through the runtime: its models are its own to make)."""
    import tensorflow as tf
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer as tf_trainer

    notes = []
    target = tf_trainer.TensorFlowTrainer if model is None else model
    if hasattr(target, "_maybe_symbolic_build") and hasattr(target, "_symbolic_build") and not getattr(
            target._maybe_symbolic_build, "_trainjobs_repaired", False):

        def build_from_local_batch(of: Any, iterator: Any = None, data_batch: Any = None) -> None:
            if iterator is not None:
                for *_, it in _executions(iterator):
                    data_batch = tree.map_structure(
                        lambda v: strategy.experimental_local_results(v)[0]
                        if isinstance(v, tf.distribute.DistributedValues) else v,
                        next(it))
                    break
            with strategy.scope():
                of._symbolic_build(data_batch=data_batch)

        def on_the_model(iterator: Any = None, data_batch: Any = None) -> None:
            build_from_local_batch(model, iterator, data_batch)

        replacement: Any = build_from_local_batch if model is None else on_the_model
        replacement._trainjobs_repaired = True
        target._maybe_symbolic_build = replacement
        notes.append("keras multi-worker repair: symbolic build from the local batch (keras-team/keras#20585)")

    original = getattr(tf_trainer, "reduce_per_replica", None)
    if original is not None and not getattr(original, "_trainjobs_repaired", False):

        def reduce_per_replica(values: Any, strategy_: Any, reduction: Any) -> Any:
            if isinstance(strategy_, tf.distribute.MultiWorkerMirroredStrategy) and reduction in ("auto", "mean"):
                return tree.map_structure(
                    lambda v: strategy_.reduce("MEAN", v, axis=None)
                    if isinstance(v, tf.distribute.DistributedValues) or tf.is_tensor(v) else v,
                    values)
            return original(values, strategy_, reduction)

        # A marker on the function itself, so a second call in the same process does not wrap the
        # wrapper; mypy has no type for attributes set on a function.
        reduce_per_replica._trainjobs_repaired = True  # type: ignore[attr-defined]
        tf_trainer.reduce_per_replica = reduce_per_replica
        notes.append("keras multi-worker repair: scalar metrics averaged across replicas (keras-team/keras#20585)")
    for note in notes:
        log.info(note)
    return notes


def _executions(epoch_iterator: Any) -> Any:
    """The (..., iterator) tuples of a Keras TF epoch iterator: newer Keras (3.15) iterates it for
    (first step, last step, iterator); older (3.6, on the TF 2.18 images) has only enumerate_epoch(),
    which gives (first step, iterator)."""
    return epoch_iterator if hasattr(epoch_iterator, "__iter__") else epoch_iterator.enumerate_epoch()
