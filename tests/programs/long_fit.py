"""A plain Keras fit with the runtime's callbacks: scikit-learn's digits, a small dense network, epochs
and batch from the job. With PAUSE_AFTER_EPOCH=N in its environment it waits after epoch N (at most five
minutes) until the job is being stopped: the moment a test kills or preempts it."""

import os
import time

import keras
from sklearn.datasets import load_digits

from trainjobs import runtime as tj

x, y = load_digits(return_X_y=True)
x = (x / 16.0).astype("float32")
with tj.strategy().scope():
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(tj.learning_rate), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], steps_per_execution=tj.steps_per_execution)


class PauseAfter(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == int(os.environ.get("PAUSE_AFTER_EPOCH", "0")):
            print("pausing after epoch", epoch + 1, flush=True)
            deadline = time.monotonic() + 300
            while not tj.should_stop() and time.monotonic() < deadline:
                time.sleep(0.05)


history = model.fit(x, y, batch_size=tj.global_batch_size, epochs=tj.epochs,
                    callbacks=tj.callbacks() + [PauseAfter()], verbose=2)
print("epochs run by this attempt:", len(history.history["loss"]))
model.save(tj.model_dir / "model.keras")
