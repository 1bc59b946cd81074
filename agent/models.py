"""The model: a built-in (mlp, cnn, resnet), a keras.applications architecture, or the user's own.

Every builder returns an uncompiled keras.Model whose output is class probabilities in float32:
under a mixed policy the last layer is pinned to float32 so softmax and the loss keep full range.
The same builder is called again under float32 for export, so a builder must be deterministic in
its architecture (weights are copied across by position).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from typing import Any

from trainjobs import storage
from trainjobs.job_paths import UPLOADS
from trainjobs.model_params import features_problem
from trainjobs.spec import ModelSpec
from agent.builtin_models import BUILTIN_BUILDERS
from agent.model_inputs import Builder, ModelError, ModelInputs

__all__ = ["Builder", "ModelError", "ModelInputs", "build", "builder_for"]

# keras.applications refuse inputs below these sides (weights=None still checks); default 32.
_APPLICATION_MIN_SIDE = {"InceptionV3": 75, "InceptionResNetV2": 75, "Xception": 71}


def builder_for(model: ModelSpec, user_model_dir: Path) -> Builder:
    if model.module is not None:
        return _user_builder(model.module, model.function, user_model_dir)
    assert model.name is not None
    if (builtin := BUILTIN_BUILDERS.get(model.name)) is not None:
        return builtin
    return _application_builder(model.name)


def build(builder: Builder, inputs: ModelInputs) -> Any:
    import keras

    model = builder(inputs)
    if not isinstance(model, keras.Model):
        raise ModelError(f"the model function returned {type(model).__name__}, not a keras.Model")
    outputs = getattr(model, "outputs", None)
    if outputs and len(outputs) == 1 and outputs[0].dtype != "float32":
        # Softmax in float16/bfloat16 loses the small probabilities the loss needs.
        probs = keras.layers.Activation("linear", dtype="float32", name="float32_output")(model.outputs[0])
        model = keras.Model(model.inputs, probs, name=model.name)
    return model


def _application_builder(name: str) -> Builder:
    import keras

    constructor = getattr(keras.applications, name, None)
    if constructor is None or not callable(constructor):
        raise ModelError(f"unknown model {name!r}: not a keras.applications architecture")

    def build_application(inputs: ModelInputs) -> Any:
        params = dict(inputs.params)
        dropout = float(params.pop("dropout", 0.0))
        if problem := features_problem(name, inputs.input_shape):
            raise ModelError(problem)
        h, w, c = inputs.input_shape
        x = inp = keras.Input(inputs.input_shape)
        side = _APPLICATION_MIN_SIDE.get(name, 32)
        if min(h, w) < side:
            # Too small for the architecture's downsampling: upsample rather than refuse.
            h, w = max(h, side), max(w, side)
            x = keras.layers.Resizing(h, w, name="resize_to_min_side")(x)
        if c != 3:
            # Several applications assume RGB (EfficientNet's built-in normalization, for one).
            x = keras.layers.Conv2D(3, 1, name="to_three_channels")(x)
        try:
            backbone = constructor(include_top=False, weights=None, input_shape=(h, w, 3), pooling="avg", **params)
        except (TypeError, ValueError) as exc:
            raise ModelError(f"keras.applications.{name} refused its arguments: {exc}") from exc
        x = backbone(x)
        if dropout:
            x = keras.layers.Dropout(dropout)(x)
        return keras.Model(inp, inputs.head(x), name=name)

    return build_application


def _user_builder(module: str, function: str, download_dir: Path) -> Builder:
    path = local_code_path(module, download_dir, "model module")
    try:
        loaded = _import_path(path)
    except Exception as exc:
        raise ModelError(f"could not import model module {module}: {type(exc).__name__}: {exc}") from exc
    fn = getattr(loaded, function, None)
    if not callable(fn):
        raise ModelError(f"model module {module} has no function {function!r}")

    takes_task = _takes(fn, "task")

    def build_user_model(inputs: ModelInputs) -> Any:
        if inputs.task != "classification" and not takes_task:
            raise ModelError(f"{module}:{function} takes (input_shape, num_classes, params): for task {inputs.task} "
                             "it must also take task= (and build num_outputs outputs: README, Your model)")
        try:
            if not takes_task:
                return fn(inputs.input_shape, inputs.num_classes, dict(inputs.params))
            model = fn(inputs.input_shape, inputs.num_classes, dict(inputs.params), task=inputs.task)
        except ModelError:
            raise
        except Exception as exc:
            raise ModelError(f"{module}:{function} raised {type(exc).__name__}: {exc}") from exc
        return model  # a regression's learns the standardised target; the export puts back the units

    return build_user_model


def _takes(fn: Any, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


# Where POST /v1/modules stores code (trainjobs/uploads.py): uploads/<project>/<sha256 of the file>/<file>.
_UPLOADED = re.compile(rf"gs://[^/]+/{re.escape(UPLOADS)}/[0-9a-f-]{{36}}/(?P<sha256>[0-9a-f]{{64}})/[^/]+")


def local_code_path(module: str, download_dir: Path, what: str) -> Path:
    """The user's code (a model module, a program's source) on this machine: an upload downloaded and
    checked against the sha256 its address names, another gs:// file or folder downloaded, a host path
    as it is. `what` names it in errors."""
    if module.startswith("gs://"):
        name = module.rstrip("/").rsplit("/", 1)[-1]
        if uploaded := _UPLOADED.fullmatch(module):
            download_dir.mkdir(parents=True, exist_ok=True)
            storage.blob(module).download_to_filename(str(download_dir / name))
            _check_content(module, download_dir / name, uploaded["sha256"], what)
        elif module.endswith(ARCHIVES_AND_FILES):
            download_dir.mkdir(parents=True, exist_ok=True)
            storage.blob(module).download_to_filename(str(download_dir / name))
        elif not storage.download_prefix(module.rstrip("/") + "/", download_dir / name):
            raise ModelError(f"{what} {module} not found")
        return download_dir / name
    if module.startswith("upload:"):
        raise ModelError(f"{what} {module} was not resolved to a gs:// URI before launch")
    path = Path(module.removeprefix("file://")).expanduser()
    if not path.exists():
        raise ModelError(f"{what} {module} not found on this machine")
    return path.resolve()


ARCHIVES_AND_FILES = (".py", ".zip", ".tar.gz", ".tgz")


def _check_content(module: str, path: Path, sha256: str, what: str = "model module") -> None:
    """An upload's key names the sha256 of the bytes the user sent. The key comes from the job's spec,
    which the worker wrote from the job's row; the object is in a bucket other code writes too (a
    storage guard bypass once let one project's job overwrite another's module). Code whose bytes
    are not the ones uploaded is not run."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != sha256:
        path.unlink()
        raise ModelError(f"{what} {module} is not the file that was uploaded: its bytes hash to sha256 "
                         f"{digest.hexdigest()}, not the {sha256} its address names; it was changed in storage "
                         "after the upload, and is not run")


def _import_path(path: Path) -> Any:
    if path.is_dir():
        # A package: import it by its directory name, so its relative imports work.
        if not (path / "__init__.py").exists():
            raise ModelError(f"{path} is a directory without __init__.py")
        sys.path.insert(0, str(path.parent))
        return importlib.import_module(path.name)
    spec = importlib.util.spec_from_file_location(f"trainjobs_user_model_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ModelError(f"{path} is not an importable Python file")
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loaded
    spec.loader.exec_module(loaded)
    return loaded
