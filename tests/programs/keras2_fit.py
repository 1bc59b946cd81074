"""long_fit.py as a script for TensorFlow <= 2.15 writes it (`program.keras: 2`): `tf.keras`, which is
tf_keras here, the runtime's callbacks in its fit, and the model saved the Keras 2 way, to a folder
without an extension (a SavedModel; Keras 3 refuses the call). It also leaves keras.json beside it: the
Keras it ran with and the precision policy of its layers. With PAUSE_AFTER_EPOCH=N it waits after epoch
N (at most five minutes) until the job is being stopped; with CHECKPOINT_EVERY_STEPS=K its backup is
taken every K calls of the train function, and at the step a stop is seen."""

import json
import os
import time

import tensorflow as tf
from sklearn.datasets import load_digits

from trainjobs import runtime as tj

x, y = load_digits(return_X_y=True)
x = (x / 16.0).astype("float32")
with tj.strategy().scope():
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(64, activation="relu"),
                                 tf.keras.layers.Dense(10, activation="softmax", dtype="float32")])
    model.compile(optimizer=tf.keras.optimizers.Adam(tj.learning_rate), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], steps_per_execution=tj.steps_per_execution)


class PauseAfter(tf.keras.callbacks.Callback):
    epoch, first_step = None, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = self.epoch if self.first_step is not None else epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.first_step = batch if self.first_step is None else self.first_step

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == int(os.environ.get("PAUSE_AFTER_EPOCH", "0")):
            print("pausing after epoch", epoch + 1, flush=True)
            deadline = time.monotonic() + 300
            while not tj.should_stop() and time.monotonic() < deadline:
                time.sleep(0.05)


every = os.environ.get("CHECKPOINT_EVERY_STEPS")
pause = PauseAfter()  # and where this attempt began
history = model.fit(x, y, batch_size=tj.global_batch_size, epochs=tj.epochs,
                    callbacks=tj.callbacks(checkpoint_every_steps=int(every) if every else None) + [pause], verbose=2)
print("epochs run by this attempt:", len(history.history["loss"]))
print(f"this attempt began at epoch {pause.epoch + 1}, step {pause.first_step}")
model.save(os.path.join(tj.model_dir, "saved_model"))
with open(os.path.join(tj.model_dir, "keras.json"), "w") as f:
    json.dump({"keras": tf.keras.__name__, "policy": model.layers[0].dtype_policy.name}, f)
