"""The named weights registry: the builders (`list_models`), the published checkpoints by
name (`list_weights`, `get_weights`), and what a builder's `weights=` means.

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
