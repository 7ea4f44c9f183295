"""ShuffleNet as a keras-hub model: `ShuffleNetBackbone` (a `FeaturePyramidBackbone`),
`ShuffleNetImageClassifier` with its `ShuffleNetImageClassifierPreprocessor` and
`ShuffleNetImageConverter` (torchvision's evaluation transform), and presets of the
weights registry's checkpoints (`list_presets()`: `shufflenet_v2_x0_5_imagenet` ...), and
keras-hub's detector and segmenter on the backbone (`retinanet_detector`,
`deeplab_segmenter`).

Importing it imports keras-hub; `import keras_autoshuffle` imports it as soon as keras-hub
is imported (`keras_autoshuffle._hub_hook`), so keras-hub's own
`keras_hub.models.ImageClassifier.from_preset(folder)` finds these classes.
"""

from keras_autoshuffle.hub.backbone import ShuffleNetBackbone
from keras_autoshuffle.hub.image_classifier import ShuffleNetImageClassifier
from keras_autoshuffle.hub.image_classifier_preprocessor import (
    ShuffleNetImageClassifierPreprocessor,
)
from keras_autoshuffle.hub.image_converter import ShuffleNetImageConverter
from keras_autoshuffle.hub.presets import list_presets
from keras_autoshuffle.hub.tasks import deeplab_segmenter, retinanet_detector

__all__ = [
    "ShuffleNetBackbone",
    "ShuffleNetImageClassifier",
    "ShuffleNetImageClassifierPreprocessor",
    "ShuffleNetImageConverter",
    "deeplab_segmenter",
    "list_presets",
    "retinanet_detector",
]
