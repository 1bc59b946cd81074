"""How a refused spec is told: Pydantic's errors become [{field, reason}], the field a dotted path the user
wrote (accelerator.tpu_type, model.params.hidden_units), with a "did you mean" for a misspelt field.
The API answers them in a 422 (service/errors.py); the CLI's dry run prints them."""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel

from trainjobs.model_params import did_you_mean
from trainjobs.spec.job import JobSpec


def describe_errors(errors: list[dict[str, Any]], strip: tuple[str, ...] = ()) -> list[dict[str, str]]:
    """Pydantic errors -> [{field: 'accelerator.tpu_type', reason: ...}] for humans and the API."""
    out = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if str(p) not in strip]
        # A discriminated union adds its tag to the path (accelerator.tpu.tpu_type); users never wrote it.
        loc = [p for i, p in enumerate(loc) if not (i and loc[i - 1] == "accelerator" and p in ("tpu", "gpu", "cpu"))
               and not (i > 1 and loc[i - 2] == "parameters" and p in ("float", "int", "categorical"))]  # a sweep's
        # A model validator's error (strict.fail) names its field in its context: put it back on the path.
        field = (err.get("ctx") or {}).get("field")
        if field and (not loc or loc[-1] != field):
            loc.append(field)
        reason = err.get("msg", "invalid")
        if err.get("type") == "extra_forbidden" and (hint := closest_field([str(p) for p in err.get("loc", ())])):
            reason += f"; did you mean {hint!r}?"
        out.append({"field": ".".join(loc) or "body", "reason": reason})
    return out


def closest_field(loc: list[str]) -> str | None:
    """The valid field name nearest to the unknown one at the end of `loc` (a JobSpec path as Pydantic
    gives it, tags of unions included), for a typo like `trainig` or `tpu_typ`; None if nothing is close."""

    def models(annotation: Any) -> list[type[BaseModel]]:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return [annotation]
        return [m for arg in typing.get_args(annotation) for m in models(arg)]

    candidates: list[type[BaseModel]] = [JobSpec]
    for part in loc[:-1]:
        inner = [m for c in candidates if part in c.model_fields for m in models(c.model_fields[part].annotation)]
        candidates = inner or candidates  # a union's tag (accelerator.tpu) names no field: stay
    names = sorted({n for c in candidates for n in c.model_fields})
    return did_you_mean(loc[-1], names) if loc else None
