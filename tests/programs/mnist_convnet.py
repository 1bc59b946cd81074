"""
Title: Simple MNIST convnet
Author: [fchollet](https://twitter.com/fchollet)
Date created: 2015/06/19
Last modified: 2020/04/21
Description: A simple convnet that achieves ~99% test accuracy on MNIST.

The keras.io example as published, changed where it loads MNIST (there is no download here: scikit-learn's
digits, as they ship, resized to 28x28 and held out the same way every run) and by the trainjobs
runtime's lines, each marked `# trainjobs`.
"""

"""
## Setup
"""

import numpy as np
import keras
from keras import layers
from trainjobs import runtime as tj  # trainjobs

"""
## Prepare the data
"""

# Model / data parameters
num_classes = 10
input_shape = (28, 28, 1)


def load_digits_as_mnist():  # MNIST's load_data(), from scikit-learn's digits
    from sklearn.datasets import load_digits

    d = load_digits()
    order = np.random.default_rng(0).permutation(len(d.target))
    x = d.images[order] * (255 / 16)  # 0..16 -> MNIST's 0..255
    x = keras.ops.convert_to_numpy(keras.ops.image.resize(x[..., None], (28, 28)))[..., 0]
    y = d.target[order]
    return (x[:-297], y[:-297]), (x[-297:], y[-297:])


# Load the data and split it between train and test sets
(x_train, y_train), (x_test, y_test) = load_digits_as_mnist()

# Scale images to the [0, 1] range
x_train = x_train.astype("float32") / 255
x_test = x_test.astype("float32") / 255
# Make sure images have shape (28, 28, 1)
x_train = np.expand_dims(x_train, -1)
x_test = np.expand_dims(x_test, -1)
print("x_train shape:", x_train.shape)
print(x_train.shape[0], "train samples")
print(x_test.shape[0], "test samples")


# convert class vectors to binary class matrices
y_train = keras.utils.to_categorical(y_train, num_classes)
y_test = keras.utils.to_categorical(y_test, num_classes)

"""
## Build the model
"""

with tj.strategy().scope():  # trainjobs
    model = keras.Sequential(
        [
            keras.Input(shape=input_shape),
            layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Flatten(),
            layers.Dropout(0.5),
            layers.Dense(num_classes, activation="softmax"),
        ]
    )

model.summary()

"""
## Train the model
"""

batch_size = 128
epochs = tj.epochs  # trainjobs

with tj.strategy().scope():  # trainjobs
    model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"],
                  steps_per_execution=tj.steps_per_execution)  # trainjobs

model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs, validation_split=0.1,
          callbacks=tj.callbacks())  # trainjobs

"""
## Evaluate the trained model
"""

score = model.evaluate(x_test, y_test, verbose=0)
print("Test loss:", score[0])
print("Test accuracy:", score[1])
model.save(tj.model_dir / "model.keras")  # trainjobs
