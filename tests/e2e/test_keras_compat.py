"""The agent's repairs to Keras (agent/keras_compat.py), under the Keras of the venv that runs the tests:
the dev venv's (where newer Keras needs no repair) and each default image's (`make test-images`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import scaled

REPO = Path(__file__).resolve().parents[2]

# Two replicas on two logical CPUs (set before TensorFlow starts, hence a process of its own). A model
# that always answers class 0 is evaluated on batches of four whose first two examples (replica 0's
# half of each batch) are class 0 and last two (replica 1's) class 1: the accuracy over the data is 0.5,
# and replica 0's alone would be 1.0.
EVALUATE_ON_TWO_REPLICAS = """
import json
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras

from agent.keras_compat import repair_before_build
from agent.step_functions import install_step_functions

repair_before_build()  # as the agent does before it builds the model
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(
        2, kernel_initializer="zeros", bias_initializer=keras.initializers.Constant([1.0, 0.0]))])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
install_step_functions(model, 1)  # the agent's own test function, as in a job
x, y = np.zeros((8, 1), np.float32), np.array([0, 0, 1, 1] * 2)
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
print("RESULT", json.dumps(model.evaluate(data, return_dict=True, verbose=0)))
"""


@pytest.mark.tf
def test_evaluation_under_mirrored_strategy_reports_every_replicas_examples() -> None:
    # Keras 3.4 and 3.6 (the TF 2.17 and 2.18 images) answer 1.0 without the repair: replica 0's metric.
    proc = subprocess.run([sys.executable, "-c", EVALUATE_ON_TWO_REPLICAS], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=scaled(120))
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    assert json.loads(line.removeprefix("RESULT "))["accuracy"] == pytest.approx(0.5)
