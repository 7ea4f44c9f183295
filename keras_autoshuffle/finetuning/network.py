"""The fine-tuned network: ShuffleNet v2 with a new head on a pretrained base, and what each
phase of the recipe trains.

The new head is the builder's own (`predictions`, a Dense with softmax), so the network is
an `applications` ShuffleNet v2 like any other: it folds, exports and loads as they do.
"""

import hashlib
import os

import keras

from keras_autoshuffle._files import sha256_of
from keras_autoshuffle.applications import ShuffleNetV2, architecture

# The classifier's layer: the only one trained in the head phase, the only one not copied
# from the starting weights.
HEAD = "predictions"
# What the phases freeze: the head phase everything but the head; the whole-net phase the
# BatchNormalization layers of a pretrained base (kept in inference mode, with the
# statistics of the data they were trained on, as keras.io's transfer-learning guide does:
# a small data set's batch statistics would overwrite them).
FROZEN_BASE, FROZEN_BATCH_NORM = "base", "batch_norm"
MAX_WEIGHTS_BYTES = 1 << 30


def weights_source(weights: str | os.PathLike | None) -> str | None:
    """The record of the starting weights in a run's settings: "imagenet", None, a preset
    name, or "sha256:<hex>" of a `.keras` file or of a preset folder's files (a rerun
    with other weights is refused by it).

    Raises:
        ValueError: `weights` is none of these, or names no readable `.keras` file or
            whole preset folder (`hub.presets.check_folder`: the file and field named).
    """
    if weights is None or weights == "imagenet":
        return weights
    if not isinstance(weights, (str, os.PathLike)):
        raise ValueError(
            '`weights` must be "imagenet", None, a preset name or folder, or the path of a '
            f".keras model. Received: weights={weights!r}"
        )
    path = os.fspath(weights)
    if os.path.isdir(path):  # a folder before a name, as keras-hub's `from_preset`
        return _preset_digest(path)
    if not path.endswith(".keras") and path in _preset_names():
        return path
    if not path.endswith(".keras"):
        raise ValueError(
            "`weights` must be a preset name (" + ", ".join(_preset_names()) + "), a preset "
            "folder (e.g. the preset/ of autoshuffle-finetune), the path of a .keras model "
            '(e.g. the model.keras of autoshuffle-train or autoshuffle-finetune), "imagenet" '
            f"or None. Received: weights={path!r}"
        )
    if not os.path.isfile(path):
        raise ValueError(f"The `weights` file does not exist. Received: weights={path!r}")
    _check_size(os.path.getsize(path), path)
    return f"sha256:{sha256_of(path)}"


def _preset_names():
    from keras_autoshuffle import hub

    return sorted(hub.list_presets())


def is_preset(weights: object) -> bool:
    """Whether `weights` names a preset: a registry preset's name or a folder."""
    if not isinstance(weights, (str, os.PathLike)) or weights == "imagenet":
        return False
    path = os.fspath(weights)
    return os.path.isdir(path) or (not path.endswith(".keras") and path in _preset_names())


def _check_size(size, path):
    if size > MAX_WEIGHTS_BYTES:
        raise ValueError(
            f"The `weights` file is {size} bytes, more than any ShuffleNet v2 "
            f"({MAX_WEIGHTS_BYTES} at most). Received: weights={path!r}"
        )


def _preset_digest(folder):
    """ "sha256:<hex>" of the preset folder's files (names and contents), after
    `check_folder` refused a folder that is not a whole preset of this package."""
    from keras_autoshuffle import hub

    hub.presets.check_folder(folder)
    names = sorted(n for n in os.listdir(folder) if os.path.isfile(os.path.join(folder, n)))
    _check_size(sum(os.path.getsize(os.path.join(folder, n)) for n in names), folder)
    lines = "".join(f"{name} {sha256_of(os.path.join(folder, name))}\n" for name in names)
    return "sha256:" + hashlib.sha256(lines.encode("utf-8")).hexdigest()


def _preset_backbone(weights, width):
    """The `ShuffleNetBackbone` of preset `weights` (a name is built from the registry
    once, as `from_preset` does), the whole folder checked first; refused unless it is a
    ShuffleNet v2 of `width`."""
    from keras_autoshuffle import hub

    folder = hub.presets.preset_folder(os.fspath(weights))
    hub.presets.check_folder(folder)  # the classifier's files too: its labels' count
    backbone = hub.ShuffleNetBackbone.from_preset(folder)
    if backbone.family != "v2" or backbone.width != width:
        raise ValueError(
            f"{os.path.join(folder, 'config.json')}: the preset is a {backbone.width}x "
            f"ShuffleNet {backbone.family}; the run fine-tunes a {width}x ShuffleNet v2. "
            f"Pass the preset's width. Received: width={width}, "
            f"weights={os.fspath(weights)!r}"
        )
    return backbone


def check_weights(weights: str | os.PathLike | None, width: float, image_size: int) -> None:
    """Makes sure the run can start from `weights` before any image is read: builds the
    ImageNet base (its weights downloaded and converted now, or their download fails now)
    or the starting network of a `.keras` file or preset (`build_classifier`, two
    classes: one of another width or architecture is refused by name).

    Raises:
        ValueError: a `.keras` file or preset that does not fit (as `build_classifier`).
        OSError: the ImageNet weights cannot be downloaded (the URL and the way to get
            them by hand named).
    """
    if weights == "imagenet":
        # The base alone downloads, converts and loads the checkpoint (every refusal is
        # its); the classifier around it and the copy added only time (a phase builds it).
        _imagenet_base(width, (image_size, image_size, 3))
    elif weights is not None:
        build_classifier(width, 2, image_size, weights)


def build_classifier(
    width: float,
    classes: int,
    image_size: int,
    weights: str | os.PathLike | None,
    with_head: bool = False,
) -> keras.Model:
    """ShuffleNet v2 with manual shuffles and a new `classes`-way head, its other layers
    from `weights`.

    Args:
        width: 0.5, 1.0, 1.5 or 2.0.
        classes: the head's classes.
        image_size: the input side (square RGB images, normalised as ImageNet's).
        weights: "imagenet" (torchvision's checkpoint, the ImageNet stem), a preset name
            (`hub.list_presets()`) or folder of a ShuffleNet v2 of this width (its backbone;
            its head is replaced), the path of a `.keras` ShuffleNet v2 of this width (any
            head: it is replaced; its stem is kept), or None (random weights, the stem
            `stem="auto"` picks).
        with_head: also the head from the `.keras` file (a phase resumed from the last).

    Returns:
        The uncompiled model, every layer trainable.

    Raises:
        ValueError: a `.keras` file or preset that is not a manual-shuffle ShuffleNet v2
            of `width` (the layer and shapes, or the preset's file and field, named).
    """
    shape = (image_size, image_size, 3)
    if weights is None:
        return ShuffleNetV2(width, input_shape=shape, classes=classes)
    if weights == "imagenet":
        stem = "imagenet"
        source = _imagenet_base(width, shape)
    elif is_preset(weights):
        source = _preset_backbone(weights, width)
        stem = source.stem
    else:
        path = os.fspath(weights)
        source = keras.saving.load_model(path, compile=False, safe_mode=True)
        layers = {layer.name for layer in source.layers}
        stem = "imagenet" if architecture.IMAGENET_STEM[-1] in layers else "cifar"
    model = ShuffleNetV2(width, input_shape=shape, classes=classes, stem=stem)
    copy_weights(source, model, weights, width, with_head)
    return model


def _imagenet_base(width, shape):
    """torchvision's ImageNet ShuffleNet v2 of `width` without its classifier."""
    return ShuffleNetV2(
        width, include_top=False, weights="imagenet", input_shape=shape, stem="imagenet"
    )


def copy_weights(
    source: keras.Model,
    model: keras.Model,
    weights: str | os.PathLike | None,
    width: float,
    with_head: bool = False,
) -> None:
    """Assigns every variable of `model` (but the head's, unless `with_head`) from the
    variable of the same path in `source` (`stem_conv/kernel`, ...), checking the layer
    types and shapes."""
    layers = {layer.name: layer for layer in source.layers}
    variables = {v.path: v for v in source.weights}
    for layer in model.layers:
        if (layer.name == HEAD and not with_head) or not layer.weights:
            continue
        other = layers.get(layer.name)
        if other is None or type(other) is not type(layer):
            found = "no such layer" if other is None else f"a {type(other).__name__}"
            raise ValueError(
                f"The `weights` model is not a ShuffleNet v2 with manual shuffles: its layer "
                f"{layer.name!r} is {found}, where the network has a {type(layer).__name__}. "
                f"Received: weights={os.fspath(weights)!r}"
            )
        for variable in layer.weights:
            given = variables.get(variable.path)
            if given is None or tuple(given.shape) != tuple(variable.shape):
                shape = None if given is None else tuple(given.shape)
                raise ValueError(
                    f"The `weights` model is not a ShuffleNet v2 of width {width}: "
                    f"{variable.path} has shape {shape}, the network needs "
                    f"{tuple(variable.shape)}. Pass the width it was trained with. "
                    f"Received: width={width}, weights={os.fspath(weights)!r}"
                )
            variable.assign(given)


def freeze(model: keras.Model, frozen: str | None) -> keras.Model:
    """Sets what trains: `FROZEN_BASE` the head only; `FROZEN_BATCH_NORM` every layer but
    the BatchNormalization ones (in inference mode, as a frozen BatchNormalization is in
    Keras 3); None every layer. Returns `model`."""
    for layer in model.layers:
        if frozen == FROZEN_BASE:
            layer.trainable = layer.name == HEAD
        elif frozen == FROZEN_BATCH_NORM:
            layer.trainable = not isinstance(layer, keras.layers.BatchNormalization)
        else:
            layer.trainable = True
    return model
