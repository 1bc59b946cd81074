"""precision_trial.set_compute_policy on real Keras layers: every layer but the output takes the policy,
and a model whose layers refuse it (an older Keras, a user's layer) is left as it was."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.tf


def _model(middle: Any) -> Any:
    import keras

    x = inp = keras.Input((3,))
    x = keras.layers.Dense(8, activation="relu")(x)
    x = middle(x)
    return keras.Model(inp, keras.layers.Dense(2, activation="softmax", name="probabilities")(x))


def test_every_layer_but_the_output_takes_the_policy_and_gives_it_back() -> None:
    import keras

    from agent.precision_trial import set_compute_policy

    model = _model(keras.layers.Dense(4))
    assert set_compute_policy(model, "mixed_bfloat16")
    assert [layer.dtype_policy.name for layer in model.layers] == ["mixed_bfloat16"] * 3 + ["float32"]
    assert model(keras.ops.ones((2, 3))).dtype == "float32"
    assert set_compute_policy(model, "float32")
    assert {layer.dtype_policy.name for layer in model.layers} == {"float32"}


def test_a_layer_that_refuses_the_policy_leaves_the_model_as_it_was() -> None:
    import keras

    from agent.precision_trial import set_compute_policy

    class Stubborn(keras.layers.Dense):  # type: ignore[misc]
        def _refuse(self, value: Any) -> None:
            raise AttributeError("can't set attribute")

        dtype_policy = property(keras.layers.Dense.dtype_policy.fget, _refuse)

    model = _model(Stubborn(4))
    assert not set_compute_policy(model, "mixed_bfloat16")
    assert {layer.dtype_policy.name for layer in model.layers} == {"float32"}
