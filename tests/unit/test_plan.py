"""The agent's runtime plan, without TensorFlow: which strategy and precision the hardware it got
calls for, the batch and learning rate over the replicas, the checkpoint schedules at call boundaries,
and where a resumed run starts."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support.agent import spec
from trainjobs.spec import JobSpec, TrainingSpec
from agent.checkpoints import CheckpointSchedule
from agent.plan import Hardware, PlanError, TrainingPosition, resolve_plan, resume_from, strategy_to_build


def _plan(accelerator: dict[str, Any], local: int | None = None, cc: float | None = None, **kw: Any) -> Any:
    s = JobSpec.model_validate(spec(accelerator=accelerator, **kw))
    kind = accelerator["type"]
    hw = Hardware(kind, local or s.accelerator.replicas, cc, local_devices=local)
    name = strategy_to_build(s, hw)
    return resolve_plan(s, hw, name, local or s.num_replicas, train_examples=1437)


@pytest.mark.parametrize(("accelerator", "local", "cc", "strategy", "precision", "spe"), [
    ({"type": "tpu", "tpu_type": "v4-8"}, None, None, "tpu", "mixed_bfloat16", 11),
    ({"type": "tpu", "tpu_type": "v4-8"}, 2, None, "mirrored", "mixed_bfloat16", 22),
    ({"type": "gpu", "gpu_type": "nvidia-l4", "count": 1}, None, 8.9, "one_device", "mixed_float16", 8),
    ({"type": "gpu", "gpu_type": "nvidia-tesla-p100", "count": 1}, None, 6.0, "one_device", "float32", 8),
    ({"type": "gpu", "gpu_type": "nvidia-tesla-t4", "count": 4}, None, 7.5, "mirrored", "mixed_float16", 8),
    ({"type": "cpu"}, None, None, "default", "float32", 4),
])
def test_plan_follows_the_hardware(accelerator: dict[str, Any], local: int | None, cc: float | None, strategy: str,
                                   precision: str, spe: int) -> None:
    plan = _plan(accelerator, local, cc)
    assert (plan.strategy, plan.precision, plan.steps_per_execution) == (strategy, precision, spe)
    # Every step the data and batch imply, whether or not steps_per_execution divides them.
    assert plan.steps_per_epoch == 1437 // plan.global_batch_size


@pytest.mark.parametrize(("training", "global_batch", "lr", "warmup_steps"), [
    ({"per_replica_batch_size": 64}, 128, 0.001, 0),
    ({"global_batch_size": 256, "lr_scaling": "linear", "lr_base_batch_size": 128}, 256, 0.002, 0),
    ({"per_replica_batch_size": 32, "lr_scaling": "sqrt", "lr_base_batch_size": 16}, 64, 0.002, 0),
    ({"per_replica_batch_size": 32, "warmup_epochs": 1.5, "epochs": 3}, 64, 0.001, 33),  # 22 steps an epoch
])
def test_plan_scales_batch_and_learning_rate_over_the_replicas_it_got(training: dict[str, Any], global_batch: int,
                                                                      lr: float, warmup_steps: int) -> None:
    plan = _plan({"type": "cpu", "replicas": 2}, local=2, training=training)
    assert plan.global_batch_size == global_batch
    assert plan.learning_rate == pytest.approx(lr)
    assert plan.warmup_steps == warmup_steps


def test_plan_refuses_a_batch_larger_than_the_data() -> None:
    with pytest.raises(PlanError, match="larger than the training split"):
        _plan({"type": "cpu"}, training={"global_batch_size": 4096})


def _small_plan(steps_per_epoch: int, steps_per_execution: int, epochs: int) -> Any:
    return dataclasses.replace(_plan({"type": "cpu", "replicas": 2}, local=2), steps_per_epoch=steps_per_epoch,
                               steps_per_execution=steps_per_execution, epochs=epochs)


@pytest.mark.parametrize(("every_epochs", "every_steps", "expected"), [
    (1, None, [(1, 0, 12), (2, 0, 24)]),
    (5, None, [(2, 0, 24)]),  # the last epoch is always saved
    # Multiples of 5 are reached by the calls ending at 8, 12, 16 and 20; the one ending at 12
    # ends epoch 1, so its checkpoint is that epoch's.
    (1, 5, [(0, 8, 8), (1, 0, 12), (1, 4, 16), (1, 8, 20), (2, 0, 24)]),
    (5, 10, [(1, 0, 12), (1, 8, 20), (2, 0, 24)]),
])
def test_checkpoints_follow_the_epoch_and_step_schedules_at_call_boundaries(
        every_epochs: int, every_steps: int | None, expected: list[tuple[int, int, int]]) -> None:
    """Two epochs of 12 steps, run 4 steps per call."""
    saved: list[TrainingPosition] = []
    store = SimpleNamespace(save=lambda checkpoint, at, final=False: saved.append(at) or True, uploading=lambda: False)
    training = TrainingSpec(epochs=2, checkpoint_every_epochs=every_epochs, checkpoint_every_steps=every_steps)
    schedule = CheckpointSchedule(store, None, training, _small_plan(12, 4, epochs=2))  # type: ignore[arg-type]
    for epoch in range(2):
        for step in (4, 8, 12):
            schedule.after_call(TrainingPosition(epoch, step, 12 * epoch + step))
        schedule.after_epoch(TrainingPosition(epoch + 1, 0, 12 * (epoch + 1)))
    assert [(at.epoch, at.step, at.global_step) for at in saved] == expected


def test_a_save_due_during_the_last_upload_is_skipped_then_taken_once_it_is_done() -> None:
    """A job of one task does not wait for storage between epochs: a checkpoint due while the last one
    still uploads is skipped (CheckpointStore.may_skip) and taken at the first call after the upload
    ends; the final one is never skipped (the real store waits for the upload instead)."""
    saved: list[TrainingPosition] = []
    busy = {"now": False}

    def save(checkpoint: Any, at: TrainingPosition, final: bool = False) -> bool:
        if busy["now"] and not final:
            return False
        saved.append(at)
        return True

    store = SimpleNamespace(save=save, uploading=lambda: busy["now"])
    schedule = CheckpointSchedule(store, None, TrainingSpec(epochs=2), _small_plan(12, 4, epochs=2))  # type: ignore[arg-type]
    busy["now"] = True
    schedule.after_epoch(TrainingPosition(1, 0, 12))  # due, skipped
    schedule.after_call(TrainingPosition(1, 4, 16))  # still uploading: nothing
    busy["now"] = False
    schedule.after_call(TrainingPosition(1, 8, 20))  # free: the skipped save is taken now
    schedule.after_call(TrainingPosition(1, 12, 24))  # nothing due
    busy["now"] = True
    schedule.after_epoch(TrainingPosition(2, 0, 24))  # the final checkpoint: never skipped
    assert [(at.epoch, at.step) for at in saved] == [(1, 8), (2, 0)]


@pytest.mark.parametrize(("saved", "steps_per_epoch", "start", "noted"), [
    (TrainingPosition(1, 8, 20), 12, TrainingPosition(1, 8, 20), False),
    (TrainingPosition(1, 0, 12), 12, TrainingPosition(1, 0, 12), False),
    # Not at an execution boundary of this plan: the epoch's last call is a shorter one.
    (TrainingPosition(1, 6, 18), 12, TrainingPosition(1, 6, 18), False),
    # Saved under a plan with longer epochs: this plan's last step, so one step is left to run.
    (TrainingPosition(1, 10, 22), 8, TrainingPosition(1, 7, 22), True),
    (TrainingPosition(3, 0, 36), 12, TrainingPosition(2, 0, 36), False),  # every epoch done
])
def test_resume_starts_where_the_checkpoint_was_taken(saved: TrainingPosition, steps_per_epoch: int,
                                                      start: TrainingPosition, noted: bool) -> None:
    plan = resume_from(_small_plan(steps_per_epoch, 4, epochs=2), saved)
    assert plan.start == start
    assert any("resumes at step" in note for note in plan.notes) == noted
