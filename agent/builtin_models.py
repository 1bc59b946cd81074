"""The built-in models, sized by model.params. Each one starts with a Normalization layer fixed to
the training data's per-channel statistics, so raw staged features (pixels 0..255, digits 0..16)
train without the user rescaling them."""

from __future__ import annotations

from typing import Any

from trainjobs.model_params import BUILTIN_PARAMS, with_defaults
from agent.models import ModelError, ModelInputs


def _params(name: str, given: dict[str, Any]) -> dict[str, Any]:
    # The API refuses unknown params at submit (trainjobs/model_params.py); a job stored before that
    # check may still carry one, and still fails here, before any training, as it always did.
    unknown = set(given) - set(BUILTIN_PARAMS[name])
    if unknown:
        raise ModelError(f"model.params {sorted(unknown)} mean nothing to {name}; it takes {sorted(BUILTIN_PARAMS[name])}")
    return with_defaults(name, given)


def _normalized_input(inputs: ModelInputs, need_image: str | None = None) -> tuple[Any, Any]:
    import keras

    shape = inputs.input_shape
    x = inp = keras.Input(shape, name="features")
    if need_image and len(shape) == 2:
        x = keras.layers.Reshape((*shape, 1))(x)
    elif need_image and len(shape) != 3:
        raise ModelError(f"{need_image} needs image features (height, width[, channels]), got shape {list(shape)}; use mlp")
    if inputs.mean is not None and inputs.variance is not None:
        x = keras.layers.Normalization(mean=list(inputs.mean), variance=list(inputs.variance), name="normalize")(x)
    return inp, x


def _head(x: Any, inputs: ModelInputs, dropout: float) -> Any:
    import keras

    if dropout:
        x = keras.layers.Dropout(dropout)(x)
    return keras.layers.Dense(inputs.num_classes, activation="softmax", dtype="float32", name="probabilities")(x)


def mlp(inputs: ModelInputs) -> Any:
    import keras

    p = _params("mlp", inputs.params)
    units = p["hidden_units"] if isinstance(p["hidden_units"], list) else [p["hidden_units"]]
    inp, x = _normalized_input(inputs)
    x = keras.layers.Flatten()(x)
    for n in units:
        x = keras.layers.Dense(int(n), activation="relu")(x)
    return keras.Model(inp, _head(x, inputs, float(p["dropout"])), name="mlp")


def cnn(inputs: ModelInputs) -> Any:
    import keras

    p = _params("cnn", inputs.params)
    inp, x = _normalized_input(inputs, need_image="cnn")
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
    inp, x = _normalized_input(inputs, need_image="resnet")
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
