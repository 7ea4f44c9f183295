"""ShuffleNet as a keras-hub model: `ShuffleNetBackbone` (a `FeaturePyramidBackbone`),
`ShuffleNetImageClassifier` with its `ShuffleNetImageClassifierPreprocessor` and
`ShuffleNetImageConverter` (torchvision's evaluation transform), and presets of the
weights registry's checkpoints (`list_presets()`: `shufflenet_v2_x0_5_imagenet` ...).

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

__all__ = [
    "ShuffleNetBackbone",
    "ShuffleNetImageClassifier",
    "ShuffleNetImageClassifierPreprocessor",
    "ShuffleNetImageConverter",
    "list_presets",
]
