"""A sweep trial's epochs, read from its job's metrics.json (issue 22), at a bounded cost (issue 36, finding 2).

The job's code can write metrics.json as well as the agent, so the sweep engine reads it as any object a
job writes: raw (one stored gzip-encoded is its stored bytes, not JSON, never inflated), only when its
generation changed since the trial's curve last took in all of it, and within a cap: what a job of its
epochs may write (an entry an epoch), never over storage.METRICS_MAX_BYTES. A running job's document over
LARGE_DOCUMENT_BYTES is read again at most every LARGE_REREAD_S, however often its job rewrites it. Of
what it holds, only epochs 1 to the job's last count, and a step takes at most REPORTS_PER_STEP of them
to Optuna (one write to its storage each); the rest come at the next steps. Before this, a trial's
60,000-epoch history held one step's transaction for 12 minutes, and every other project's sweep with it.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from trainjobs import storage

# One epoch's entry, at most: a program reports up to 64 metrics of up to 200 characters each
# (agent/program.py, MAX_REPORTED_NAMES and MAX_REPORTED_CHARS); the agent's own are ~300 bytes.
ENTRY_MAX_BYTES = 16 << 10
DOCUMENT_BASE_BYTES = 64 << 10  # the document's own fields, besides its history
# A program trains as many epochs as its code says: one whose spec sets none is followed this far.
PROGRAM_EPOCHS = 1000
REPORTS_PER_STEP = 20  # Optuna writes one step of one trial makes
# Parsed, a JSON document takes up to ~25 times its bytes (4 MiB of `{},` is 100 MB of dicts): steps run in
# parallel, and documents over this are parsed one at a time, so the worker holds one such parse at most.
LARGE_DOCUMENT_BYTES = 1 << 20
# A job can rewrite its document every second; one this large is parsed again at most this often while
# the job runs (the agent writes a line an epoch: only a job of thousands of epochs, or its own code, gets here).
LARGE_REREAD_S = 30.0
_one_large_parse = threading.Lock()
_large_reads: OrderedDict[str, float] = OrderedDict()  # uri -> when a document over LARGE_DOCUMENT_BYTES was read
_large_reads_lock = threading.Lock()
_LARGE_READS_KEPT = 4096


@dataclass
class EpochsRead:
    """What one read of a trial's metrics.json gave."""

    new: list[tuple[int, float]] = field(default_factory=list)  # epochs not on its curve yet, first first
    generation: int | None = None  # the trial's curve takes in all of this generation: read it again when changed
    refused: str | None = None  # why the document was not taken in, for the job's owner
    more: bool = False  # it holds more new epochs than `new`: the next step reads it again


def last_epoch(job_spec: dict[str, Any], sets_epochs: bool) -> int:
    """The last epoch a trial's job trains: its training.epochs; a program's, only when the trial's spec as
    written sets them (`sets_epochs`: the stored spec holds the default either way)."""
    if job_spec.get("program") is not None and not sets_epochs:
        return PROGRAM_EPOCHS
    return int((job_spec.get("training") or {}).get("epochs") or PROGRAM_EPOCHS)


def read_limit(epochs: int) -> int:
    """The most bytes of metrics.json a job of this many epochs needs to say them all."""
    return min(storage.METRICS_MAX_BYTES, DOCUMENT_BASE_BYTES + epochs * ENTRY_MAX_BYTES)


def read_new_epochs(uri: str, metric: str, epochs: int, on_curve: set[int], generation: int | None, *,
                    job_ended: bool = False) -> EpochsRead:
    """The objective's value at each epoch 1..epochs the document holds and the curve does not, at most
    REPORTS_PER_STEP of them; nothing when the document's generation is `generation` (a 304, no bytes),
    or when it was large and read less than LARGE_REREAD_S ago while its job still runs."""
    if not job_ended and not _large_read_due(uri):
        return EpochsRead(generation=generation)
    try:
        fresh = storage.read_bounded_if_changed(uri, read_limit(epochs), generation)
    except storage.ObjectTooLarge as exc:
        _remember_read(uri, exc.size)
        return EpochsRead(generation=exc.generation,
                          refused=f"{exc}: a job of {epochs} epochs writes less; its epochs are not followed")
    if isinstance(fresh, storage.Unchanged):
        return EpochsRead(generation=generation)
    data, fresh_generation = fresh
    if data is None:
        return EpochsRead()
    _remember_read(uri, len(data))
    try:
        if len(data) > LARGE_DOCUMENT_BYTES:
            with _one_large_parse:
                found = _epochs_in(data, metric, epochs, on_curve)
        else:
            found = _epochs_in(data, metric, epochs, on_curve)
    except (ValueError, RecursionError):  # not JSON (or UTF-8), or nested too deep to parse
        return EpochsRead(generation=fresh_generation, refused="metrics.json is not JSON; its epochs are not followed")
    new = sorted(found.items())
    if len(new) > REPORTS_PER_STEP:  # the rest at the next step, which reads this generation again
        return EpochsRead(new=new[:REPORTS_PER_STEP], generation=generation, more=True)
    return EpochsRead(new=new, generation=fresh_generation)


def _large_read_due(uri: str) -> bool:
    with _large_reads_lock:
        read_at = _large_reads.get(uri)
    return read_at is None or time.monotonic() - read_at >= LARGE_REREAD_S


def _remember_read(uri: str, size: int) -> None:
    with _large_reads_lock:
        _large_reads.pop(uri, None)
        if size > LARGE_DOCUMENT_BYTES:
            _large_reads[uri] = time.monotonic()
            while len(_large_reads) > _LARGE_READS_KEPT:
                _large_reads.popitem(last=False)


def _epochs_in(data: bytes, metric: str, epochs: int, on_curve: set[int]) -> dict[int, float]:
    doc = json.loads(data)
    history = doc.get("history") if isinstance(doc, dict) else None
    found: dict[int, float] = {}
    for entry in history if isinstance(history, list) else []:
        if not isinstance(entry, dict):
            continue
        epoch, value = entry.get("epoch"), entry.get(metric)
        if (isinstance(epoch, int) and not isinstance(epoch, bool) and 1 <= epoch <= epochs
                and epoch not in on_curve and epoch not in found and is_number(value)):
            found[epoch] = float(value)  # type: ignore[arg-type]  # is_number said so
    return found


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
