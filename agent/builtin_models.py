"""The built-in models, sized by model.params. Each one starts with a Normalization layer fixed to
the training data's per-channel statistics, so raw staged features (pixels 0..255, digits 0..16)
train without the user rescaling them.

Which built-ins exist, the params each takes and their defaults, and the features each needs are the
core's table (trainjobs/model_params.py), which the API checks at submit; this module only builds them.
"""

from __future__ import annotations

from typing import Any

from trainjobs.model_params import BUILTIN_IMAGE_MODELS, features_problem, unknown_param, with_defaults
from agent.model_inputs import Builder, ModelError, ModelInputs


def _params(name: str, given: dict[str, Any]) -> dict[str, Any]:
    # The API refuses unknown params at submit; a job stored before that check may still carry one, and
    # still fails here, before any training, as it always did.
    if unknown := unknown_param(name, given):
        raise ModelError(f"model.params.{unknown[0]}: {unknown[1]}")
    return with_defaults(name, given)


def _normalized_input(inputs: ModelInputs, name: str) -> tuple[Any, Any]:
    import keras

    shape = inputs.input_shape
    if problem := features_problem(name, shape):
        raise ModelError(problem)
    x = inp = keras.Input(shape, name="features")
    if name in BUILTIN_IMAGE_MODELS and len(shape) == 2:
        x = keras.layers.Reshape((*shape, 1))(x)  # an image without channels: give it one
    if inputs.mean is not None and inputs.variance is not None:
        x = keras.layers.Normalization(mean=list(inputs.mean), variance=list(inputs.variance), name="normalize")(x)
    return inp, x


def _head(x: Any, inputs: ModelInputs, dropout: float) -> Any:
    import keras

    if dropout:
        x = keras.layers.Dropout(dropout)(x)
    return inputs.head(x)


def mlp(inputs: ModelInputs) -> Any:
    import keras

    p = _params("mlp", inputs.params)
    units = p["hidden_units"] if isinstance(p["hidden_units"], list) else [p["hidden_units"]]
    inp, x = _normalized_input(inputs, "mlp")
    x = keras.layers.Flatten()(x)
    for n in units:
        x = keras.layers.Dense(int(n), activation="relu")(x)
    return keras.Model(inp, _head(x, inputs, float(p["dropout"])), name="mlp")


def cnn(inputs: ModelInputs) -> Any:
    import keras

    p = _params("cnn", inputs.params)
    inp, x = _normalized_input(inputs, "cnn")
    for f in p["filters"]:
        x = keras.layers.Conv2D(int(f), int(p["kernel_size"]), padding="same", activation="relu")(x)
        if min(x.shape[1], x.shape[2]) >= 2:
            x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(int(p["dense_units"]), activation="relu")(x)
    return keras.Model(inp, _head(x, inputs, float(p["dropout"])), name="cnn")


def resnet(inputs: ModelInputs) -> Any:
    """A small pre-activation ResNet: one stage per entry in filters, halving the side between stages."""
    import keras
    from keras import layers

    p = _params("resnet", inputs.params)
    inp, x = _normalized_input(inputs, "resnet")
    x = layers.Conv2D(int(p["filters"][0]), 3, padding="same", use_bias=False)(x)
    for stage, f in enumerate(int(f) for f in p["filters"]):
        for block in range(int(p["blocks_per_stage"])):
            stride = 2 if stage and not block and min(x.shape[1], x.shape[2]) >= 2 else 1
            y = layers.Activation("relu")(layers.BatchNormalization()(x))
            shortcut = x if stride == 1 and x.shape[-1] == f else layers.Conv2D(f, 1, strides=stride, use_bias=False)(y)
            y = layers.Conv2D(f, 3, strides=stride, padding="same", use_bias=False)(y)
            y = layers.Activation("relu")(layers.BatchNormalization()(y))
            y = layers.Conv2D(f, 3, padding="same", use_bias=False)(y)
            x = layers.Add()([shortcut, y])
    x = layers.Activation("relu")(layers.BatchNormalization()(x))
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, _head(x, inputs, float(p["dropout"])), name="resnet")


# By the table's names: tests/unit/test_model_table.py checks every built-in the table names has a builder.
BUILTIN_BUILDERS: dict[str, Builder] = {"mlp": mlp, "cnn": cnn, "resnet": resnet}
