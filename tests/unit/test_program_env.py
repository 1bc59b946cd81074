"""What a program is handed in the names other platforms use (issue 37): every SM_* name SageMaker's
training toolkit sets, in its shapes, and Vertex AI's AIP_*, CLOUD_ML_JOB_ID and CLUSTER_SPEC
(trainjobs/program_env.py); and what the spec accepts of program.hyperparameters and program.channels.
The jobs that read them: tests/e2e/test_platform_scripts.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from agent.program import _hyperparameters
from trainjobs import program_env
from trainjobs.program_env import ProgramSetting, cluster_spec, hyperparameter_args, sagemaker_env, vertex_env
from trainjobs.spec import JobSpec
from trainjobs.spec.job import parse_stored

# Every name aws/sagemaker-training-toolkit's Environment.to_env_vars sets (src/sagemaker_training/
# environment.py at 33839372faf8017edb7dafc6290c1ef63557b404), SM_CHANNEL_*/SM_HP_* aside; SM_TOPOLOGY
# only for GB200 UltraServers.
TOOLKIT_NAMES = {
    "SM_HOSTS", "SM_NETWORK_INTERFACE_NAME", "SM_HPS", "SM_USER_ENTRY_POINT", "SM_FRAMEWORK_PARAMS",
    "SM_RESOURCE_CONFIG", "SM_INPUT_DATA_CONFIG", "SM_OUTPUT_DATA_DIR", "SM_CHANNELS", "SM_CURRENT_HOST",
    "SM_CURRENT_INSTANCE_TYPE", "SM_CURRENT_INSTANCE_GROUP", "SM_CURRENT_INSTANCE_GROUP_HOSTS",
    "SM_INSTANCE_GROUPS", "SM_INSTANCE_GROUPS_DICT", "SM_DISTRIBUTION_INSTANCE_GROUPS", "SM_IS_HETERO",
    "SM_MODULE_NAME", "SM_LOG_LEVEL", "SM_FRAMEWORK_MODULE", "SM_INPUT_DIR", "SM_INPUT_CONFIG_DIR",
    "SM_OUTPUT_DIR", "SM_NUM_CPUS", "SM_NUM_GPUS", "SM_NUM_NEURONS", "SM_MODEL_DIR", "SM_MODULE_DIR",
    "SM_TRAINING_ENV", "SM_USER_ARGS", "SM_OUTPUT_INTERMEDIATE_DIR",
}
TF_CONFIG = {"cluster": {"worker": ["10.0.0.2:2222", "10.0.0.3:2223", "10.0.0.4:2224"]},
             "task": {"type": "worker", "index": 2}}


def _setting(**changes: Any) -> ProgramSetting:
    hps = {"epochs": 3, "learning-rate": 0.01, "shuffle": True, "optimizer": "adam"}
    values: dict[str, Any] = dict(
        job_id="job-1", workers=3, task_index=1, instance_type="gpu:nvidia-l4", num_cpus=8, num_gpus=2,
        entry_point="trainer/task.py", module_dir="gs://b/uploads/p/s/trainer.zip", hyperparameters=hps,
        user_args=["--verbose", *hyperparameter_args(hps)],
        channels={"training": "/w/input/data/training", "testing": "/w/input/data/testing"},
        model_dir="/w/artifacts", input_dir="/w/input", output_dir="/w/output",
        channel_files={"training": ["train.csv"], "testing": ["a.csv", "b.csv"]})
    values.update(changes)
    return ProgramSetting(**values)


def test_every_name_the_sagemaker_toolkit_sets_is_set_in_its_shape() -> None:
    env = sagemaker_env(_setting())

    assert set(env) == TOOLKIT_NAMES | {"SM_CHANNEL_TRAINING", "SM_CHANNEL_TESTING", "SM_HP_EPOCHS",
                                        "SM_HP_LEARNING-RATE", "SM_HP_SHUFFLE", "SM_HP_OPTIMIZER"}
    assert env["SM_HOSTS"] == '["algo-1","algo-2","algo-3"]' and env["SM_CURRENT_HOST"] == "algo-2"
    assert env["SM_HPS"] == '{"epochs":3,"learning-rate":0.01,"optimizer":"adam","shuffle":true}'
    # A string as it is, anything else as JSON (mapping.to_env_vars).
    assert (env["SM_HP_EPOCHS"], env["SM_HP_SHUFFLE"], env["SM_HP_OPTIMIZER"]) == ("3", "true", "adam")
    assert env["SM_CHANNELS"] == '["testing","training"]'
    assert env["SM_CHANNEL_TRAINING"] == "/w/input/data/training"
    assert (env["SM_MODEL_DIR"], env["SM_INPUT_DIR"], env["SM_INPUT_CONFIG_DIR"]) == (
        "/w/artifacts", "/w/input", "/w/input/config")
    assert (env["SM_OUTPUT_DIR"], env["SM_OUTPUT_DATA_DIR"]) == ("/w/output", "/w/output/data")
    assert (env["SM_NUM_GPUS"], env["SM_NUM_CPUS"], env["SM_LOG_LEVEL"]) == ("2", "8", "20")
    assert (env["SM_MODULE_NAME"], env["SM_USER_ENTRY_POINT"]) == ("trainer/task", "trainer/task.py")
    assert env["SM_FRAMEWORK_PARAMS"] == "{}" and env["SM_NETWORK_INTERFACE_NAME"] == "eth0"
    assert json.loads(env["SM_USER_ARGS"]) == ["--verbose", "--epochs", "3", "--learning-rate", "0.01",
                                               "--optimizer", "adam", "--shuffle", "True"]
    resource = json.loads(env["SM_RESOURCE_CONFIG"])
    assert resource["current_host"] == "algo-2" and resource["hosts"] == ["algo-1", "algo-2", "algo-3"]
    assert json.loads(env["SM_INPUT_DATA_CONFIG"])["training"]["TrainingInputMode"] == "File"
    training_env = json.loads(env["SM_TRAINING_ENV"])
    assert training_env["channel_input_dirs"] == {"training": "/w/input/data/training",
                                                  "testing": "/w/input/data/testing"}
    assert (training_env["is_master"], training_env["master_hostname"], training_env["job_name"]) == (
        False, "algo-1", "job-1")
    assert training_env["hyperparameters"]["shuffle"] is True


def test_the_chief_is_algo_1_and_a_single_worker_is_its_only_host() -> None:
    env = sagemaker_env(_setting(workers=1, task_index=0))
    assert (env["SM_HOSTS"], env["SM_CURRENT_HOST"]) == ('["algo-1"]', "algo-1")
    assert json.loads(env["SM_TRAINING_ENV"])["is_master"] is True


def test_hyperparameters_are_passed_as_sagemaker_passes_them() -> None:
    assert hyperparameter_args({"lr": 0.001, "epochs": 10, "b": "x", "augment": False}) == [
        "--augment", "False", "-b", "x", "--epochs", "10", "--lr", "0.001"]


def test_sm_hps_holds_the_named_arguments_and_the_hyperparameters_over_them() -> None:
    assert _hyperparameters(["--epochs", "20", "--verbose", "--lr", "0.1", "data.csv"]) == {"epochs": "20", "lr": "0.1"}
    assert _hyperparameters(["--epochs", "20", "--lr", "0.1"], {"epochs": 5}) == {"epochs": 5, "lr": "0.1"}


def test_vertex_ai_data_uris_point_at_the_channels_of_its_split_names() -> None:
    env = vertex_env(_setting(channels={"training": "/w/d/training", "validation": "/w/d/validation",
                                        "test": "/w/d/test", "extra": "/w/d/extra"},
                              channel_files={"training": ["train.csv"], "validation": ["a.csv", "b.csv"],
                                             "test": ["x/1.csv", "y/2.csv"], "extra": ["e.bin"]}))

    assert env["AIP_TRAINING_DATA_URI"] == "/w/d/training/train.csv"  # one file: the file
    assert env["AIP_VALIDATION_DATA_URI"] == "/w/d/validation/*.csv"  # several: Vertex AI's pattern
    assert env["AIP_TEST_DATA_URI"] == "/w/d/test"  # a tree: the folder
    assert env["AIP_DATA_FORMAT"] == "csv" and env["CLOUD_ML_JOB_ID"] == "job-1"
    assert "CLUSTER_SPEC" not in env  # one worker: Vertex AI sets neither it nor TF_CONFIG


def test_cluster_spec_names_the_chief_workerpool0_and_the_other_workers_workerpool1() -> None:
    env = vertex_env(_setting(tf_config=json.dumps(TF_CONFIG)))

    assert json.loads(env["CLUSTER_SPEC"]) == {
        "cluster": {"workerpool0": ["10.0.0.2:2222"], "workerpool1": ["10.0.0.3:2223", "10.0.0.4:2224"]},
        "environment": "cloud", "task": {"type": "workerpool1", "index": 1}}
    chief = cluster_spec({**TF_CONFIG, "task": {"type": "worker", "index": 0}})
    assert chief["task"] == {"type": "workerpool0", "index": 0}


def _program(**fields: Any) -> dict[str, Any]:
    return {"program": {"source": "gs://b/uploads/p/s/train.py", **fields}}


def _refusal(spec: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as caught:
        JobSpec.model_validate(spec)
    return str(caught.value)


def test_hyperparameters_keep_their_json_types() -> None:
    spec = JobSpec.model_validate(_program(hyperparameters={"epochs": 3, "lr": 0.1, "shuffle": True, "opt": "adam",
                                                            "n": "3"}))
    assert spec.program is not None
    assert spec.program.hyperparameters == {"epochs": 3, "lr": 0.1, "shuffle": True, "opt": "adam", "n": "3"}
    assert type(spec.program.hyperparameters["shuffle"]) is bool and type(spec.program.hyperparameters["n"]) is str


@pytest.mark.parametrize(("fields", "reason"), [
    ({"hyperparameters": {"x": None}}, "hyperparameters"),
    ({"hyperparameters": {"x": [1, 2]}}, "hyperparameters"),
    ({"hyperparameters": {"--lr": 1}}, "is not a hyperparameter name"),
    ({"hyperparameters": {"lr": "x" * 2501}}, "over the limit of 2500"),
    ({"channels": {"../up": "gs://b/x"}}, "is not a channel name"),
    ({"channels": {"train": "gs://b/x", "TRAIN": "gs://b/y"}}, "would both be SM_CHANNEL_TRAIN"),
    ({"channels": {f"c{i}": "gs://b/x" for i in range(21)}}, "21 channels, over the limit of 20"),
    ({"channels": {"training": "sklearn:digits"}}, "is bundled data, not files"),
    ({"channels": {"training": ""}}, "a channel's source is"),
    ({"channels": {"training": "dataset:../../uploads/x"}}, "is not an upload: dataset:<sha256>"),
    ({"env": {"SM_HOSTS": "x"}}, "trainjobs sets those a training script reads"),
    ({"env": {"SM_CHANNEL_TRAINING": "/data"}}, "give them there"),
    ({"env": {"CLUSTER_SPEC": "{}"}}, "cannot be overridden"),
])
def test_what_the_spec_refuses_of_hyperparameters_channels_and_platform_names(fields: dict[str, Any],
                                                                            reason: str) -> None:
    assert reason in _refusal(_program(**fields))


def test_the_reserved_names_are_the_ones_trainjobs_sets() -> None:
    env = {**sagemaker_env(_setting()), **vertex_env(_setting(tf_config=json.dumps(TF_CONFIG)))}
    assert all(program_env.reserved(name) for name in env)


def test_a_programs_env_may_not_switch_keras_itself_but_a_stored_job_that_did_still_reads() -> None:
    # program.keras says it, and it also installs the tf-keras the switch needs: the switch alone ran the
    # program with tf.keras missing on an image without tf-keras.
    refusal = _refusal(_program(env={"TF_USE_LEGACY_KERAS": "1"}))
    assert refusal.splitlines()[1] == "program.env"
    assert "TF_USE_LEGACY_KERAS is set by trainjobs from program.keras: give `keras: 2`" in refusal
    stored = parse_stored(_program(env={"TF_USE_LEGACY_KERAS": "1"}))
    assert stored.program is not None and stored.program.env == {"TF_USE_LEGACY_KERAS": "1"}
