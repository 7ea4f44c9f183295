"""The presets: the weights registry's checkpoints as keras-hub presets, and the checks of
a preset folder before keras-hub loads it.

One registry: each entry of `applications.CHECKPOINTS` is a preset named as keras-hub
names its own (`shufflenet_v2_x1_0.imagenet` -> `shufflenet_v2_x1_0_imagenet`). The first
`from_preset(name)` builds it from the registry (`ShuffleNetV2(width, weights=entry.name)`:
download, hash check, conversion without torch, as `weights="imagenet"`), copies the
weights layer by layer into a `ShuffleNetImageClassifier` with the checkpoint's
evaluation transform and class names, and saves it with `save_to_preset` into Keras's
cache (`<cache>/models/<preset name>/`), atomically (two processes building it at once
keep the first one's folder); later calls load that folder.
"""

import json
import os
import re
from collections.abc import Callable
from typing import Any

import keras

from keras_autoshuffle import _atomic, _validation
from keras_autoshuffle._files import read_bounded
from keras_autoshuffle._keras_internals import PRESET_WEIGHTS_FILES
from keras_autoshuffle.applications import architecture, preprocessing
from keras_autoshuffle.applications.weights import registry

# The layout of the configs this package writes into a preset (`config.json`'s
# `preset_version`); a preset of a later layout is refused instead of misread. 2: the
# backbone's `stem`, `channels` and `repeats` (a fine-tuned net of any stem or size).
PRESET_VERSION = 2
# The layout of a config without `preset_version` (the first one).
FIRST_PRESET_VERSION = 1
# The class that `from_preset(name)` builds, found as keras-hub finds a preset's classes:
# by its registered name (its module imports this one).
CLASSIFIER = "keras_autoshuffle>ShuffleNetImageClassifier"
# torchvision's license, which its ImageNet weights are published under.
LICENSE = "BSD-3-Clause"
PACKAGE_PREFIX = "keras_autoshuffle>"
# The files of a preset keras-hub's `save_to_preset` writes, each a serialized object.
CONFIG_FILES = ("config.json", "task.json", "preprocessor.json", "image_converter.json")
WEIGHTS_FILE, TASK_WEIGHTS_FILE = PRESET_WEIGHTS_FILES
# The most bytes of a config file read (task.json holds the class names: a million short ones).
MAX_CONFIG_BYTES = 16 * 2**20
# The layers of keras-hub's `ImageClassifier` head (in `task.weights.h5`).
TASK_LAYERS = ("pooler", "output_dropout", "predictions")
# Keras's message when a saved variable's shape is not the layer's (Keras 3.15).
_SHAPE_MISMATCH = re.compile(
    r"name=(\w+).*?variable\.shape=(\([^)]*\)), Received: value\.shape=(\([^)]*\))", re.S
)


def check_preset_version(version: object, where: str) -> int:
    """`version` as an int; ValueError naming `where` unless it is a layout this package
    reads (`FIRST_PRESET_VERSION` to `PRESET_VERSION`)."""
    first, last = FIRST_PRESET_VERSION, PRESET_VERSION
    if not _validation.is_integer(version) or not first <= version <= last:
        raise ValueError(
            f"{where}: `preset_version` {version!r} is not one this keras-autoshuffle reads "
            f"({first} to {last}); the preset was written by a newer version: upgrade "
            f"keras-autoshuffle. Received: preset_version={version!r}"
        )
    return int(version)


def _entries() -> dict[str, registry.Checkpoint]:
    return {e.preset: e for e in map(registry.CHECKPOINTS.get, sorted(registry.CHECKPOINTS))}


def list_presets() -> dict[str, dict]:
    """The presets, as keras-hub's `presets` tables: {name: {"metadata": {...}}} with the
    description, parameter count, accuracy as torchvision reports it, license, source."""
    return {
        name: {
            "metadata": {
                "description": (
                    f"ShuffleNet v2 {entry.width}x trained on {entry.dataset} by torchvision, "
                    f"evaluated at {entry.crop_size}x{entry.crop_size} (shorter side "
                    f"resized to {entry.resize_size}, centre crop)."
                ),
                "params": entry.num_params,
                "path": "shufflenet",
                "metrics": entry.metrics,
                "license": LICENSE,
                "source": entry.url,
                "weights": entry.name,
            }
        }
        for name, entry in _entries().items()
    }


def preset_folder(preset: str | os.PathLike) -> str:
    """The folder (or keras-hub handle) to load for `preset`: a preset name is built from
    the registry once (`build_preset`); anything else is returned as it is."""
    entry = _entries().get(preset) if isinstance(preset, str) else None
    return build_preset(entry) if entry else os.fspath(preset)


def build_preset(entry: registry.Checkpoint) -> str:
    """The cached preset folder of registry `entry`, built and saved on the first call."""
    folder = os.path.join(registry.cache_dir(), registry.CACHE_SUBDIR, entry.preset)
    if not _is_built(folder):

        def write(partial):
            _classifier(entry).save_to_preset(partial)

        _atomic.write_shared(folder, write, _is_built)
    return folder


def _is_built(folder):
    """Whether `folder` holds a whole preset (another process may have built it first)."""
    if not os.path.isfile(os.path.join(folder, TASK_WEIGHTS_FILE)):
        return False
    check_folder(folder)
    return True


def _classifier(entry):
    """The registry checkpoint `entry` as a `ShuffleNetImageClassifier`, preprocessor and
    class names included: the weights of `ShuffleNetV2(weights=entry.name)`, by layer."""
    from keras_autoshuffle.applications import ShuffleNetV2

    source = ShuffleNetV2(
        entry.width,
        weights=entry.name,
        classes=entry.classes,
        classifier_activation=None,
        stem="imagenet",
        input_shape=(None, None, 3),
    )
    return classifier_from_model(
        source,
        entry.width,
        entry.class_names(),
        entry.crop_size,
        entry.resize_size,
        mean=entry.mean,
        std=entry.std,
    )


def _layout(model, width):
    """The `ShuffleNetBackbone` arguments of an `applications` ShuffleNet v2 `model` of
    `width`: its stem and padding, and its channels and repeats where they are not the
    width's."""
    described = architecture.describe(model)
    if described is None or described.family != "v2":
        raise ValueError(
            "The model is not an `applications` ShuffleNet v2 (its layers are not named as "
            f"applications/architecture.py names them). Received: model={model.name!r}"
        )
    names = {layer.name for layer in model.layers}
    stem = "imagenet" if architecture.IMAGENET_STEM[-1] in names else "cifar"
    # "torch" padding puts a ZeroPadding2D before every stride-2 layer; "same" none.
    torch_pad = architecture.unit_layer(2, 1, architecture.pad_name("dwconv"))
    channels = (
        model.get_layer(architecture.STEM_CONV).filters,
        *(model.get_layer(name).output.shape[-1] for name in described.stage_ends()),
        model.get_layer(architecture.HEAD_CONV).filters,
    )
    return dict(
        stem=stem,
        padding="torch" if torch_pad in names else "same",
        channels=None if channels == architecture.V2_CONFIGS.get(width) else channels,
        repeats=None if described.repeats == architecture.REPEATS else described.repeats,
    )


def classifier_from_model(
    model: keras.Model,
    width: float,
    class_names: list[str],
    image_size: int,
    resize_size: int | None = None,
    mean: tuple[float, ...] = architecture.IMAGENET_MEAN,
    std: tuple[float, ...] = architecture.IMAGENET_STD,
) -> keras.Model:
    """An `applications` ShuffleNet v2 classifier (`include_top=True`, manual shuffles) as
    a `ShuffleNetImageClassifier`: the same weights, layer by layer, its logits (the
    Dense layer without `model`'s softmax), `class_names`, and a converter of
    torchvision's evaluation transform at `image_size` (resized to `resize_size` first,
    default 256/224 of it; normalised by `mean` and `std`, on pixels in [0, 1]).

    `width` is the one the config records; the model's channels are kept where they are
    not the width's (a small net).

    Raises:
        ValueError: `model` is not such a ShuffleNet v2 (learned shuffles, layers the
            classifier lacks).
    """
    classifier_cls = keras.saving.get_registered_object(CLASSIFIER)
    preprocessor_cls = classifier_cls.preprocessor_cls
    scale, offset = preprocessing.scale_offset(mean, std)
    converter = preprocessor_cls.image_converter_cls(
        image_size=(image_size, image_size),
        resize_size=resize_size,
        scale=list(scale),
        offset=list(offset),
    )
    backbone = classifier_cls.backbone_cls(width, **_layout(model, width))
    classifier = classifier_cls(
        backbone, len(class_names), preprocessor_cls(converter), class_names=list(class_names)
    )
    copied = [layer for layer in classifier.backbone.layers if layer.weights]
    for layer in copied + [classifier.output_dense]:
        layer.set_weights(model.get_layer(layer.name).get_weights())
    left = {layer.name for layer in model.layers if layer.weights}
    left -= {layer.name for layer in copied + [classifier.output_dense]}
    if left:  # weights the classifier has no place for would be lost silently
        raise ValueError(
            "The model has layers with weights that a ShuffleNetImageClassifier lacks "
            f"(learned shuffles?). Received: layers {sorted(left)[:5]}"
        )
    return classifier


def save_classifier(classifier: keras.Model, folder: str | os.PathLike) -> str:
    """`classifier.save_to_preset` into `folder` atomically (a killed process leaves the
    old folder or the new one, never a mix); returns the folder."""
    return _atomic.write_atomically(folder, classifier.save_to_preset)


def _read_config(folder, name):
    """The JSON of `folder/name`, its class checked to be this package's; None if absent."""
    path = os.path.join(folder, name)
    if not os.path.lexists(path):
        return None
    if not os.path.isfile(path):  # a FIFO would block the read
        raise ValueError(f"{path} is not a regular file: not a keras-hub preset config.")
    try:
        config = json.loads(read_bounded(path, MAX_CONFIG_BYTES))
        registered = config["registered_name"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as error:
        raise ValueError(
            f"{path} is not a keras-hub preset config ({type(error).__name__}: {error})."
        ) from None
    if not str(registered).startswith(PACKAGE_PREFIX):
        raise ValueError(
            f"{path}: `registered_name` names a class that is not keras_autoshuffle's; this "
            f"package loads only its own. Received: registered_name={registered!r}"
        )
    return config


def _arguments(configs, folder, name):
    """The `config` object (the class's arguments) of `folder/name`'s JSON, named if absent."""
    arguments = configs[name].get("config")
    if not isinstance(arguments, dict):
        raise ValueError(
            f"{os.path.join(folder, name)}: `config` must be an object of the class's "
            f"arguments. Received: config={arguments!r:.100}"
        )
    return arguments


def check_folder(folder: str, task: bool = True) -> None:
    """Refuses a local preset folder that is not a whole preset of this package, with a
    ValueError naming the file and the field: a missing config or weights file, a class
    that is not this package's, a newer layout, class names of another count. Remote
    handles (`kaggle://`, `hf://`) are left to keras-hub. `task=False`: the backbone's
    files only (a backbone, or a classifier with a new head)."""
    if "://" in folder:
        return
    if not os.path.isdir(folder):
        raise ValueError(
            f"`preset` must be a preset name ({sorted(_entries())}) or a preset folder. "
            f"Received: preset={folder!r}"
        )
    configs = {name: _read_config(folder, name) for name in CONFIG_FILES}
    needed = ["config.json", WEIGHTS_FILE]
    if configs["task.json"] is not None and task:
        needed.append(TASK_WEIGHTS_FILE)
    for name in needed:
        if not os.path.isfile(os.path.join(folder, name)):
            raise ValueError(f"{os.path.join(folder, name)} is missing: not a whole preset.")
    path = os.path.join(folder, "config.json")
    version = _arguments(configs, folder, "config.json").get("preset_version")
    check_preset_version(FIRST_PRESET_VERSION if version is None else version, path)
    if task and configs["task.json"] is not None:
        task_config = _arguments(configs, folder, "task.json")
        names, count = task_config.get("class_names"), task_config.get("num_classes")
        if names is not None and not (
            isinstance(names, list) and all(isinstance(name, str) for name in names)
        ):
            raise ValueError(
                f"{os.path.join(folder, 'task.json')}: `class_names` must be a list of "
                f"strings. Received: class_names={names!r:.100}"
            )
        if names is not None and len(names) != count:
            raise ValueError(
                f"{os.path.join(folder, 'task.json')}: `class_names` has {len(names)} names "
                f"but `num_classes` is {count}. Received: {len(names)} class_names"
            )


def load_checked(folder: str, load: Callable, load_weights: bool, task: bool, **kwargs: Any) -> Any:
    """`load(folder, load_weights, **kwargs)` (a keras-hub `from_preset`) after
    `check_folder(folder, task)`; a weights file that does not fit the config (Keras's
    shape mismatch) is named, with the first layer that does not fit."""
    check_folder(folder, task)
    try:
        return load(folder, load_weights, **kwargs)
    except ValueError as error:
        found = _SHAPE_MISMATCH.search(str(error))
        if "://" in folder or found is None:
            raise
        layer, wanted, saved = found.groups()
        path = os.path.join(folder, TASK_WEIGHTS_FILE if layer in TASK_LAYERS else WEIGHTS_FILE)
        raise ValueError(
            f"{path} does not fit the net of config.json / task.json (weights of another width "
            f"or class count?): layer {layer!r} has shape {wanted}. Received: {saved}"
        ) from None
