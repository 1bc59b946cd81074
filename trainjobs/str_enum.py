"""`StrEnum` for code that also runs on Python 3.10: `enum.StrEnum` is 3.11+, and the agent's wheel
is installed into the Python of the Cloud TPU VM and Deep Learning VM images, which is 3.10
(tests/unit/test_agent_python.py keeps 3.11-only code out of the wheel).

It behaves as `enum.StrEnum` where we rely on it: members are `str`s equal to their values, and
`str()`, f-strings, `format()`, `json.dumps` and pydantic all give the value."""

from __future__ import annotations

import enum


class StrEnum(str, enum.Enum):
    # Enum's own __str__ (and so f-strings) gives "JobStatus.QUEUED"; enum.StrEnum's gives the value.
    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, format_spec: str) -> str:
        return str.__format__(str(self.value), format_spec)
