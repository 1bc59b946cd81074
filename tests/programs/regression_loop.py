"""A custom training loop on a regression problem, written the way keras.io's "Writing a training loop
from scratch" and the tf.distribute guide's "custom training loop" write it: a tf.GradientTape step run
on every replica with strategy.run, the loss scaled by the global batch, metrics reported with
tj.report. The data is scikit-learn's diabetes set as it ships (442 patients, 10 features, a disease
progression score); the last 88 patients are held out, the same way every run.

Arguments: --epochs N (default: the job's), --units N.
"""

import argparse

import numpy as np
import tensorflow as tf
import keras
from sklearn.datasets import load_diabetes

from trainjobs import runtime as tj

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=None)
parser.add_argument("--units", type=int, default=32)
args = parser.parse_args()
epochs = args.epochs or tj.epochs

x, y = load_diabetes(return_X_y=True)
x = ((x - x.mean(axis=0)) / x.std(axis=0)).astype("float32")
y = (y / 100.0).astype("float32")
x_train, y_train, x_test, y_test = x[:-88], y[:-88], x[-88:], y[-88:]

strategy = tj.strategy()
batch = tj.global_batch_size
train = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(512, seed=0).batch(batch, drop_remainder=True)
train = strategy.experimental_distribute_dataset(train)

with strategy.scope():
    model = keras.Sequential([
        keras.Input((10,)),
        keras.layers.Dense(args.units, activation="relu"),
        keras.layers.Dense(args.units, activation="relu"),
        keras.layers.Dense(1, dtype="float32"),
    ])
    optimizer = keras.optimizers.Adam(learning_rate=tj.learning_rate * 10)
    # Keras 3 makes its slot variables on the first apply_gradients; inside a tf.function under
    # MirroredStrategy that first call fails ("You must feed a value for placeholder tensor"), so they
    # are made here, as the tf.distribute custom-loop guide's Keras 3 edition does.
    optimizer.build(model.trainable_variables)
    train_mae = keras.metrics.MeanAbsoluteError()
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=tf.Variable(0, dtype=tf.int64))
manager = tf.train.CheckpointManager(checkpoint, str(tj.checkpoint_dir), max_to_keep=2)
if manager.latest_checkpoint:
    checkpoint.restore(manager.latest_checkpoint)
    print("resumed at epoch", int(checkpoint.epoch.numpy()))


def step(inputs):
    features, targets = inputs
    with tf.GradientTape() as tape:
        predictions = tf.squeeze(model(features, training=True), axis=-1)
        per_example = tf.square(targets - predictions)
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=batch)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    train_mae.update_state(targets, predictions)
    return loss


@tf.function
def distributed_step(inputs):
    losses = strategy.run(step, args=(inputs,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)


for epoch in range(int(checkpoint.epoch.numpy()), epochs):
    total, batches = 0.0, 0
    for inputs in train:
        total += float(distributed_step(inputs))
        batches += 1
    test_mae = float(np.mean(np.abs(model.predict(x_test, verbose=0)[:, 0] - y_test)))
    checkpoint.epoch.assign(epoch + 1)
    manager.save()
    tj.checkpoint_saved()
    tj.report(epoch=epoch + 1, epochs=epochs, loss=total / batches, mae=float(train_mae.result()), test_mae=test_mae)
    train_mae.reset_state()
    if tj.should_stop():
        raise SystemExit("stopped: the job is being stopped; the checkpoint is saved")

if tj.is_chief:
    model.save(tj.model_dir / "regressor.keras")
