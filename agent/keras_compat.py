"""Two repairs that let Keras 3's model.fit train under MultiWorkerMirroredStrategy.

Keras 3 (seen on 3.15 with TF 2.21) cannot fit under that strategy at all
(keras-team/keras#20585, tensorflow/tensorflow#72388, both open):

1. `Trainer._maybe_symbolic_build` passes the whole (x, y) batch of PerReplica values to
   `strategy.reduce`, which the collective implementation cannot take ("Attempt to convert a value
   (PerReplica...)"). The batch is only used for its shapes, so the repair takes this worker's first
   replica's batch instead of reducing across workers.
2. `reduce_per_replica` reduces scalar losses and metrics with `axis=0` under this strategy, which
   fails for scalars ("Invalid reduction dimension 0 for input with 0 dimensions"). The repair
   averages across replicas (axis=None), which is what the other strategies' path computes.

Applied only under MultiWorkerMirroredStrategy, and only where the Keras internals still have the
shape this was written against; otherwise the unrepaired error will say what changed.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("trainjobs.agent")


def repair_multi_worker_fit(model: Any, strategy: Any) -> list[str]:
    """Returns a note per repair applied, for the runtime plan."""
    import tensorflow as tf
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer as tf_trainer

    notes = []
    if hasattr(model, "_maybe_symbolic_build") and hasattr(model, "_symbolic_build"):

        def symbolic_build_from_local_batch(iterator: Any = None, data_batch: Any = None) -> None:
            if iterator is not None:
                for _, _, it in iterator:
                    data_batch = tree.map_structure(
                        lambda v: strategy.experimental_local_results(v)[0]
                        if isinstance(v, tf.distribute.DistributedValues) else v,
                        next(it))
                    break
            with strategy.scope():
                model._symbolic_build(data_batch=data_batch)

        model._maybe_symbolic_build = symbolic_build_from_local_batch
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
