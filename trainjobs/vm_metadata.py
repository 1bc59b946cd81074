"""What trainjobs writes on the machines it creates, for whoever reads it back: the keys of the VM metadata
and the labels. The provisioners write them (worker/gcp/, worker/local/, worker/memory_cloud.py), the
startup script and the agent's watchdog read the metadata on the VM (worker/gcp/bootstrap.py,
agent/watchdog.py, agent/first_token.py), the worker's reaper and adoption search by the labels, and the
fake cloud serves both as the real one does (stack/fakecloud/). No other module spells one.
"""

from __future__ import annotations

# --- VM metadata: what a VM reads from its metadata server (instance/attributes/<key>) ---
METADATA_URL = "http://metadata.google.internal/computeMetadata/v1"
JOB_DIR_KEY = "trainjobs-job-dir"  # the job's directory, for a person reading the VM: the worker never reads it
# back (the job's code could change what the VM reports)
NODE_NAME_KEY, TPU_API_KEY = "trainjobs-node", "trainjobs-tpu-api"  # a Cloud TPU node's own name and API
INSTANCE_KEY, COMPUTE_API_KEY = "trainjobs-instance", "trainjobs-compute-api"  # the same on Compute Engine VMs
# Which host of a multi-VM machine this is (0 is the chief). Cloud TPU sets it on each host of a slice
# itself; the Compute Engine provisioner sets it on each of its VMs under the same name.
HOST_KEY = "agent-worker-number"
# The machine's name, set at create (a VM that finds it waits for a sealed token, bound to that name), and
# the envelopes, written by the worker once it has read the hosts' keys (trainjobs/sealed_token.py).
MACHINE_KEY, SEALED_KEY = "trainjobs-token-for", "trainjobs-storage-token-sealed"
# Guest attributes are off on Compute Engine unless the instance's metadata turns them on at create.
GUEST_ATTRIBUTES_KEY = "enable-guest-attributes"
# The guest attribute each host publishes its public key under (namespace, key), for the sealed token.
PUBLIC_KEY_NAMESPACE, PUBLIC_KEY_ATTRIBUTE = "trainjobs", "public-key"
PUBLIC_KEY_PATH = f"{PUBLIC_KEY_NAMESPACE}/{PUBLIC_KEY_ATTRIBUTE}"  # as a guest-attributes query path names it
STARTUP_SCRIPT_KEY = "startup-script"  # run as root at every boot (both clouds read this key)
INSTALL_GPU_DRIVER_KEY = "install-nvidia-driver"  # Deep Learning VM images install the driver at first boot

# --- labels: every machine carries them, so inventory can be searched like a cloud's (reaper, adoption) ---
LABEL_PREFIX = "trainjobs-"  # reserved: a job's own labels may not use it
LABEL_MANAGED = f"{LABEL_PREFIX}managed"  # "true" on every machine trainjobs made
LABEL_JOB = f"{LABEL_PREFIX}job"  # the job's id
LABEL_ATTEMPT = f"{LABEL_PREFIX}attempt"  # the attempt the machine was made for
# Compute Engine: one machine of several VMs is found by its name on each of them, and how many there are.
LABEL_MACHINE = f"{LABEL_PREFIX}machine"
LABEL_HOSTS = f"{LABEL_PREFIX}hosts"
