"""One value of a sweep's parameter checked at the cost of the field it sets, not of the whole job (issue 36, 1).

A whole-spec validation per probed value re-checked everything the value does not touch: a 29 KB sweep of
a program job with 64 requirements made 2,048 of them, each parsing every requirement again, and held the
API for 30-40 s. Here the job is validated once (`TrialCheck.spec`), and each value is put into that
validated spec at its path: the field it lands in is validated by its own type and validators (Pydantic's
validate_assignment), then each section above it, up to the job, runs its model validators again (the
rules that read several fields: a batch that must divide over the replicas). The requirements, the
dataset and every other field the value does not touch are not looked at again.

Where the path enters a union of sections (accelerator: tpu | gpu | cpu), that section is validated again
from the user's own dict with the value set, as a whole-spec validation would: a value may change which
member it is (accelerator.type), or what a member derives from its other fields (a TPU's default
runtime_version follows its tpu_type).
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

from pydantic import BaseModel

from trainjobs.spec.job import JobSpec
from trainjobs.spec.strict import STORABLE_CHECKED


class TrialCheck:
    """Trials of one job, each with one value set at its dotted path."""

    def __init__(self, raw: dict[str, Any], spec: JobSpec):
        # raw: the job as the user wrote it; spec: raw, validated as submitted.
        self.raw, self.spec = raw, spec
        self._field_bytes: dict[tuple[str, ...], int] = {}  # parameters into one dict share its size

    def with_value(self, path: str, value: Any) -> JobSpec:
        """The job with `value` at `path`, checked by the rules a whole-spec validation applies to what the
        value touches. A ValidationError when they refuse it (ValueError: the path runs through a value
        that is not a section)."""
        out = _assigned(self.spec, self.raw, path.split("."), value)
        assert isinstance(out, JobSpec)
        return out

    def field_bytes(self, path: str) -> int:
        """The size (JSON) of the field a value at `path` lands in, when that is a dict or a union of
        sections validated again whole (model.params, program.env, accelerator); 0 for a field of a section."""
        model: BaseModel = self.spec
        parts = path.split(".")
        for depth, name in enumerate(parts[:-1]):
            current = getattr(model, name) if name in type(model).model_fields else None
            if not (isinstance(current, BaseModel) and _one_model(type(model), name)):
                field = tuple(parts[:depth + 1])
                if field not in self._field_bytes:
                    dumped = current.model_dump(mode="json") if isinstance(current, BaseModel) else current
                    self._field_bytes[field] = len(json.dumps(dumped, default=str))
                return self._field_bytes[field]
            model = current
        return 0


def _assigned(model: BaseModel, raw: Any, parts: list[str], value: Any) -> BaseModel:
    """A copy of `model` (validated from `raw`) with `value` at the path `parts`, each section on the way
    validated again by validate_assignment: its field's own checks, then the section's model validators."""
    cls = type(model)
    name, rest = parts[0], parts[1:]
    raw_field = raw.get(name) if isinstance(raw, dict) else None
    current = getattr(model, name) if name in cls.model_fields else None
    if rest and isinstance(current, BaseModel) and _one_model(cls, name):
        new: Any = _assigned(current, raw_field, rest, value)
    elif rest:  # into a dict field (model.params, program.env), a union of sections, or a section not given
        new = _with(raw_field, rest, value)
    else:
        new = value
    out = model.model_copy()
    # The sweep's body was checked for values PostgreSQL cannot store as a whole (its _storable): not again.
    cls.__pydantic_validator__.validate_assignment(out, name, new, context=STORABLE_CHECKED)
    return out


def set_at(spec: dict[str, Any], parts: list[str], value: Any) -> dict[str, Any]:
    """`spec` with `value` at the path `parts`, the sections on the way made when missing; changed in place."""
    node = spec
    *parents, last = parts
    for part in parents:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ValueError(f"{'.'.join(parts)}: {part} is not a section of the job spec")
        node = child
    node[last] = value
    return spec


def _with(node: Any, parts: list[str], value: Any) -> dict[str, Any]:
    """A copy of the dict `node` (None: an empty one) with `value` at `parts`: only the dicts on the path
    are copied, so a value set in a large program.env costs one shallow copy of it."""
    if node is None:
        node = {}
    if not isinstance(node, dict):
        raise ValueError(f"{parts[0]}: not a section of the job spec")
    if len(parts) == 1:
        return {**node, parts[0]: value}
    return {**node, parts[0]: _with(node.get(parts[0]), parts[1:], value)}


def _one_model(cls: type[BaseModel], name: str) -> bool:
    """Whether the field holds one kind of section (or none): a value inside it is set on the validated
    section. A union of sections is validated again from the user's dict (the module's docstring)."""
    info = cls.model_fields.get(name)
    if info is None:
        return False
    annotation = info.annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
    else:
        members = [annotation]
    return len(members) == 1 and isinstance(members[0], type) and issubclass(members[0], BaseModel)
