"""The training input, fed each way training.cache_dataset can choose (agent/input_choice.py): parsed
once and held in memory, streamed, or streamed and cached. Whichever it is, one epoch's batches are the
training split's examples, each once, as training takes them (a regression's targets standardised), and
validation is the validation split in order. In this process, on staged shards in the GCS emulator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.agent import digits, write_dataset

pytestmark = pytest.mark.tf

BATCH = 16
MODES = ["memory", "stream", "stream_cached"]


def _rows(batches: Any, n: int) -> np.ndarray:
    """(features..., label) rows of the first n batches, sorted: the examples, whatever their order."""
    rows = [np.concatenate([x.numpy().reshape(len(x), -1), y.numpy().reshape(len(y), -1)], axis=1)
            for x, y in batches.take(n)]
    return np.array(sorted(map(tuple, np.concatenate(rows))))


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_every_input_mode_feeds_each_training_example_once_an_epoch(bucket: str, tmp_path: Path, task: str) -> None:
    from agent.data import download_dataset, eval_dataset, train_dataset

    x, y = digits()
    x, y = x[:16 * 20 + 40], y[:16 * 20 + 40]  # 320 training examples (20 batches), 40 for validation
    targets = y.astype(np.float32) * 3.0 + 1.0 if task == "regression" else y
    ds = download_dataset(write_dataset(bucket, tmp_path / "staged", x, targets, 10, val=40, task=task),
                          tmp_path / "local")
    steps = ds.train.examples // BATCH
    expected_y = targets[:-40].reshape(-1, 1).astype(np.float32)
    if task == "regression":  # as training takes them
        expected_y = (expected_y - np.mean(targets[:-40])) / np.std(targets[:-40])
    expected = np.array(sorted(map(tuple, np.concatenate([x[:-40].reshape(320, -1), expected_y], axis=1))))
    for mode in MODES:
        np.testing.assert_allclose(_rows(train_dataset(ds, BATCH, seed=3, mode=mode), steps), expected, rtol=1e-5,
                                   err_msg=mode)
        twice = np.array(sorted(map(tuple, np.concatenate([expected, expected]))))
        np.testing.assert_allclose(_rows(train_dataset(ds, BATCH, seed=3, mode=mode), 2 * steps), twice, rtol=1e-5,
                                   err_msg=mode)  # and the next epoch again
        val = [(xb.numpy(), yb.numpy()) for xb, yb in eval_dataset(ds, BATCH, static_shapes=False, mode=mode)]
        assert [len(xb) for xb, _ in val] == [16, 16, 8], mode
        np.testing.assert_array_equal(np.concatenate([xb for xb, _ in val]), x[-40:], err_msg=mode)


def test_a_split_in_memory_is_fed_without_the_autotuner_and_a_streamed_one_keeps_it(bucket: str, tmp_path: Path) -> None:
    """With tf.data's autotuner on, an iterator's destructor waits for the autotuner's thread to finish
    an optimization pass: a fit that ended during one stalled its job 2-3 s (agent/data.py,
    MEMORY_PARALLEL_GATHERS). A split in memory has nothing for it to tune (gathers from tensors)."""
    from agent.data import download_dataset, eval_dataset, train_dataset

    x, y = digits()
    ds = download_dataset(write_dataset(bucket, tmp_path / "staged", x[:200], y[:200], 10, val=40),
                          tmp_path / "local")
    for mode, tuned in (("memory", False), ("stream", True), ("stream_cached", True)):
        for dataset in (train_dataset(ds, BATCH, seed=3, mode=mode), eval_dataset(ds, BATCH, static_shapes=False, mode=mode)):
            assert (dataset.options().autotune.enabled is not False) == tuned, mode


def test_a_split_in_memory_is_fed_as_one_permutation_after_another_cut_into_batches() -> None:
    """Batches may straddle two passes (10 examples in batches of 4), so every example is trained on as
    often as any other; each pass is its own permutation, and a seed always gives the same stream."""
    from agent.data import memory_batch_indices

    def stream(seed: int) -> np.ndarray:
        return np.concatenate([b.numpy() for b in memory_batch_indices(10, 4, seed).take(15)])

    indices = stream(3)
    assert indices.shape == (60,)
    passes = indices.reshape(6, 10)
    for one in passes:
        assert sorted(one) == list(range(10))
    assert len({tuple(p) for p in passes}) > 1  # reshuffled every pass
    np.testing.assert_array_equal(indices, stream(3))
    assert not np.array_equal(indices, stream(4))
