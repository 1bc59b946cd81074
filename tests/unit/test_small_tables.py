"""Issue 37: the defaults a small table gets where the spec leaves them unset, and only there: the batch,
early stopping with the best weights kept, the built-in mlp's size, each said in runtime.notes. An
explicit setting always wins, even one equal to a default; a stored spec from before `auto` keeps no
early stopping."""

from __future__ import annotations

from typing import Any

import pytest

from trainjobs.spec import JobSpec, parse_stored
from trainjobs.spec.training import EarlyStopping
from agent.plan import Hardware, resolve_plan
from agent.small_tables import SMALL_TABLE_ROWS, TableDefaults, choose, small_batch


def _job(model: dict[str, Any] | None = None, **training: Any) -> JobSpec:
    return JobSpec.model_validate({"task": "regression", "dataset": {"source": "diabetes.csv"},
                                   "model": model or {"name": "mlp"}, "training": {"epochs": 60, **training}})


def test_diabetes_with_nothing_set_gets_a_smaller_batch_a_higher_rate_early_stopping_and_an_mlp_size_each_noted(
        ) -> None:
    table = choose(_job(), (10,), train_examples=353, validation_examples=89, replicas=1)
    assert table.per_replica_batch_size == 8  # 44 steps an epoch, not 11
    assert table.learning_rate == 0.003
    assert table.early_stopping == EarlyStopping(monitor="val_loss", patience=10, restore_best=True)
    assert table.mlp_params == {"hidden_units": [64], "dropout": 0.3}
    assert len(table.notes) == 4 and all(n.startswith("small table (353 training rows)") for n in table.notes)
    assert "early stopping on val_loss, patience 10, the best epoch's weights kept" in table.notes[2]
    plan = resolve_plan(_job(), Hardware("cpu", 1), "default", 1, 353, table=table)
    assert (plan.global_batch_size, plan.steps_per_epoch, plan.learning_rate) == (8, 44, 0.003)
    assert plan.notes[:4] == table.notes
    general = resolve_plan(_job(), Hardware("cpu", 1), "default", 1, 353)  # not a small table: the general defaults
    assert (general.global_batch_size, general.learning_rate, general.notes) == (32, 0.001, ())


@pytest.mark.parametrize(("training", "params", "unchanged"), [
    ({"per_replica_batch_size": 32}, {}, "batch"),
    ({"global_batch_size": 32}, {}, "batch"),
    ({"learning_rate": 0.001}, {}, "learning_rate"),
    ({"early_stopping": False}, {}, "early_stopping"),
    ({"early_stopping": None}, {}, "early_stopping"),
    ({"early_stopping": {"monitor": "val_r2", "patience": 3}}, {}, "early_stopping"),
    ({}, {"hidden_units": [128, 64], "dropout": 0.1}, "mlp"),
])
def test_an_explicit_setting_wins_even_when_it_equals_the_old_default(training: dict[str, Any], params: dict[str, Any],
                                                                      unchanged: str) -> None:
    job = _job({"name": "mlp", "params": params}, **training)
    table = choose(job, (10,), train_examples=353, validation_examples=89, replicas=1)
    chosen = {"batch": table.per_replica_batch_size, "learning_rate": table.learning_rate,
              "early_stopping": table.early_stopping, "mlp": table.mlp_params}
    assert chosen.pop(unchanged) is None
    assert all(v is not None for v in chosen.values())  # the rest still chosen
    said = {"batch": "batch", "learning_rate": "learning rate", "early_stopping": "early stopping", "mlp": "mlp"}[unchanged]
    assert len(table.notes) == 3 and not any(said in n for n in table.notes), table.notes


@pytest.mark.parametrize(("rows", "units", "dropout"), [(96, [64], 0.1), (353, [64], 0.3), (1149, [128], 0.2)])
def test_the_mlp_is_sized_by_the_rows(rows: int, units: list[int], dropout: float) -> None:
    assert choose(_job(), (10,), rows, rows // 4, 1).mlp_params == {"hidden_units": units, "dropout": dropout}


def test_one_mlp_param_given_keeps_it_and_sizes_the_other() -> None:
    table = choose(_job({"name": "mlp", "params": {"dropout": 0.0}}), (10,), 353, 89, 1)
    assert table.mlp_params == {"dropout": 0.0, "hidden_units": [64]}


@pytest.mark.parametrize(("shape", "rows"), [((8, 8, 1), 1437), ((10,), SMALL_TABLE_ROWS + 1)])
def test_images_and_larger_tables_keep_the_general_defaults(shape: tuple[int, ...], rows: int) -> None:
    table = choose(_job(), shape, train_examples=rows, validation_examples=rows // 4, replicas=1)
    assert table == TableDefaults()


def test_without_a_validation_split_there_is_no_early_stopping_and_the_notes_say_why() -> None:
    table = choose(_job(), (10,), train_examples=442, validation_examples=0, replicas=1)
    assert table.early_stopping is None
    assert any("no early stopping, there is no validation split" in n for n in table.notes)


def test_a_users_model_on_a_small_table_gets_the_batch_and_early_stopping_but_keeps_its_params() -> None:
    table = choose(_job({"module": "gs://b/m.py", "params": {"width": 3}}), (10,), 353, 89, 1)
    assert table.per_replica_batch_size == 8 and table.early_stopping is not None and table.mlp_params is None


@pytest.mark.parametrize(("rows", "replicas", "batch"), [
    (96, 1, 4), (40, 1, 4), (353, 1, 8), (1149, 1, 32), (700, 1, 16), (700, 2, 8), (5000, 1, 32)])
def test_the_batch_gives_an_epoch_about_32_steps_between_4_and_32(rows: int, replicas: int, batch: int) -> None:
    assert small_batch(rows, replicas) == batch


def test_early_stopping_and_the_rate_are_auto_by_default_and_a_stored_spec_from_before_keeps_its_values() -> None:
    assert (_job().training.early_stopping, _job().training.learning_rate) == ("auto", "auto")
    stored = _job().model_dump(mode="json")
    stored["training"].update(early_stopping=None, learning_rate=0.001)  # as releases before issue 37 stored every job
    assert parse_stored(stored).training.early_stopping is None
    assert choose(parse_stored(stored), (10,), 353, 89, 1).learning_rate is None
    assert _job(early_stopping=True).training.early_stopping == EarlyStopping()
