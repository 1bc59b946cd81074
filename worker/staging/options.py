"""The conversion options with every default filled in: what the readers use, what the content hash
covers and what the manifest records, so a default that changes can never reuse an old dataset."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from trainjobs.spec import DatasetOptions

SHUFFLE_SEED = 20240601  # fixed: the same data and options always give the same split


@dataclass(frozen=True)
class ConversionOptions:
    validation_split: float
    shard_examples: int
    label_column: str = "label"
    x_key: str = "x"
    y_key: str = "y"
    image_size: tuple[int, int] = (32, 32)  # (height, width)

    @classmethod
    def from_spec(cls, o: DatasetOptions) -> ConversionOptions:
        return cls(
            validation_split=o.validation_split,
            shard_examples=o.shard_examples,
            label_column=o.label_column or cls.label_column,
            x_key=o.x_key or cls.x_key,
            y_key=o.y_key or cls.y_key,
            image_size=(o.image_size[0], o.image_size[1]) if o.image_size else cls.image_size,
        )

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["image_size"] = list(self.image_size)
        return d
