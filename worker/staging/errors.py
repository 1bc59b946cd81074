"""The one error staging raises for bad data: its message goes to the user as the job's failure reason."""

from __future__ import annotations


class DatasetError(Exception):
    """The dataset cannot be staged; the message says what is wrong with the data and where."""


def short(value: object, limit: int = 40) -> str:
    """A value quoted for an error message, cut short: messages name bad data, they don't echo files."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
