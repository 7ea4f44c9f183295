"""torchvision's ShuffleNetV2 weights in this package's ShuffleNetV2 / AutoShuffleNetV2.

torchvision's `shufflenet_v2_x0_5` .. `x2_0` and `ShuffleNetV2(width=...,
stem="imagenet")` are the same network, layer for layer and pixel for pixel (the stride-2
layers pad as PyTorch: `common._pad`), so a state dict converts exactly. The names are
matched one by one, never by layer order: the down-sampling unit's two branches
interleave in `model.layers`, and an order-based copy put 17-18 modules of the same shape
into the wrong layer.
"""

from collections.abc import Mapping

import keras
import numpy as np

from keras_autoshuffle.applications import architecture as arch
from keras_autoshuffle.applications.architecture import REPEATS, V2_CONFIGS
from keras_autoshuffle.layers import RelaxedShuffle

# torchvision module -> (layer name, kind). Kinds: a dense or 1x1 / 3x3 conv kernel,
# a depthwise kernel, a BatchNorm, the classifier.
_BN = ("weight", "bias", "running_mean", "running_var")
# torchvision's branch2 (a Sequential) by index; 2 and 7 are ReLUs.
_BRANCH = {
    0: ("conv1", "conv"),
    1: ("bn1", "bn"),
    3: ("dwconv", "depthwise"),
    4: ("dwbn", "bn"),
    5: ("conv2", "conv"),
    6: ("bn2", "bn"),
}
# branch1 of a stage's first unit; 4 is a ReLU.
_LEFT = {
    0: ("left_dwconv", "depthwise"),
    1: ("left_dwbn", "bn"),
    2: ("left_conv", "conv"),
    3: ("left_bn", "bn"),
}
_PARAMETERS = {
    "conv": ("weight",),
    "depthwise": ("weight",),
    "bn": _BN,
    "dense": ("weight", "bias"),
}


def torchvision_modules(include_top=True):
    """{torchvision module name: (Keras layer name, kind)} for a ShuffleNetV2."""
    modules = {"conv1.0": (arch.STEM_CONV, "conv"), "conv1.1": (arch.STEM_BN, "bn")}
    for stage, units in enumerate(REPEATS, start=2):
        for unit in range(units):
            parts = {f"branch2.{k}": v for k, v in _BRANCH.items()}
            if unit == 0:
                parts.update({f"branch1.{k}": v for k, v in _LEFT.items()})
            for module, (part, kind) in parts.items():
                layer = arch.unit_layer(stage, unit + 1, part)
                modules[f"stage{stage}.{unit}.{module}"] = (layer, kind)
    modules["conv5.0"] = (arch.HEAD_CONV, "conv")
    modules["conv5.1"] = (arch.HEAD_BN, "bn")
    if include_top:
        modules["fc"] = (arch.PREDICTIONS, "dense")
    return modules


def _to_keras(value, kind, parameter):
    """A torchvision array in Keras's layout."""
    if kind == "conv":  # (out, in, kh, kw) -> (kh, kw, in, out)
        return value.transpose(2, 3, 1, 0)
    if kind == "depthwise":  # (channels, 1, kh, kw) -> (kh, kw, channels, 1)
        return value.transpose(2, 3, 0, 1)
    if kind == "dense" and parameter == "weight":  # (classes, features) -> (features, classes)
        return value.T
    return value


def _as_array(key, value):
    """`value` (NumPy, or anything with `.numpy()`, e.g. a torch tensor) as float32."""
    try:
        if hasattr(value, "detach"):  # a torch tensor: NumPy has no bfloat16
            value = value.detach().cpu()
            value = value.float() if value.is_floating_point() else value
        if hasattr(value, "numpy"):
            value = value.numpy()
        array = np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(
            f"`state_dict[{key!r}]` cannot be read as an array ({type(error).__name__}: "
            f"{error}). Received: {type(value).__name__}"
        ) from None
    if not (np.issubdtype(array.dtype, np.floating) or array.dtype.name == "bfloat16"):
        raise ValueError(
            f"`state_dict[{key!r}]` must hold floating-point numbers. Received: dtype={array.dtype}"
        )
    array = array.astype(np.float32)
    bad = ~np.isfinite(array)
    if key.endswith(".running_var"):  # the model would divide by sqrt(negative + eps): NaN
        bad |= array < 0
    if np.any(bad):
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        what = "a negative BatchNorm variance" if np.isfinite(array[index]) else "NaN or inf"
        raise ValueError(
            f"`state_dict[{key!r}]` holds {what} ({int(bad.sum())} of {array.size} values; "
            "a BatchNorm running variance must be finite and >= 0, every other value "
            f"finite). Received: {key}{list(index) if index else ''}={array[index].item()!r}"
        )
    return array


def _check_model(model):
    found = arch.describe(model)
    if found is None or found.family != "v2" or found.repeats != REPEATS:
        raise ValueError(
            "`model` must be a ShuffleNetV2 or AutoShuffleNetV2 from "
            "keras_autoshuffle.applications (torchvision's ShuffleNetV2 has stage repeats "
            f"{REPEATS}). Received: model={getattr(model, 'name', model)!r}"
        )
    names = {layer.name for layer in model.layers}
    if arch.STEM_POOL not in names:
        raise ValueError(
            "torchvision's ShuffleNetV2 has the ImageNet stem (a stride-2 conv and a max-pool); "
            "this model has the CIFAR stem, a different network. Build it with "
            f"stem='imagenet'. Received: model={model.name!r}"
        )
    if arch.pad_name(arch.STEM_CONV) not in names:
        raise ValueError(
            "This model pads its stride-2 layers with Keras's 'same' (built with "
            "padding='same', or by an older version of keras_autoshuffle): torchvision's "
            "weights would give other outputs. Build it with padding='torch' (the default). "
            f"Received: model={model.name!r}"
        )


def torchvision_width(state_dict):
    """The width (0.5 .. 2.0) of a torchvision ShuffleNetV2 state dict, from its stage-4
    channels; None when they match no width."""
    shape = np.shape(_as_array("conv5.0.weight", state_dict["conv5.0.weight"]))
    widths = {config[3]: width for width, config in V2_CONFIGS.items()}
    return widths.get(shape[1]) if len(shape) == 4 else None


def _check_width(model, state_dict):
    """Names both widths when the state dict is of another torchvision variant."""
    if "conv5.0.weight" not in state_dict:
        return
    channels = np.shape(_as_array("conv5.0.weight", state_dict["conv5.0.weight"]))
    ours = model.get_layer(arch.HEAD_CONV).get_weights()[0].shape
    if len(channels) == 4 and (channels[1], channels[0]) != (ours[2], ours[3]):
        theirs = torchvision_width(state_dict) or "unknown"
        mine = {c[3]: w for w, c in V2_CONFIGS.items()}.get(ours[2], "unknown")
        raise ValueError(
            f"The state dict is of torchvision's ShuffleNetV2 at width {theirs} (stage 4: "
            f"{channels[1]} channels), the model is width {mine} ({ours[2]} channels). "
            f"Build the model with width={theirs}. Received: conv5.0.weight of shape "
            f"{tuple(channels)}"
        )


def load_torchvision_weights(
    model: keras.Model, state_dict: Mapping[str, np.ndarray]
) -> keras.Model:
    """Loads torchvision ShuffleNetV2 weights into a ShuffleNetV2 / AutoShuffleNetV2.

    Every weight of `model` is assigned exactly once, by name; nothing is assigned
    unless the whole state dict matches. A learned model's relaxed shuffles are not in
    torchvision's state dict: they keep their initial matrices (start them at the manual
    shuffle with `shuffle_initializer="manual"`, and the relaxed net computes the
    pretrained manual one).

    Args:
        model: `ShuffleNetV2(width, stem="imagenet", ...)` or `AutoShuffleNetV2(...)`
            with torchvision's width; with `include_top=False` the state dict's
            classifier (`fc.*`) is left out, for fine-tuning with a new head.
        state_dict: a mapping of torchvision names (`conv1.0.weight`, ...) to arrays:
            NumPy, or anything with `.numpy()` (the `torch.load(...)` of a `.pth`).
            `num_batches_tracked` entries are ignored.

    Returns:
        `model`, with the weights assigned.

    Example:
        >>> model = ShuffleNetV2(width=1.0, stem="imagenet", classifier_activation=None)
        >>> load_torchvision_weights(model, torch.load("shufflenet_v2_x1.pth"))
    """
    if not hasattr(state_dict, "keys"):
        raise ValueError(
            "`state_dict` must be a mapping of torchvision parameter names to arrays. "
            f"Received: state_dict of type {type(state_dict).__name__}"
        )
    _check_model(model)
    include_top = arch.PREDICTIONS in {layer.name for layer in model.layers}
    modules = torchvision_modules(include_top)
    _check_keys(state_dict, modules, include_top)
    _check_width(model, state_dict)
    assignments = [
        (model.get_layer(name), _layer_values(model.get_layer(name), module, kind, state_dict))
        for module, (name, kind) in modules.items()
    ]
    assigned = {id(layer) for layer, _ in assignments}
    unassigned = [
        layer.name
        for layer in model.layers
        if layer.weights
        and layer.name.startswith(arch.OWN_PREFIXES)
        and id(layer) not in assigned
        and not isinstance(layer, RelaxedShuffle)
    ]
    if unassigned:
        raise ValueError(
            f"torchvision's ShuffleNetV2 has no weights for layers {unassigned[:5]} of this model."
        )
    for layer, values in assignments:
        layer.set_weights(values)
    return model


def _check_keys(state_dict, modules, include_top):
    """Names the keys missing from, and the keys foreign to, torchvision's state dict."""
    expected = [f"{m}.{p}" for m, (_, kind) in modules.items() for p in _PARAMETERS[kind]]
    given = [str(k) for k in state_dict.keys() if not str(k).endswith(".num_batches_tracked")]
    ignored = () if include_top else ("fc.weight", "fc.bias")
    missing = [k for k in expected if k not in state_dict]
    known = {*expected, *ignored}
    extra = [k for k in given if k not in known]
    if missing or extra:
        raise ValueError(
            "The state dict does not match torchvision's ShuffleNetV2. Missing keys "
            f"({len(missing)}): {missing[:5]}; unexpected keys ({len(extra)}): {extra[:5]}."
        )


def _layer_values(layer, module, kind, state_dict):
    """torchvision module `module`'s arrays in Keras's layout, checked against `layer`."""
    current = layer.get_weights()
    if len(current) != len(_PARAMETERS[kind]):
        raise ValueError(
            f"Layer {layer.name!r} has {len(current)} weights where torchvision's "
            f"{module} has {len(_PARAMETERS[kind])}."
        )
    values = []
    for parameter, old in zip(_PARAMETERS[kind], current, strict=True):
        key = f"{module}.{parameter}"
        value = _to_keras(_as_array(key, state_dict[key]), kind, parameter)
        if value.shape != old.shape:
            hint = ""
            if kind == "dense":
                hint = (
                    f" (the state dict has {value.shape[-1]} classes, the model "
                    f"{old.shape[-1]}: build it with classes={value.shape[-1]}, or with "
                    "include_top=False to leave the classifier out)"
                )
            raise ValueError(
                f"`state_dict[{key!r}]` does not fit layer {layer.name!r}{hint}: "
                f"it needs shape {old.shape} in Keras's layout. Received: shape "
                f"{value.shape} after conversion"
            )
        values.append(value)
    return values
