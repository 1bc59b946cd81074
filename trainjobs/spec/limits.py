"""spec.limits: how long a job may run, how often it is retried, what it may cost."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from pydantic import Field, field_validator

from trainjobs.spec.strict import Int, Number, StrictModel, fail

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d)")
MAX_RUNTIME = timedelta(days=14)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class LimitsSpec(StrictModel):
    max_runtime: timedelta = Field(default=timedelta(hours=24), description="'90m', '2h', seconds, or ISO 8601")
    max_retries: Int = Field(default=2, ge=0, le=20)
    max_cost_usd: Number | None = Field(default=None, gt=0, le=1_000_000)

    @field_validator("max_runtime", mode="before")
    @classmethod
    def _parse_duration(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise fail("max_runtime", "max_runtime is a duration ('90m', '2h', seconds), not true/false")
        if isinstance(v, str) and (m := _DURATION.fullmatch(v.strip())):
            seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
            # Checked before timedelta() sees it: a huge number of hours overflows it (an OverflowError, a 500).
            if not 0 < seconds <= MAX_RUNTIME.total_seconds():
                raise fail("max_runtime", "max_runtime must be between 1 second and 14 days")
            return timedelta(seconds=seconds)
        return v

    @field_validator("max_runtime")
    @classmethod
    def _sane_runtime(cls, v: timedelta) -> timedelta:
        if v <= timedelta(0) or v > MAX_RUNTIME:
            raise fail("max_runtime", "max_runtime must be between 1 second and 14 days")
        return v
