"""What every section of the spec shares: strict fields, values PostgreSQL can store, a stored spec read
leniently, and errors that name their field.

A spec is parsed in two ways. At submit (the API, the CLI's dry run) every rule applies. A stored spec
(the worker's driver, the agent's spec.json) was accepted by some release already: `parse_stored` reads
it with the context `STORED`, without the submit-only rules, so a rule tightened in a later release
refuses new jobs but never fails a job already queued or running (issue 19). A new rule that refuses
what an older release accepted is written as submit-only (`submitting(info)`).
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Strict, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

# Strict numbers: JSON true is not the integer 1, and "3" is not the number 3.
Int = Annotated[int, Strict()]
Number = Annotated[float, Strict()]
# model.params is stored with the job and returned by every GET: keep it shallow.
MAX_NESTING = 32
# Validation context of a spec read back from storage.
STORED: dict[str, bool] = {"stored": True}
# Validation context of a part of a spec whose whole input was already checked by _storable (a sweep's
# trial, built from the sweep's body: trainjobs/spec/trial_check.py): walking it again per value is the
# cost of the whole input, not of the value.
STORABLE_CHECKED: dict[str, bool] = {"storable_checked": True}


def submitting(info: ValidationInfo) -> bool:
    """True when the spec is being submitted, False when it is read back from storage (parse_stored)."""
    return not (isinstance(info.context, dict) and info.context.get("stored"))


def fail(field: str, msg: str) -> PydanticCustomError:
    """A validation error that remembers which field is wrong, even when raised by a model validator
    (trainjobs/spec/errors.py puts the field back on the path)."""
    return PydanticCustomError("invalid_spec", msg, {"field": field})


class StrictModel(BaseModel):
    """A section of the spec: unknown fields refused, values frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _drop_retired_fields(cls, data: Any, info: ValidationInfo) -> Any:
        """A stored spec may carry a field a later release removed: it was valid when stored, so it is
        dropped, not refused. At submit an unknown field stays an error (with a "did you mean")."""
        if not submitting(info) and isinstance(data, dict):
            return {k: v for k, v in data.items() if k in cls.model_fields}
        return data

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any, info: ValidationInfo) -> Any:
        """Refuse what PostgreSQL's JSONB cannot hold, anywhere in the spec (model.params included):
        it rejects NUL, a lone surrogate cannot be encoded as UTF-8, and JSON has no NaN or Infinity.
        The outermost model sees the whole input first, so the path it names is the full one."""
        if isinstance(info.context, dict) and info.context.get("storable_checked"):
            return data
        if problem := _unstorable(data):
            raise fail(*problem)
        return data


_UNSTORABLE_CHAR = re.compile(r"[\x00\ud800-\udfff]")


def _unstorable(data: Any) -> tuple[str, str] | None:
    """(dotted path, reason) of the first value in `data` that cannot be stored, else None.
    Iterative, so a deeply nested params dict cannot exhaust the interpreter's stack."""
    stack: list[tuple[tuple[str, ...], Any]] = [((), data)]
    while stack:
        path, value = stack.pop()
        where = ".".join(path)
        if len(path) > MAX_NESTING:
            return where, f"nested deeper than {MAX_NESTING} levels"
        if isinstance(value, str) and (m := _UNSTORABLE_CHAR.search(value)):
            return where, ("contains a NUL character (\\u0000)" if m.group() == "\x00"
                           else "contains an unpaired surrogate, which is not valid Unicode")
        if isinstance(value, float) and not math.isfinite(value):
            return where, "NaN and Infinity are not JSON numbers"
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str) and _UNSTORABLE_CHAR.search(key):
                    return where, "a key contains a NUL character or an unpaired surrogate"
                stack.append(((*path, str(key)), item))
        elif isinstance(value, list | tuple):
            stack.extend(((*path, str(i)), item) for i, item in enumerate(value))
    return None
