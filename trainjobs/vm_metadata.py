"""The keys of the VM metadata trainjobs sets on the machines it creates, and where a VM reads them:
the provisioners write them (worker/gcp/), the agent's watchdog reads them on the VM (agent/watchdog.py).
"""

from __future__ import annotations

METADATA_URL = "http://metadata.google.internal/computeMetadata/v1"
JOB_DIR_KEY = "trainjobs-job-dir"  # the job's directory, for a person reading the VM: the worker never reads it
# back (the job's code could change what the VM reports)
NODE_NAME_KEY, TPU_API_KEY = "trainjobs-node", "trainjobs-tpu-api"  # a Cloud TPU node's own name and API
INSTANCE_KEY, COMPUTE_API_KEY = "trainjobs-instance", "trainjobs-compute-api"  # the same on Compute Engine VMs
HOST_KEY = "agent-worker-number"  # which host of a multi-VM machine this is (0 is the chief)
# The machine's name, set at create (a VM that finds it waits for a sealed token, bound to that name), and
# the envelopes, written by the worker once it has read the hosts' keys (trainjobs/sealed_token.py).
MACHINE_KEY, SEALED_KEY = "trainjobs-token-for", "trainjobs-storage-token-sealed"
# Guest attributes are off on Compute Engine unless the instance's metadata turns them on at create.
GUEST_ATTRIBUTES_KEY = "enable-guest-attributes"
STARTUP_SCRIPT_KEY = "startup-script"
