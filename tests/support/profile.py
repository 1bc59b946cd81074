"""Reading a profiler trace (an XSpace, `*.xplane.pb`) as TensorBoard's profile plugin would."""

from __future__ import annotations

import importlib
from typing import Any

# Where tensorflow wheels have put the proto's module over the releases the agent runs on (2.17 to 2.21).
_XPLANE_MODULES = ("tensorflow.tsl.profiler.protobuf.xplane_pb2", "tsl.profiler.protobuf.xplane_pb2",
                   "tensorflow.core.profiler.protobuf.xplane_pb2")


def xspace_planes(trace: bytes) -> list[str]:
    """The names of the trace's planes (`/host:CPU`, `/device:GPU:0`, ...)."""
    return [plane.name for plane in _xplane_pb2().XSpace.FromString(trace).planes]


def _xplane_pb2() -> Any:
    for name in _XPLANE_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError(f"no XSpace proto module in this tensorflow: tried {', '.join(_XPLANE_MODULES)}")
