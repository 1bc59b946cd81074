"""Reading a profiler trace (an XSpace, `*.xplane.pb`) as TensorBoard's profile plugin would."""

from __future__ import annotations


def xspace_planes(trace: bytes) -> list[str]:
    """The names of the trace's planes (`/host:CPU`, `/device:TPU:0`, ...). The proto's module sits in
    the tensorflow wheel under tsl/ (2.17 to 2.21); the error says so if a release moves it."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    return [plane.name for plane in xplane_pb2.XSpace.FromString(trace).planes]
