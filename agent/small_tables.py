"""Defaults for small tables (issue 37): what the agent chooses, where the spec leaves a setting unset,
for a table small enough that the general defaults overfit or barely train.

On scikit-learn's diabetes (442 rows, 353 trained on), the built-in mlp with every default but 60 epochs
scored a held-out R² of 0.26 against LinearRegression's 0.40 on the same rows: 128 and 64 units with 10%
dropout memorised 353 rows within a dozen epochs and kept the last epoch's weights; iris at the default
10 epochs trained 30 steps (96 rows at batch 32) and stopped short of LogisticRegression. bench/README.md
("Issue 37: small tables") measures what follows against scikit-learn's linear and tree baselines.

A small table: plain features (one axis: a CSV's columns, an .npz of rows) and a training split of at
most SMALL_TABLE_ROWS rows. There, and only for what the spec leaves unset:
- the batch (neither per_replica_batch_size nor global_batch_size given): at most the default 32 a
  replica, less so that an epoch has about MIN_STEPS steps, at least MIN_BATCH;
- training.learning_rate `auto`: LEARNING_RATE rather than 0.001, so the default 10 epochs of a
  100-row table (120 steps) train it, where early stopping guards the longer runs;
- training.early_stopping `auto`: with a validation split, stop on val_loss after `patience` epochs
  without improvement and keep the best epoch's weights (without one: none, the notes say so);
- the built-in mlp's hidden_units and dropout (model.params without them): one hidden layer, narrower
  below 1,000 rows, with more dropout where the rows are enough to overfit (MLP_SIZES).
Every choice is a line of runtime.notes. An explicit setting always wins, even one equal to a default.

Pure: imports neither TensorFlow nor Keras (tests/unit/test_small_tables.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainjobs.spec import JobSpec
from trainjobs.spec.derived import DEFAULT_LEARNING_RATE, DEFAULT_PER_REPLICA_BATCH
from trainjobs.spec.training import EarlyStopping

SMALL_TABLE_ROWS = 10_000
MIN_STEPS = 32  # steps an epoch should have: iris at batch 32 had 3
# The least batch: iris (96 rows) trains 24 steps an epoch at 4; at 8, 10 epochs of 12 steps left it short
# of LogisticRegression (0.88 held-out accuracy against 0.96, bench/README.md).
MIN_BATCH = 4
PATIENCE = 10  # epochs without a better val_loss: a 71-row validation split is noisy from epoch to epoch
LEARNING_RATE = 3e-3

# (training rows at most, hidden units, dropout): the built-in mlp's size where model.params leaves it. Up to
# 200 rows the default 10 epochs are a few hundred steps and dropout 0.3 left iris short of LogisticRegression;
# from there to 1,000 rows there are steps enough to overfit, and on diabetes dropout 0.3 halved the worst
# split's shortfall against LinearRegression that 0.1 left (bench/README.md, "Issue 37: small tables").
MLP_SIZES: tuple[tuple[int, list[int], float], ...] = (
    (200, [64], 0.1),
    (1_000, [64], 0.3),
    (SMALL_TABLE_ROWS, [128], 0.2),
)


@dataclass(frozen=True)
class TableDefaults:
    """What the agent chose for a small table; None or empty where the spec (or the data) decides."""

    per_replica_batch_size: int | None = None
    learning_rate: float | None = None  # what `auto` is, before lr_scaling
    early_stopping: EarlyStopping | None = None
    mlp_params: dict[str, Any] | None = None  # model.params as built (the user's, with the chosen sizes)
    notes: tuple[str, ...] = ()


def is_small_table(input_shape: tuple[int, ...], train_examples: int) -> bool:
    return len(input_shape) == 1 and train_examples <= SMALL_TABLE_ROWS


def small_batch(train_examples: int, replicas: int) -> int:
    """The per-replica batch, a power of two from MIN_BATCH to the default, that gives an epoch about
    MIN_STEPS steps or more over `replicas`."""
    batch = DEFAULT_PER_REPLICA_BATCH
    while batch > MIN_BATCH and train_examples // (batch * replicas) < MIN_STEPS:
        batch //= 2
    return batch


def choose(spec: JobSpec, input_shape: tuple[int, ...], train_examples: int, validation_examples: int,
           replicas: int) -> TableDefaults:
    """The defaults for this data, or none when it is not a small table (or the spec set everything)."""
    if not is_small_table(input_shape, train_examples) or spec.model is None:
        return TableDefaults()
    t, rows = spec.training, f"{train_examples} training rows"
    notes: list[str] = []
    batch = None
    if t.per_replica_batch_size is None and t.global_batch_size is None:
        chosen = small_batch(train_examples, replicas)
        if chosen != DEFAULT_PER_REPLICA_BATCH:
            batch = chosen
            notes.append(f"small table ({rows}): batch {chosen} a replica, not {DEFAULT_PER_REPLICA_BATCH}, so an "
                         f"epoch has {train_examples // (chosen * replicas)} steps (training.per_replica_batch_size "
                         "sets it)")
    rate = None
    if t.learning_rate == "auto":
        rate = LEARNING_RATE
        notes.append(f"small table ({rows}): learning rate {LEARNING_RATE:g}, not {DEFAULT_LEARNING_RATE:g} "
                     "(training.learning_rate sets it)")
    stopping = None
    if t.early_stopping == "auto":
        if validation_examples:
            stopping = EarlyStopping(monitor="val_loss", patience=PATIENCE, restore_best=True)
            notes.append(f"small table ({rows}): early stopping on val_loss, patience {PATIENCE}, the best epoch's "
                         "weights kept (training.early_stopping: false turns it off)")
        else:
            notes.append(f"small table ({rows}): no early stopping, there is no validation split to watch "
                         "(dataset.options.validation_split)")
    params = None
    if spec.model.name == "mlp" and spec.model.module is None:
        given = spec.model.params
        size = next((units, dropout) for most, units, dropout in MLP_SIZES if train_examples <= most)
        chosen_params = {k: v for k, v in (("hidden_units", size[0]), ("dropout", size[1])) if k not in given}
        if chosen_params:
            params = {**given, **chosen_params}
            notes.append(f"small table ({rows}): mlp " + ", ".join(f"{k} {v}" for k, v in chosen_params.items())
                         + " (model.params sets them)")
    return TableDefaults(batch, rate, stopping, params, tuple(notes))
