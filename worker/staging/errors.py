"""The one error staging raises for bad data: its message goes to the user as the job's failure reason."""

from __future__ import annotations

# Staging implements the worker's Stager port and raises the port's own error: the driver catches
# exactly what staging throws, with no translation between two classes of the same name.
from worker.provisioner import DatasetError

__all__ = ["DatasetError", "short"]


def short(value: object, limit: int = 40) -> str:
    """A value quoted for an error message, cut short: messages name bad data, they don't echo files."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
