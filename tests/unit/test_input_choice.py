"""How the training input is fed (agent/input_choice.py), from the data's size and training.cache_dataset."""

from __future__ import annotations

import pytest

from agent.input_choice import IN_MEMORY_MAX_BYTES, choose_input, parsed_bytes

GIB = 2**30


@pytest.mark.parametrize(("cache", "size", "plain", "memory", "mode"), [
    ("auto", parsed_bytes(100_000, (64,), 1), True, 16 * GIB, "memory"),  # the bench's MLP: 24.8 MB
    ("auto", parsed_bytes(100_000, (224, 224, 3), 1), True, 64 * GIB, "stream"),  # 56 GB of images
    ("auto", 300 * 2**20, True, 2 * GIB, "stream"),  # under the cap, over an eighth of this machine
    ("auto", 1024, False, 16 * GIB, "stream"),  # a CSV's text columns stay on the streamed path
    (True, 1024, True, 16 * GIB, "memory"),
    (True, IN_MEMORY_MAX_BYTES + 1, True, 64 * GIB, "stream_cached"),
    (True, 1024, False, 16 * GIB, "stream_cached"),
    (False, 1024, True, 16 * GIB, "stream"),
])
def test_input_is_held_in_memory_when_it_fits_comfortably(cache: bool | str, size: int, plain: bool, memory: int,
                                                          mode: str) -> None:
    choice = choose_input(cache, 1000, size, plain=plain, memory=memory)
    assert choice.mode == mode
    assert choice.note.startswith("input: ")


def test_parsed_size_counts_float32_features_and_labels() -> None:
    assert parsed_bytes(10, (8, 8, 1), 1) == 10 * 65 * 4
