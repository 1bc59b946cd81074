"""A training script written for Vertex AI custom training, as its documentation and samples write one:
arguments for hyperparameters, its own tf.distribute strategy, the model written to AIP_MODEL_DIR,
TensorBoard logs to AIP_TENSORBOARD_LOG_DIR. It knows nothing of trainjobs and runs unchanged.
Data: scikit-learn's breast cancer set as it ships, the last 100 patients held out."""

import argparse
import os

import tensorflow as tf
from sklearn.datasets import load_breast_cancer

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", dest="epochs", default=10, type=int, help="Number of epochs.")
parser.add_argument("--batch_size", dest="batch_size", default=32, type=int, help="Size of a batch.")
parser.add_argument("--distribute", dest="distribute", type=str, default="single",
                    help="distributed training strategy")
args = parser.parse_args()

print("Python Version = {}".format(os.sys.version))
print("TensorFlow Version = {}".format(tf.__version__))
print("DEVICES", tf.config.list_physical_devices())

# Single Machine, single compute device
if args.distribute == "single":
    strategy = tf.distribute.get_strategy()
# Single Machine, multiple compute device
elif args.distribute == "mirror":
    strategy = tf.distribute.MirroredStrategy()
# Multiple Machine, multiple compute device
elif args.distribute == "multi":
    strategy = tf.distribute.experimental.MultiWorkerMirroredStrategy()
print("num_replicas_in_sync = {}".format(strategy.num_replicas_in_sync))

x, y = load_breast_cancer(return_X_y=True)
x = ((x - x.mean(axis=0)) / x.std(axis=0)).astype("float32")
train = tf.data.Dataset.from_tensor_slices((x[:-100], y[:-100])).shuffle(1000).batch(args.batch_size)


def build_and_compile_model():
    model = tf.keras.Sequential([
        tf.keras.Input((30,)),
        tf.keras.layers.Dense(16, activation="relu"),
        tf.keras.layers.Dense(1, activation="sigmoid"),
    ])
    model.compile(loss="binary_crossentropy", optimizer=tf.keras.optimizers.Adam(0.01), metrics=["accuracy"])
    return model


with strategy.scope():
    model = build_and_compile_model()

callbacks = [tf.keras.callbacks.CSVLogger(os.path.join(os.environ["AIP_TENSORBOARD_LOG_DIR"], "training.csv"))]
model.fit(train, epochs=args.epochs, callbacks=callbacks)
model.export(os.environ["AIP_MODEL_DIR"])
