"""What a program job's code is handed (issue 20): the environment variables the agent sets for the
user's program, and the names scripts written for Vertex AI and SageMaker read, which mean the same
here (issue 37). The agent (agent/program.py) sets them, the runtime (trainjobs/runtime) reads them, and
the spec refuses a `program.env` that would set one of them itself (trainjobs/spec/program.py).

Directories are local paths on the machine; the agent syncs them to the job's directory in storage:
MODEL_DIR becomes the job's artifacts (the chief's, at the end, with sha256s), CHECKPOINT_DIR is
uploaded as it changes and restored before the next attempt starts, TENSORBOARD_DIR is uploaded at the
end of each sync.

SageMaker's names are the ones its training toolkit sets for a script (aws/sagemaker-training-toolkit,
src/sagemaker_training/environment.py `Environment.to_env_vars` and mapping.py), in its shapes: a string
as it is, anything else JSON with sorted keys and no spaces; hosts "algo-1".."algo-N", one per worker,
the chief first; hyperparameters passed as `--name value` sorted by name. Vertex AI's are the ones its
custom training sets (googleapis/python-aiplatform, google/cloud/aiplatform/training_utils/
environment_variables.py): AIP_* directories and data URIs, CLOUD_ML_JOB_ID, and CLUSTER_SPEC beside
TF_CONFIG on several workers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

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
}
SM_HPS = "SM_HPS"  # SageMaker's hyperparameters as one JSON object
# The channel a staged dataset is, when the job gives no channel of that name (SageMaker's default).
TRAINING_CHANNEL = "training"
# Vertex AI's data URIs, from the channels of these names.
VERTEX_DATA_URIS = {"training": "AIP_TRAINING_DATA_URI", "validation": "AIP_VALIDATION_DATA_URI",
                    "test": "AIP_TEST_DATA_URI"}
# AIP_DATA_FORMAT by the training channel's files: Vertex AI's names for the formats it exports.
_DATA_FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".tfrecord": "tf-record", ".tfrecords": "tf-record"}

# Names a program's own `env` may not set: the ones above, and what the runtime and TensorFlow's
# multi-worker setup read.
LEGACY_KERAS_ENV = "TF_USE_LEGACY_KERAS"  # TensorFlow's switch, "1" for `program.keras: 2`: `tf.keras` is tf_keras
RESERVED_PREFIXES = ("TRAINJOBS_", "AIP_", "SM_", "CLOUD_ML_")
RESERVED_NAMES = frozenset({"TF_CONFIG", "CLUSTER_SPEC", "STORAGE_EMULATOR_HOST", "PYTHONPATH", "PYTHONHOME"})


def reserved(name: str) -> bool:
    return name in RESERVED_NAMES or name.startswith(RESERVED_PREFIXES)


def reserved_reason(name: str) -> str:
    """What a program's `env` is told when it names a reserved variable."""
    if name.startswith(("SM_HP_", "SM_HPS", "SM_USER_ARGS")):
        return f"{name} is set by trainjobs from program.hyperparameters (as SageMaker sets it): give them there"
    if name.startswith(("SM_CHANNEL", "AIP_TRAINING_DATA", "AIP_VALIDATION_DATA", "AIP_TEST_DATA")):
        return (f"{name} is set by trainjobs for each of program.channels (as SageMaker and Vertex AI set it): "
                "give them there")
    if name.startswith(("SM_", "AIP_", "CLOUD_ML_")) or name == "CLUSTER_SPEC":
        return (f"{name} is SageMaker's or Vertex AI's name, and trainjobs sets those a training script reads "
                "(SM_HOSTS, SM_MODEL_DIR, AIP_MODEL_DIR, CLUSTER_SPEC, ...): it cannot be overridden")
    return (f"{name} is set by trainjobs for every program (the runtime's directories, TF_CONFIG, storage); "
            "it cannot be overridden")


def hyperparameter_args(hyperparameters: Mapping[str, Any]) -> list[str]:
    """SageMaker's command line for its hyperparameters (mapping.to_cmd_args): sorted by name, `--name`
    (`-n` for a one-letter name), the value as Python writes it (True, 0.001)."""
    args: list[str] = []
    for name in sorted(hyperparameters):
        args += [f"--{name}" if len(name) > 1 else f"-{name}", str(hyperparameters[name])]
    return args


def hyperparameters_of_args(args: Sequence[str]) -> dict[str, str]:
    """The `--name value` pairs of a command line: what SM_HPS holds for a script given `args`."""
    hps: dict[str, str] = {}
    i = 0
    while i < len(args):
        if args[i].startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
            hps[args[i][2:]] = args[i + 1]
            i += 2
        else:
            i += 1
    return hps


def env_value(value: Any) -> str:
    """SageMaker's form of a value in the environment (mapping.to_env_vars)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def host_names(workers: int) -> list[str]:
    """SageMaker's names of a job's hosts: algo-1 (the chief) to algo-N."""
    return [f"algo-{i + 1}" for i in range(workers)]


@dataclass(frozen=True)
class ProgramSetting:
    """What the agent knows of a program's place, for the names other platforms give it."""

    job_id: str
    workers: int
    task_index: int
    instance_type: str  # the accelerator, as the spec names it ("cpu", "gpu:nvidia-l4", "tpu:v5e-8")
    num_cpus: int
    num_gpus: int
    entry_point: str  # relative to the program's folder
    module_dir: str  # where the code came from (SageMaker: the sourcedir's S3 URI)
    hyperparameters: Mapping[str, Any]  # given and derived, as SM_HPS holds them
    user_args: Sequence[str]  # the program's whole command line after the script
    channels: Mapping[str, str]  # name -> local folder, the staged dataset's "training" included
    model_dir: str
    input_dir: str
    output_dir: str
    channel_files: Mapping[str, Sequence[str]] = field(default_factory=dict)  # of program.channels: relative names
    tf_config: str | None = None  # TF_CONFIG of a multi-worker job


def sagemaker_env(s: ProgramSetting) -> dict[str, str]:
    """Every SM_* name SageMaker's training toolkit sets (Environment.to_env_vars), with trainjobs' values."""
    hosts = host_names(s.workers)
    current = hosts[s.task_index]
    group = "homogeneousCluster"
    instance_groups = [{"instance_group_name": group, "instance_type": s.instance_type, "hosts": hosts}]
    resource_config = {"current_host": current, "current_instance_type": s.instance_type,
                       "current_group_name": group, "hosts": hosts, "instance_groups": instance_groups,
                       "network_interface_name": "eth0"}
    input_data_config = {name: {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated",
                                "RecordWrapperType": "None"} for name in sorted(s.channels)}
    input_config_dir = str(PurePosixPath(s.input_dir) / "config")
    output_data_dir = str(PurePosixPath(s.output_dir) / "data")
    properties: dict[str, Any] = {
        "additional_framework_parameters": {},
        "channel_input_dirs": dict(s.channels),
        "current_host": current,
        "current_instance_group": group,
        "current_instance_group_hosts": hosts,
        "current_instance_type": s.instance_type,
        "distribution_hosts": [],
        "distribution_instance_groups": [],
        "framework_module": None,  # trainjobs runs the script itself
        "hosts": hosts,
        "hyperparameters": dict(s.hyperparameters),
        "input_config_dir": input_config_dir,
        "input_data_config": input_data_config,
        "input_dir": s.input_dir,
        "instance_groups": [group],
        "instance_groups_dict": {group: instance_groups[0]},
        "is_hetero": False,
        "is_master": s.task_index == 0,
        "is_modelparallel_enabled": None,
        "is_smddpmprun_installed": False,
        "is_smddprun_installed": False,
        "job_name": s.job_id,
        "log_level": 20,
        "master_hostname": hosts[0],
        "model_dir": s.model_dir,
        "module_dir": s.module_dir,
        "module_name": s.entry_point.replace(".py", ""),  # as the toolkit names it
        "network_interface_name": "eth0",
        "num_cpus": s.num_cpus,
        "num_gpus": s.num_gpus,
        "num_neurons": 0,
        "output_data_dir": output_data_dir,
        "output_dir": s.output_dir,
        "output_intermediate_dir": str(PurePosixPath(s.output_dir) / "intermediate"),
        "resource_config": resource_config,
        "user_entry_point": s.entry_point,
    }
    env = {
        "hosts": hosts, "network_interface_name": "eth0", "hps": properties["hyperparameters"],
        "user_entry_point": s.entry_point, "framework_params": {}, "resource_config": resource_config,
        "input_data_config": input_data_config, "output_data_dir": output_data_dir,
        "channels": sorted(s.channels), "current_host": current, "current_instance_type": s.instance_type,
        "current_instance_group": group, "current_instance_group_hosts": hosts,
        "instance_groups": [group], "instance_groups_dict": properties["instance_groups_dict"],
        "distribution_instance_groups": [], "is_hetero": False, "module_name": properties["module_name"],
        "log_level": 20, "framework_module": None, "input_dir": s.input_dir, "input_config_dir": input_config_dir,
        "output_dir": s.output_dir, "num_cpus": s.num_cpus, "num_gpus": s.num_gpus, "num_neurons": 0,
        "model_dir": s.model_dir, "module_dir": s.module_dir, "training_env": properties,
        "user_args": list(s.user_args), "output_intermediate_dir": properties["output_intermediate_dir"],
    }
    env.update({f"channel_{name}": path for name, path in s.channels.items()})
    env.update({f"hp_{name}": value for name, value in s.hyperparameters.items()})
    return {f"SM_{key.upper()}": env_value(value) for key, value in env.items()}


def sagemaker_config_files(s: ProgramSetting) -> dict[str, Any]:
    """The files SageMaker writes to /opt/ml/input/config (SM_INPUT_CONFIG_DIR here): each value as
    SageMaker stores it (hyperparameters.json holds strings)."""
    env = sagemaker_env(s)
    return {"hyperparameters.json": {k: env_value(v) for k, v in s.hyperparameters.items()},
            "resourceconfig.json": json.loads(env["SM_RESOURCE_CONFIG"]),
            "inputdataconfig.json": json.loads(env["SM_INPUT_DATA_CONFIG"])}


def vertex_env(s: ProgramSetting) -> dict[str, str]:
    """Vertex AI's names beyond the directories (ALIASES): the job's id, the data URIs of the channels
    named training/validation/test, and CLUSTER_SPEC on several workers."""
    env = {"CLOUD_ML_JOB_ID": s.job_id}
    for name, variable in VERTEX_DATA_URIS.items():
        if name in s.channel_files:
            env[variable] = data_uri(s.channels[name], s.channel_files[name])
    if "training" in s.channel_files and (fmt := data_format(s.channel_files["training"])):
        env["AIP_DATA_FORMAT"] = fmt
    if s.tf_config:
        env["CLUSTER_SPEC"] = json.dumps(cluster_spec(json.loads(s.tf_config)))
    return env


def data_uri(folder: str, files: Sequence[str]) -> str:
    """A channel as Vertex AI gives a data split: its one file, or a pattern of its files (Vertex AI's
    are `.../training-*.csv`; tf.io.gfile.glob reads either)."""
    if len(files) == 1:
        return str(PurePosixPath(folder) / files[0])
    if any("/" in f for f in files):  # a tree: no one pattern names its files
        return folder
    suffixes = {PurePosixPath(f).suffix for f in files}
    return str(PurePosixPath(folder) / (f"*{suffixes.pop()}" if len(suffixes) == 1 else "*"))


def data_format(files: Sequence[str]) -> str | None:
    """AIP_DATA_FORMAT when every file of the channel is of one format Vertex AI names."""
    formats = {_DATA_FORMATS.get(PurePosixPath(f).suffix.lower()) for f in files}
    return formats.pop() if len(formats) == 1 and None not in formats else None


def cluster_spec(tf_config: Mapping[str, Any]) -> dict[str, Any]:
    """Vertex AI's CLUSTER_SPEC for the cluster TF_CONFIG describes: the chief (worker 0) is workerpool0,
    the other workers workerpool1."""
    workers = list(tf_config.get("cluster", {}).get("worker", []))
    index = int(tf_config.get("task", {}).get("index", 0))
    cluster = {"workerpool0": workers[:1], **({"workerpool1": workers[1:]} if len(workers) > 1 else {})}
    task = {"type": "workerpool0", "index": 0} if index == 0 else {"type": "workerpool1", "index": index - 1}
    return {"cluster": cluster, "environment": "cloud", "task": task}
