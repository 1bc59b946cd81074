"""The client: what a plain `pip install trainjobs` gives a user.

    api.py          the Python client of the REST API (`from trainjobs.client import Client`)
    cli.py          the CLI's client verbs: submit, status, list, logs, cancel, artifacts, sweep ...
    terminal.py     how the CLI draws jobs, sweeps, tables and live progress
    log_format.py   the log line formats of every verb (text or JSON lines)
    local_paths.py  `submit` with a local file or folder: uploads it first

Nothing here runs on an accelerator machine: the agent's wheel leaves this package out.
The Python client's names load on first use, so the CLI starts without importing httpx.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainjobs.client.api import (ApiError, ApiUnreachable, ArtifactIntegrityError, Client, StreamEvent,
                                      StreamUnsupported)

__all__ = ["ApiError", "ApiUnreachable", "ArtifactIntegrityError", "Client", "StreamEvent", "StreamUnsupported"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(import_module("trainjobs.client.api"), name)
    raise AttributeError(f"module 'trainjobs.client' has no attribute {name!r}")
