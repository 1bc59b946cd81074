"""Keras' BackupAndRestore used as its documentation shows (the class docstring's example in
keras/src/callbacks/backup_and_restore.py), in a script that knows nothing of trainjobs: the backup in
AIP_CHECKPOINT_DIR (Vertex AI's directory that outlives a restart), a CSVLogger appending each finished
epoch beside it (append=True, so a restarted run goes on with the same file), the model and that history
to AIP_MODEL_DIR. Where the docs' InterruptingCallback raises at epoch 4, the interruption here is a real
kill: after each epoch listed in KILL_AFTER_EPOCHS the script says so and waits (at most five minutes) to
be killed. Data: scikit-learn's digits; a small dense network."""

import os
import shutil
import time

import keras
from sklearn.datasets import load_digits

checkpoint_dir = os.environ["AIP_CHECKPOINT_DIR"]
model_dir = os.environ["AIP_MODEL_DIR"]
kill_after = {int(e) for e in os.environ.get("KILL_AFTER_EPOCHS", "").split(",") if e}
history_csv = os.path.join(checkpoint_dir, "history.csv")

x, y = load_digits(return_X_y=True)
x = (x / 16.0).astype("float32")
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy", metrics=["accuracy"])


class WaitToBeKilled(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        print(f"training epoch {epoch + 1}", flush=True)

    def on_epoch_end(self, epoch, logs=None):
        print(f"trained epoch {epoch + 1}", flush=True)
        if epoch + 1 in kill_after:
            print(f"waiting to be killed after epoch {epoch + 1}", flush=True)
            time.sleep(300)


model.fit(x, y, batch_size=64, epochs=8, verbose=2,
          callbacks=[keras.callbacks.BackupAndRestore(backup_dir=os.path.join(checkpoint_dir, "backup")),
                     keras.callbacks.CSVLogger(history_csv, append=True), WaitToBeKilled()])
model.save(os.path.join(model_dir, "model.keras"))
shutil.copy(history_csv, os.path.join(model_dir, "history.csv"))
