"""`ShuffleNetBackbone`: ShuffleNet v1 / v2 as a keras-hub `FeaturePyramidBackbone`.

The layers are the keras.applications-style builders' (`applications.AutoShuffleNetV2` /
`AutoShuffleNetV1` without the classifier), so a backbone has the same layer names as
`applications.ShuffleNetV2(include_top=False)` and the package's folding, export and
torchvision conversion read it alike; nothing of the architecture is written here.
"""

import functools
import inspect
import os
from collections.abc import Sequence
from typing import Any, Literal

import keras
from keras_hub.models import FeaturePyramidBackbone

from keras_autoshuffle import _validation
from keras_autoshuffle._dtype_policy import global_dtype_policy
from keras_autoshuffle.applications import common, shufflenet_v1, shufflenet_v2
from keras_autoshuffle.applications.shufflenet_v1 import AutoShuffleNetV1
from keras_autoshuffle.applications.shufflenet_v2 import AutoShuffleNetV2
from keras_autoshuffle.hub import presets
from keras_autoshuffle.hub.presets import FIRST_PRESET_VERSION, PRESET_VERSION

FAMILIES = ("v1", "v2")
# The pyramid's levels: P2 after the stem's pool, P3-P5 at the ends of stages 2-4.
PYRAMID_LEVELS = common.PYRAMID_LEVELS
# The stems a backbone takes (`applications`' "auto" picks one by the input size; a
# backbone's input size is open, so its config names the stem).
STEMS = ("imagenet", "cifar")


def _build(family, width, groups, shuffle, image_shape, padding, stem, channels, repeats):
    """The builder's feature extractor (no classifier): the given stem, manual or learned
    shuffles (learned ones start at the manual shuffle, the pretrained routing), the
    width's channels and repeats unless given (the private builders take them; the public
    ones' defaults otherwise)."""
    public, private = AutoShuffleNetV2, shufflenet_v2._shufflenet_v2
    if family == "v1":
        public = AutoShuffleNetV1
        private = functools.partial(shufflenet_v1._shufflenet_v1, groups=groups)
    defaults = inspect.signature(public).parameters
    options = {name: p.default for name, p in defaults.items() if name not in ("width", "groups")}
    options.update(
        include_top=False,
        input_shape=tuple(image_shape),
        stem=stem,
        padding=padding,
        shuffle=shuffle,
        shuffle_initializer="manual",
    )
    return private(width=width, channels=channels, repeats=repeats, **options)


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class ShuffleNetBackbone(FeaturePyramidBackbone):
    """ShuffleNet v2 (or v1) features, with `pyramid_outputs` P2-P5 at strides 4-32.

    The output is the last feature map: v2's head (`head_relu`, 1024 or 2048 channels),
    v1's stage 4. `pyramid_outputs` holds `"P2"` (the stem's max-pool, stride 4) and
    `"P3"`-`"P5"` (the ends of stages 2-4, strides 8, 16, 32), for keras-hub's
    `RetinaNetObjectDetector` or `DeepLabV3ImageSegmenter` (none with `stem="cifar"`:
    its strides are not 4-32).

    Args:
        width: the width multiplier: 0.5, 1.0, 1.5 or 2.0 for v2 (torchvision's);
            `applications.V1_WIDTHS` for v1.
        family: "v2" (default) or "v1".
        groups: v1's group count (`applications.V1_GROUPS`); ignored by v2.
        shuffle: "manual" (the fixed channel shuffle) or "auto" (AutoShuffleNet's
            learned shuffle, started at the manual one).
        image_shape: the input's shape, (height, width, channels); default any size.
        padding: "torch" (PyTorch's, which torchvision's weights need) or "same".
        stem: "imagenet" (a stride-2 3x3 convolution and a max-pool, torchvision's) or
            "cifar" (a stride-1 convolution, no pool: `applications`' stem for sides of
            at most 64, e.g. a fine-tune from scratch on small images).
        channels: the channels of the stem, stages 2-4 and (v2) the head, in place of the
            width's (`applications.V2_CONFIGS`); None for the width's.
        repeats: the units of stages 2-4 in place of (4, 8, 4); None for those.
        preset_version: the layout of this config (written by `get_config`; a later
            one than this package's is refused; none is the first layout).
        dtype: the dtype policy of every layer (e.g. "mixed_float16").
        **kwargs: other `keras.Model` arguments (`name`, `trainable`).

    Example:
        >>> backbone = ShuffleNetBackbone.from_preset("shufflenet_v2_x1_0_imagenet")
        >>> features = keras.Model(backbone.inputs, backbone.pyramid_outputs)
    """

    def __init__(
        self,
        width: float = 1.0,
        family: Literal["v1", "v2"] = "v2",
        groups: int = 3,
        shuffle: Literal["manual", "auto"] = "manual",
        image_shape: tuple[int | None, int | None, int] = (None, None, 3),
        padding: Literal["torch", "same"] = "torch",
        stem: Literal["imagenet", "cifar"] = "imagenet",
        channels: Sequence[int] | None = None,
        repeats: Sequence[int] | None = None,
        preset_version: int = FIRST_PRESET_VERSION,
        dtype: Any = None,
        **kwargs: Any,
    ) -> None:
        presets.check_preset_version(preset_version, "ShuffleNetBackbone config")
        family = _validation.choice(family, FAMILIES, "family")
        stem = _validation.choice(stem, STEMS, "stem")
        channels = None if channels is None else tuple(channels)
        repeats = None if repeats is None else tuple(repeats)
        layout = (stem, channels, repeats)
        # A DTypePolicyMap names layers' own policies: no global one to set.
        mapped = dtype is None or isinstance(dtype, keras.dtype_policies.DTypePolicyMap)
        with global_dtype_policy(None if mapped else keras.dtype_policies.get(dtype)):
            features = _build(family, width, groups, shuffle, image_shape, padding, *layout)
        super().__init__(inputs=features.input, outputs=features.output, dtype=dtype, **kwargs)
        # The CIFAR stem (stride 1, no pool) has no pyramid at strides 4-32: none.
        self.pyramid_outputs = common.pyramid_outputs(features) if stem == "imagenet" else {}
        self.width, self.family, self.groups = width, family, groups
        self.shuffle, self.image_shape, self.padding = shuffle, tuple(image_shape), padding
        self.stem, self.channels, self.repeats = stem, channels, repeats

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "width": self.width,
            "family": self.family,
            "groups": self.groups,
            "shuffle": self.shuffle,
            "image_shape": self.image_shape,
            "padding": self.padding,
            "stem": self.stem,
            "channels": self.channels,
            "repeats": self.repeats,
            "preset_version": PRESET_VERSION,
        }

    @classmethod
    def from_preset(
        cls, preset: str | os.PathLike, load_weights: bool = True, **kwargs: Any
    ) -> "ShuffleNetBackbone":
        """The backbone of a preset: a name of `hub.list_presets()` (built once from the
        weights registry, then cached) or a folder written by `save_to_preset`.

        Raises:
            ValueError: a folder that is not a whole preset of this package, naming the
                file and the field.
        """
        folder = presets.preset_folder(preset)
        return presets.load_checked(folder, super().from_preset, load_weights, False, **kwargs)
