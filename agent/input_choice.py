"""How the training input is fed (issue 24), from the data's size: parsed once and held in memory, or
streamed from the shards every epoch. Pure: no TensorFlow, so the rule is tested without it.

Streaming parses every example again each epoch on the host's CPU, which on a small machine is the CPU
the training steps need: a split whose parsed tensors fit comfortably in memory is parsed once, and each
epoch gathers its shuffled batches from it (every example once per epoch, a full shuffle rather than a
16,384-record buffer). `training.cache_dataset: true` asks for a cache whatever the size; `false` never
caches; `auto` (the default) holds in memory what fits under IN_MEMORY_MAX_BYTES and an eighth of
the machine's memory.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Literal

# Above this the tensors captured by the pipeline's graph grow unwieldy (tf.distribute serializes the
# dataset's graph to rebatch it over replicas, and a graph holds at most 2 GB).
IN_MEMORY_MAX_BYTES = 512 * 2**20
FLOAT_BYTES = 4


@dataclass(frozen=True)
class InputChoice:
    mode: Literal["memory", "stream", "stream_cached"]
    note: str


def parsed_bytes(examples: int, feature_shape: tuple[int, ...], label_width: int) -> int:
    """A split's size once parsed: float32 features and a label (or targets) per example."""
    return examples * (math.prod(feature_shape) + label_width) * FLOAT_BYTES


def machine_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def choose_input(cache_dataset: bool | str, examples: int, size: int, *, plain: bool, memory: int) -> InputChoice:
    """`size`: the parsed bytes of the splits held (training and validation). `plain`: the examples are
    numbers only (a CSV's text and category columns, and a teacher's outputs, stay on the streamed path)."""
    mb = f"{size / 2**20:.1f} MB"
    limit = min(IN_MEMORY_MAX_BYTES, memory // 8)
    fits = plain and size <= limit
    if cache_dataset is False:
        return InputChoice("stream", "input: streamed from the shards every epoch (training.cache_dataset false)")
    if fits:
        why = "training.cache_dataset true" if cache_dataset is True else f"under {limit / 2**20:.0f} MB"
        return InputChoice("memory", f"input: {examples} training examples parsed once and held in memory "
                                     f"({mb} with validation, {why}); each epoch gathers shuffled batches from them")
    if cache_dataset is True:
        return InputChoice("stream_cached", f"input: serialized records cached after the first epoch ({mb} parsed"
                                            f"{'' if plain else '; text, category or teacher columns'})")
    why = f"{mb} parsed, over {limit / 2**20:.0f} MB" if plain else "text, category or teacher columns"
    return InputChoice("stream", f"input: streamed from the shards every epoch, parsed in parallel ({why})")
