"""keras-hub's detection and segmentation tasks on a ShuffleNet: `retinanet_detector` and
`deeplab_segmenter`.

Both are keras-hub's own classes (`RetinaNetObjectDetector`, `DeepLabV3ImageSegmenter`, their
backbones and preprocessors), which take any `FeaturePyramidBackbone` as `image_encoder`;
the functions here only pick the pyramid levels that suit ShuffleNet's strides and give the
preprocessor torchvision's ImageNet normalisation (`x * scale + offset` per channel, what the
ImageNet weights were trained on). Nothing is resized unless `image_size` is given, so the
boxes and masks stay in the images' pixels. What they build saves, loads with
`safe_mode=True` and `save_to_preset`s as any keras-hub task.
"""

import os
from typing import Any

from keras_hub.layers import DeepLabV3ImageConverter, RetinaNetImageConverter
from keras_hub.models import (
    DeepLabV3Backbone,
    DeepLabV3ImageSegmenter,
    DeepLabV3ImageSegmenterPreprocessor,
    RetinaNetBackbone,
    RetinaNetObjectDetector,
    RetinaNetObjectDetectorPreprocessor,
)

from keras_autoshuffle import _validation
from keras_autoshuffle.hub.backbone import PYRAMID_LEVELS, ShuffleNetBackbone
from keras_autoshuffle.hub.image_converter import IMAGENET_OFFSET, IMAGENET_SCALE

# The pyramid levels an image encoder's P-level may name (keras-hub's "P2" .. "P5").
_LEVELS = tuple(int(level[1:]) for level in PYRAMID_LEVELS)


def _encoder(backbone: Any) -> ShuffleNetBackbone:
    """`backbone` itself, or the backbone of a preset name or folder (`from_preset`)."""
    if isinstance(backbone, ShuffleNetBackbone):
        return backbone
    if isinstance(backbone, (str, os.PathLike)):
        return ShuffleNetBackbone.from_preset(backbone)
    raise TypeError(
        "`backbone` must be a ShuffleNetBackbone, a preset name (`hub.list_presets()`) or a "
        f"preset folder. Received: backbone={backbone!r}"
    )


def _image_shape(image_size: Any) -> tuple[int | None, int | None, int]:
    """The task's input shape: `image_size` (height, width) with 3 channels, or any size."""
    if image_size is None:
        return (None, None, 3)
    try:
        sides = tuple(image_size)
    except TypeError:
        sides = ()
    if len(sides) != 2 or not all(_validation.is_integer(s) and s >= 32 for s in sides):
        raise ValueError(
            "`image_size` must be None or (height, width), integers, each at least 32 (the "
            f"pyramid's coarsest stride). Received: image_size={image_size!r}"
        )
    return (int(sides[0]), int(sides[1]), 3)


def retinanet_detector(
    backbone: str | os.PathLike | ShuffleNetBackbone,
    num_classes: int,
    image_size: tuple[int, int] | None = None,
    bounding_box_format: str = "yxyx",
    min_level: int = 3,
    max_level: int = 7,
    **kwargs: Any,
) -> RetinaNetObjectDetector:
    """keras-hub's `RetinaNetObjectDetector` on a ShuffleNet's pyramid.

    The RetinaNet backbone reads P`min_level`-P5 of the ShuffleNet and its feature pyramid
    network adds P6-P`max_level`; the anchors, label encoder, focal loss and non-max
    suppression are keras-hub's defaults.

    Args:
        backbone: a `ShuffleNetBackbone`, or a preset name or folder whose backbone is
            taken (e.g. "shufflenet_v2_x1_0_imagenet": ImageNet weights).
        num_classes: the object classes (no background class).
        image_size: (height, width) the preprocessor resizes images and boxes to; None
            (default) keeps each image's size.
        bounding_box_format: the boxes' format (keras's names: "yxyx", "xyxy", ...).
        min_level: the finest pyramid level the heads see, 2 to 5 (default 3, stride 8).
        max_level: the coarsest, at least 5 (default 7, stride 128).
        **kwargs: other `RetinaNetObjectDetector` arguments (`pre_logits_num_conv_layers`,
            `anchor_generator`, `name`, ...).

    Returns:
        The detector, with its `RetinaNetObjectDetectorPreprocessor` (raw pixel values
            in [0, 255]); compile it and `fit` on `(images, {"boxes": ..., "labels": ...})`.

    Example:
        >>> detector = retinanet_detector("shufflenet_v2_x1_0_imagenet", num_classes=3)
        >>> detector.compile(optimizer="adam")
        >>> detector.fit(images, {"boxes": boxes, "labels": labels}, epochs=10)
    """
    _validation.positive_int(num_classes, "num_classes")
    _validation.choice(min_level, _LEVELS, "min_level")
    if not (_validation.is_integer(max_level) and max_level >= _LEVELS[-1]):
        raise ValueError(
            f"`max_level` must be an integer of at least {_LEVELS[-1]}. "
            f"Received: max_level={max_level!r}"
        )
    image_shape = _image_shape(image_size)
    pyramid = RetinaNetBackbone(
        image_encoder=_encoder(backbone),
        min_level=min_level,
        max_level=max_level,
        use_p5=False,
        image_shape=image_shape,
    )
    converter = RetinaNetImageConverter(
        image_size=image_size,
        scale=IMAGENET_SCALE,
        offset=IMAGENET_OFFSET,
        bounding_box_format=bounding_box_format,
    )
    return RetinaNetObjectDetector(
        backbone=pyramid,
        num_classes=int(num_classes),
        bounding_box_format=bounding_box_format,
        preprocessor=RetinaNetObjectDetectorPreprocessor(image_converter=converter),
        **kwargs,
    )


def deeplab_segmenter(
    backbone: str | os.PathLike | ShuffleNetBackbone,
    num_classes: int,
    image_size: tuple[int, int] | None = None,
    spatial_pyramid_pooling_key: str = "P5",
    low_level_feature_key: str | None = "P2",
    dilation_rates: tuple[int, ...] = (6, 12, 18),
    **kwargs: Any,
) -> DeepLabV3ImageSegmenter:
    """keras-hub's `DeepLabV3ImageSegmenter` (DeepLabV3+) on a ShuffleNet's pyramid.

    The atrous spatial pyramid pooling reads `spatial_pyramid_pooling_key` (default P5,
    stride 32: ShuffleNet has no dilated stage, so P5 holds all of its features), is
    upsampled to P2's stride 4 and joined with P2 (the decoder), then upsampled to the
    input's size: the logits have the images' height and width.

    Args:
        backbone: a `ShuffleNetBackbone`, or a preset name or folder whose backbone is
            taken (e.g. "shufflenet_v2_x1_0_imagenet": ImageNet weights).
        num_classes: the classes of the pixels (background included).
        image_size: (height, width) the preprocessor resizes images to; None (default)
            keeps each image's size (then masks need no resizing).
        spatial_pyramid_pooling_key: the level the ASPP reads: "P3", "P4" or "P5".
        low_level_feature_key: the decoder's level ("P2", finer than the ASPP's), or None
            for plain DeepLabV3.
        dilation_rates: the ASPP's parallel dilated convolutions.
        **kwargs: other `DeepLabV3ImageSegmenter` arguments (`activation`, `name`, ...).

    Returns:
        The segmenter, with its `DeepLabV3ImageSegmenterPreprocessor` (raw pixel values
            in [0, 255]); compile it with a sparse categorical cross-entropy from logits
            and `fit` on `(images, masks)`, masks (batch, height, width, 1) of class indices.

    Example:
        >>> segmenter = deeplab_segmenter("shufflenet_v2_x1_0_imagenet", num_classes=11)
        >>> segmenter.compile("adam", keras.losses.SparseCategoricalCrossentropy(True))
        >>> segmenter.fit(images, masks, epochs=10)
    """
    _validation.positive_int(num_classes, "num_classes")
    pooled = _validation.choice(
        spatial_pyramid_pooling_key, PYRAMID_LEVELS[1:], "spatial_pyramid_pooling_key"
    )
    finer = [level for level in PYRAMID_LEVELS if level < pooled]
    _validation.choice(low_level_feature_key, (None, *finer), "low_level_feature_key")
    # The ASPP's output is upsampled to the decoder level's stride (P2's: 4, without a
    # decoder), where it is joined with that level, then to the input's size.
    joined = int(low_level_feature_key[1:]) if low_level_feature_key else 2
    upsampling = 2 ** (int(pooled[1:]) - joined)
    image_shape = _image_shape(image_size)
    pyramid = DeepLabV3Backbone(
        image_encoder=_encoder(backbone),
        spatial_pyramid_pooling_key=pooled,
        upsampling_size=upsampling,
        dilation_rates=list(dilation_rates),
        low_level_feature_key=low_level_feature_key,
        image_shape=image_shape,
    )
    converter = DeepLabV3ImageConverter(
        image_size=image_size, scale=IMAGENET_SCALE, offset=IMAGENET_OFFSET
    )
    preprocessor = DeepLabV3ImageSegmenterPreprocessor(
        image_converter=converter, resize_output_mask=image_size is not None
    )
    return DeepLabV3ImageSegmenter(
        backbone=pyramid, num_classes=int(num_classes), preprocessor=preprocessor, **kwargs
    )
