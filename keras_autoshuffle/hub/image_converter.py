"""`ShuffleNetImageConverter`: torchvision's evaluation transform as keras-hub's converter.

keras-hub's `ImageConverter` resizes straight to `image_size` (`crop_to_aspect_ratio`
keeps the largest central window), which is not torchvision's transform: that resizes
the shorter side to 256 / 224 of the crop and keeps the central crop, 87.5% of the
shorter side. This converter is the package's one spelling of that transform; its layers
are `applications.preprocessing.evaluation_layers` (`ToRGB`, `ResizeCenterCrop`, a
`Rescaling` by keras-hub's scale and offset), which `evaluation_preprocessing` and
`imagenet_preprocessing` also are.
"""

from typing import Any

import keras
from keras import ops
from keras_hub.layers import ImageConverter

from keras_autoshuffle.applications.preprocessing import (
    IMAGENET_OFFSET,
    IMAGENET_SCALE,
    evaluation_layers,
    evaluation_sizes,
)
from keras_autoshuffle.hub.backbone import ShuffleNetBackbone


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class ShuffleNetImageConverter(ImageConverter):
    """Raw images (pixel values in [0, 255], any size, 1 to 4 channels) to a ShuffleNet's
    input: RGB, the shorter side resized to `resize_size` (bilinear, antialiased), the
    central `image_size` square, then `x * scale + offset` per channel (default:
    torchvision's ImageNet normalisation).

    Args:
        image_size: the output's (height, width), a square of 16 to 4096 pixels.
        resize_size: the shorter side before the crop (default torchvision's
            `round(side * 256 / 224)`: 256 for 224).
        scale: per-channel factor (default `1 / (255 * ImageNet std)`).
        offset: per-channel offset added after the scale (default `-mean / std`).
        data_format: "channels_last" or "channels_first" (default: Keras's).
        **kwargs: other `ImageConverter` / `Layer` arguments (`name`, `dtype`).

    Example:
        >>> converter = ShuffleNetImageConverter(image_size=(224, 224))
        >>> converter(np.zeros((2, 480, 640, 3))).shape
        TensorShape([2, 224, 224, 3])
    """

    backbone_cls = ShuffleNetBackbone

    def __init__(
        self,
        image_size: tuple[int, int] = (224, 224),
        resize_size: int | None = None,
        scale: Any = IMAGENET_SCALE,
        offset: Any = IMAGENET_OFFSET,
        data_format: str | None = None,
        **kwargs: Any,
    ) -> None:
        if image_size is None or len(image_size) != 2 or image_size[0] != image_size[1]:
            raise ValueError(
                "`image_size` must be a square (side, side): the centre crop is square. "
                f"Received: image_size={image_size!r}"
            )
        side, resize_size = evaluation_sizes(image_size[0], resize_size)
        super().__init__(
            image_size=(side, side), scale=scale, offset=offset, data_format=data_format, **kwargs
        )
        self.resize_size = resize_size
        self.to_rgb, self.resize_crop, self.normalize = evaluation_layers(
            side, resize_size, scale, offset, self.data_format, dtype=self.dtype_policy
        )

    def call(self, inputs: Any) -> Any:
        """The transform of a batch (rank 4) or of one image (rank 3)."""
        images = ops.convert_to_tensor(inputs)
        single = len(images.shape) == 3
        images = images[None] if single else images
        x = self.normalize(self.resize_crop(self.to_rgb(images)))
        return x[0] if single else x

    def get_config(self) -> dict:
        return {**super().get_config(), "resize_size": self.resize_size}
