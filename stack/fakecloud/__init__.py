"""A fake Google Cloud for tests and for trying the gcp provisioner on a laptop (`trainjobs fake-cloud`).

It speaks the REST surface the real clients use, so the real google-cloud-tpu and google-cloud-compute clients talk to it
unchanged, and it "boots" a machine by running the startup script the provisioner sent, here, in a
sandbox directory, with CPU devices standing in for TPU chips or GPUs.
"""

from stack.fakecloud.compute_api import FakeComputeApi
from stack.fakecloud.tpu_api import FakeTpuApi

__all__ = ["FakeComputeApi", "FakeTpuApi"]
