"""What a program job's code is handed (issue 20): the environment variables the agent sets for the
user's program, and the names scripts written for Vertex AI and SageMaker read, which mean the same
here. The agent (agent/program.py) sets them, the runtime (trainjobs/runtime) reads them, and the spec
refuses a `program.env` that would set one of them itself (trainjobs/spec/program.py).

Directories are local paths on the machine; the agent syncs them to the job's directory in storage:
MODEL_DIR becomes the job's artifacts (the chief's, at the end, with sha256s), CHECKPOINT_DIR is
uploaded as it changes and restored before the next attempt starts, TENSORBOARD_DIR is uploaded at the
end of each sync.
"""

from __future__ import annotations

RUNTIME_FILE = "TRAINJOBS_RUNTIME"  # a JSON file: the plan the agent resolved (trainjobs/runtime reads it)
MODEL_DIR = "TRAINJOBS_MODEL_DIR"
CHECKPOINT_DIR = "TRAINJOBS_CHECKPOINT_DIR"
TENSORBOARD_DIR = "TRAINJOBS_TENSORBOARD_DIR"
DATA_DIR = "TRAINJOBS_DATA_DIR"  # the staged dataset (manifest.json + shards), when the job names one
REPORTS_FILE = "TRAINJOBS_REPORTS"  # JSON lines the runtime appends and the agent follows
STOP_FILE = "TRAINJOBS_STOP_FILE"  # exists once the agent asks the program to checkpoint and stop

# Other platforms' names for the same places, so a script written for them runs unchanged.
ALIASES: dict[str, tuple[str, ...]] = {
    MODEL_DIR: ("AIP_MODEL_DIR", "SM_MODEL_DIR"),
    CHECKPOINT_DIR: ("AIP_CHECKPOINT_DIR",),
    TENSORBOARD_DIR: ("AIP_TENSORBOARD_LOG_DIR",),
    DATA_DIR: ("SM_CHANNEL_TRAINING",),
}
SM_HPS = "SM_HPS"  # SageMaker's hyperparameters as one JSON object: the program's `--name value` args

# Names a program's own `env` may not set: the ones above, and what the runtime and TensorFlow's
# multi-worker setup read.
RESERVED_PREFIXES = ("TRAINJOBS_", "AIP_", "SM_", "CLOUD_ML_")
RESERVED_NAMES = frozenset({"TF_CONFIG", "STORAGE_EMULATOR_HOST", "PYTHONPATH", "PYTHONHOME"})


def reserved(name: str) -> bool:
    return name in RESERVED_NAMES or name.startswith(RESERVED_PREFIXES)
