"""The models trainjobs builds itself: the built-ins (mlp, cnn, resnet) and the keras.applications
architectures, which `model.params` each takes and the features each needs. One table, read by the spec
validator (a 422 at submit naming `model.params.<name>`), staging's preflight (features of the wrong
shape fail before a machine is paid for) and the agent's builders (the defaults they build with, and the
same checks for a job stored before them). Before this table the names lived only in the agent, so a
typo passed submit, staging and provisioning and failed on the paid machine (issue 19).

Pure data and checks: no Keras here, so the API can read it. tests/e2e/test_user_models.py checks the
keras.applications rows against the pinned Keras's own signatures.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive_int(v: Any) -> str | None:
    return None if _is_int(v) and 1 <= v <= 65_536 else "a whole number from 1 to 65536"


def _positive_ints(v: Any) -> str | None:
    if isinstance(v, list) and 1 <= len(v) <= 64 and all(_positive_int(n) is None for n in v):
        return None
    return "a list of 1 to 64 whole numbers, each from 1 to 65536"


def _units(v: Any) -> str | None:
    return None if _positive_int(v) is None or _positive_ints(v) is None else \
        "a whole number from 1 to 65536, or a list of 1 to 64 of them (one per layer)"


def _fraction(v: Any) -> str | None:
    return None if (_is_int(v) or isinstance(v, float)) and 0 <= v < 1 else "a number from 0 up to (not including) 1"


def _positive_number(v: Any) -> str | None:
    return None if (_is_int(v) or isinstance(v, float)) and 0 < v <= 16 else "a number above 0, at most 16"


def _flag(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


@dataclass(frozen=True)
class Param:
    default: Any  # what the model builds with when the spec does not set it; None: the architecture's own
    problem: Callable[[Any], str | None]  # what a value must be, or None when it is one


_DROPOUT = Param(0.0, _fraction)

BUILTIN_PARAMS: dict[str, dict[str, Param]] = {
    "mlp": {"hidden_units": Param([128, 64], _units), "dropout": Param(0.1, _fraction)},
    "cnn": {"filters": Param([32, 64], _positive_ints), "kernel_size": Param(3, _positive_int),
            "dense_units": Param(64, _positive_int), "dropout": Param(0.2, _fraction)},
    "resnet": {"filters": Param([16, 32, 64], _positive_ints), "blocks_per_stage": Param(1, _positive_int),
               "dropout": _DROPOUT},
}
BUILTIN_MODELS = tuple(BUILTIN_PARAMS)
# The built-ins that convolve: their features are an image, (height, width) or (height, width, channels).
BUILTIN_IMAGE_MODELS = ("cnn", "resnet")

# keras.applications architectures in the pinned Keras (3.15); tests/e2e/test_user_models.py checks this
# list against Keras itself, so a Keras upgrade that drops one fails CI rather than a user's job. Their
# features are an image with channels: (height, width, channels).
KERAS_APPLICATIONS = (
    "ConvNeXtBase", "ConvNeXtLarge", "ConvNeXtSmall", "ConvNeXtTiny", "ConvNeXtXLarge", "DenseNet121", "DenseNet169",
    "DenseNet201", "EfficientNetB0", "EfficientNetB1", "EfficientNetB2", "EfficientNetB3", "EfficientNetB4",
    "EfficientNetB5", "EfficientNetB6", "EfficientNetB7", "EfficientNetV2B0", "EfficientNetV2B1", "EfficientNetV2B2",
    "EfficientNetV2B3", "EfficientNetV2L", "EfficientNetV2M", "EfficientNetV2S", "InceptionResNetV2", "InceptionV3",
    "MobileNet", "MobileNetV2", "MobileNetV3Large", "MobileNetV3Small", "NASNetLarge", "NASNetMobile", "ResNet101",
    "ResNet101V2", "ResNet152", "ResNet152V2", "ResNet50", "ResNet50V2", "VGG16", "VGG19", "Xception",
)

# keras.applications: every architecture takes `dropout` (ours, before the classification head); the
# rest are the constructors' own keywords that still mean something under include_top=False and
# weights=None, which is how the agent builds them (agent/models.py). The constructors' `name`,
# `classes`, `classifier_activation`, `input_*`, `pooling`, `weights`, and MobileNetV3's `dropout_rate`
# (only used by the top the agent leaves off) are not the user's.
_ALPHA = Param(None, _positive_number)  # width multiplier
_PREPROCESSING = Param(None, _flag)  # the architecture's own input rescaling layer
_APPLICATION_EXTRAS: dict[str, dict[str, Param]] = {
    "MobileNet": {"alpha": _ALPHA, "depth_multiplier": Param(None, _positive_int)},
    "MobileNetV2": {"alpha": _ALPHA},
    "MobileNetV3": {"alpha": _ALPHA, "minimalistic": Param(None, _flag), "include_preprocessing": _PREPROCESSING},
    "ConvNeXt": {"include_preprocessing": _PREPROCESSING},
    "EfficientNetV2": {"include_preprocessing": _PREPROCESSING},
}


def application_params(name: str) -> dict[str, Param]:
    """The params a keras.applications architecture takes, by its family (the longest matching prefix:
    MobileNetV3Small is a MobileNetV3, not a MobileNet)."""
    family = max((f for f in _APPLICATION_EXTRAS if name.startswith(f)), key=len, default=None)
    return {"dropout": _DROPOUT, **(_APPLICATION_EXTRAS[family] if family else {})}


def params_of(model_name: str) -> dict[str, Param]:
    return BUILTIN_PARAMS.get(model_name) or application_params(model_name)


def did_you_mean(word: str, names: list[str]) -> str | None:
    """The name in `names` nearest to a misspelt `word` (`hiden_units`, `trainig`), or None if none is close.
    The spec's unknown fields and unknown model params share it."""
    found = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    return found[0] if found else None


def unknown_param(model_name: str, params: dict[str, Any]) -> tuple[str, str] | None:
    """(param name, reason) for the first param `model_name` does not take, else None."""
    takes = params_of(model_name)
    for key in params:
        if key not in takes:
            reason = f"{model_name} takes no param {key!r}; it takes {', '.join(sorted(takes))}"
            if hint := did_you_mean(key, sorted(takes)):
                reason += f"; did you mean {hint!r}?"
            return key, reason
    return None


def params_problem(model_name: str, params: dict[str, Any]) -> tuple[str, str] | None:
    """(param name, reason) for the first param `model_name` does not take or cannot use, else None."""
    takes = params_of(model_name)
    for key, value in params.items():
        if key not in takes:
            return unknown_param(model_name, {key: value})
        if (problem := takes[key].problem(value)) is not None:
            return key, f"{model_name}'s {key} is {problem}, not {value!r}"
    return None


def features_problem(model_name: str, shape: list[int] | tuple[int, ...]) -> str | None:
    """Why `model_name` cannot take features of this shape (one example's, without the batch), else None.
    Staging checks it before a machine is paid for; the agent's builders for a job staged before."""
    if model_name in BUILTIN_IMAGE_MODELS and len(shape) not in (2, 3):
        return (f"model {model_name} needs image features (height, width[, channels]), the data's are {list(shape)}; "
                "use mlp, or give the data an image shape (dataset.options.image_shape for TFRecords)")
    if model_name not in BUILTIN_PARAMS and len(shape) != 3:  # a keras.applications architecture
        return f"keras.applications.{model_name} needs image features (height, width, channels), the data's are {list(shape)}"
    return None


def with_defaults(model_name: str, params: dict[str, Any]) -> dict[str, Any]:
    """The params a built-in builds with: its defaults, overridden by the spec's."""
    return {**{k: p.default for k, p in BUILTIN_PARAMS[model_name].items()}, **params}
