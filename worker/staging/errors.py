"""The one error staging raises for bad data: its message goes to the user as the job's failure reason.

A message names the file, the line, the column, the record or the example; it never quotes what the
file holds (a header, a value, a label, an array or feature name, a library's echo of either): a
source may be a file its job's project should not read, and the message is the way out."""

from __future__ import annotations

# Staging implements the worker's Stager port and raises the port's own error: the driver catches
# exactly what staging throws, with no translation between two classes of the same name.
from worker.ports import DatasetError

__all__ = ["DatasetError", "short"]


def short(value: object, limit: int = 40) -> str:
    """A value the user wrote in the spec, quoted for an error message and cut short. Never for bytes
    read from the data."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
