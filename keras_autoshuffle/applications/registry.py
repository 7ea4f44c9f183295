"""The named weights registry: the builders (`list_models`), the published checkpoints by
name (`list_weights`, `get_weights`), what a builder's `weights=` means, and the evaluation
transform by width (`imagenet_preprocessing`).

An entry's name is `<model>_<width>.<dataset>` (`shufflenet_v2_x1_0.imagenet`, torchvision's
builder names); the entry is the `Checkpoint` of `applications.CHECKPOINTS` (read at each
call, so a test that replaces an entry there is seen here too).

Example:
    >>> from keras_autoshuffle import applications
    >>> applications.list_weights()
    ['shufflenet_v2_x0_5.imagenet', 'shufflenet_v2_x1_0.imagenet', ...]
    >>> entry = applications.get_weights("shufflenet_v2_x1_0.imagenet")
    >>> entry.acc1, entry.num_params, entry.url
    (69.362, 2278604, 'https://download.pytorch.org/models/shufflenetv2_x1-5666bf0f80.pth')
    >>> model = applications.ShuffleNetV2(1.0, weights=entry.name)
    >>> preprocess = entry.preprocessing()
"""

import keras

from keras_autoshuffle import _validation
from keras_autoshuffle.applications.checkpoints import CHECKPOINTS, Checkpoint

# The public builders and the network family each builds (a checkpoint's `builder` is the
# manual-shuffle builder of its family; the learned-shuffle one loads its weights too).
MODELS = {
    "ShuffleNetV1": "ShuffleNetV1",
    "ShuffleNetV2": "ShuffleNetV2",
    "AutoShuffleNetV1": "ShuffleNetV1",
    "AutoShuffleNetV2": "ShuffleNetV2",
}
# What `weights=` names for "the checkpoint of the model's width".
IMAGENET = "imagenet"


def list_models(pretrained: bool = False) -> list[str]:
    """The builders of `applications`, by name (as timm's `list_models`).

    Args:
        pretrained: only the builders that published weights exist for
            (`list_weights(model)` is not empty).

    Returns:
        The builder names, sorted (e.g. `"ShuffleNetV2"`: `applications.ShuffleNetV2`).
    """
    if not isinstance(pretrained, bool):
        raise ValueError(f"`pretrained` must be True or False. Received: pretrained={pretrained!r}")
    names = sorted(MODELS)
    return [name for name in names if list_weights(name)] if pretrained else names


def list_weights(model: str | None = None) -> list[str]:
    """The names of the published weights (`weights=` of a builder), by width.

    Args:
        model: a builder name (`list_models()`) to list only the weights it loads, or None
            for all.

    Returns:
        The entry names, e.g. `["shufflenet_v2_x0_5.imagenet", ...]`; empty for a builder
            with none (ShuffleNet v1).

    Raises:
        ValueError: `model` is not a builder name.
    """
    if model is not None and model not in MODELS:
        raise ValueError(
            f"`model` must be None or a builder name, one of {sorted(MODELS)}. "
            f"Received: model={model!r}"
        )
    entries = [CHECKPOINTS[width] for width in sorted(CHECKPOINTS)]
    return [e.name for e in entries if model is None or e.builder == MODELS[model]]


def get_weights(name: str) -> Checkpoint:
    """The registry entry of the published weights `name`.

    Args:
        name: an entry name of `list_weights()`, e.g. `"shufflenet_v2_x1_0.imagenet"`.

    Returns:
        Its `Checkpoint`: URL, SHA-256, file name and size, class count and names, the
            evaluation transform (`preprocessing()`), accuracy (`metrics`), parameter count
            and multiply-adds.

    Raises:
        ValueError: no entry has that name; the message lists the names.
    """
    for entry in CHECKPOINTS.values():
        if isinstance(name, str) and entry.name == name:
            return entry
    raise ValueError(
        f"No published weights are named {name!r}. The names are {list_weights()} "
        f"(`applications.list_weights()`). Received: name={name!r}"
    )


def is_pretrained(weights: object) -> bool:
    """Whether a builder's `weights` asks for published weights: "imagenet" or an entry
    name (which wins over a file of the same name)."""
    return isinstance(weights, str) and (weights == IMAGENET or weights in list_weights())


def imagenet_preprocessing(width: float = 1.0, data_format: str | None = None) -> keras.Sequential:
    """torchvision's evaluation transform for the ImageNet weights of `ShuffleNetV2(width)`,
    as a `keras.Sequential`: `ToRGB`, `ResizeCenterCrop` (the checkpoint's resize and crop
    sizes), `Rescaling(1 / 255)`, `Normalization` with ImageNet's mean and variance:
    `evaluation_preprocessing(crop_size, resize_size)` of the checkpoint, named after it.

    Built-in layers and this module's only (no Lambda): it saves and loads with
    `safe_mode=True`, and runs in a `tf.data` pipeline or as the first part of a model.
    It is built when made, for batches of any size, sides and channel count, so no call
    (a wrong one included) fixes the shape later calls must have.

    Limits (each a ValueError naming `images` and the shape received, before any work; in
    a `tf.data` map with sides unknown when traced, an InvalidArgumentError when run):
    a batch (rank 4) only, so a single image needs a batch axis (`image[None]`); 1 to 4
    channels, made RGB as PIL's `convert("RGB")` does (gray repeated, alpha dropped); at
    least 1 pixel per side and a longer side at most 100 times the shorter
    (`MAX_ASPECT_RATIO`: resizing the shorter side to 256 would make a 1 x 100000 image
    25.6 million pixels long). Inputs are cast to float32 by the model's input, as any
    Keras model's (bools become 0 and 1). Pixel values are not checked: NaN or inf pixels
    give NaN or inf outputs, and images in [0, 1] rather than [0, 255] are silently wrong.

    Args:
        width: a key of `applications.CHECKPOINTS` (0.5, 1.0, 1.5, 2.0).
        data_format: "channels_last" or "channels_first" (default: Keras's).

    Returns:
        A `keras.Sequential` from pixel values in [0, 255], a batch of any size
            (batch, height, width, channels), to the model's input (batch, 224, 224, 3).

    Example:
        >>> preprocess = applications.imagenet_preprocessing(1.0)
        >>> model = applications.ShuffleNetV2(1.0, weights="imagenet")
        >>> image = keras.utils.load_img("cat.jpg")  # needs Pillow
        >>> batch = keras.ops.expand_dims(keras.utils.img_to_array(image), 0)
        >>> applications.decode_predictions(model.predict(preprocess(batch)), top=3)
    """
    return CHECKPOINTS[_validation.choice(width, tuple(CHECKPOINTS), "width")].preprocessing(
        data_format
    )
