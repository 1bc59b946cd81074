"""Shared fixtures: real PostgreSQL and the GCS emulator behind the real storage client."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from trainjobs.embedded import GcsEmulator, start_gcs_emulator, use_emulator


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GcsEmulator]:
    """One in-memory emulator per test process; STORAGE_EMULATOR_HOST points at it."""
    emu = start_gcs_emulator(None, bucket="trainjobs-test")
    use_emulator(emu, "trainjobs-test")
    yield emu
    emu.stop()


@pytest.fixture
def bucket(gcs_emulator: GcsEmulator) -> str:
    """A fresh, empty bucket per test, set as TRAINJOBS_BUCKET."""
    from trainjobs import storage

    name = f"t-{uuid.uuid4().hex[:12]}"
    storage.ensure_bucket(name)
    os.environ["TRAINJOBS_BUCKET"] = name
    return name
