"""`ShuffleNetImageClassifierPreprocessor`: keras-hub's image classifier preprocessor with
`ShuffleNetImageConverter` (the behaviour is keras-hub's base class)."""

import keras
from keras_hub.models import ImageClassifierPreprocessor

from keras_autoshuffle.hub.backbone import ShuffleNetBackbone
from keras_autoshuffle.hub.image_converter import ShuffleNetImageConverter


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class ShuffleNetImageClassifierPreprocessor(ImageClassifierPreprocessor):
    """Raw images (and labels) to a ShuffleNet classifier's inputs: its `image_converter`
    (a `ShuffleNetImageConverter`) on the images, labels passed through. The arguments
    are keras-hub's `ImageClassifierPreprocessor`'s: `image_converter`, then `keras.Layer`
    arguments.
    """

    backbone_cls = ShuffleNetBackbone
    image_converter_cls = ShuffleNetImageConverter
