"""ShuffleNet v1 / v2 and AutoShuffleNet v1 / v2 builders in the keras.applications style.

One module per family (`shufflenet_v1`, `shufflenet_v2`: the manual and the learned-shuffle
builder), what both build with (`architecture`, the layer structure and its names;
`arguments`, the checks; `common`, the layer factories and the loading of weights),
`preprocessing` (torchvision's evaluation transform as Keras layers) and `weights/` (the
published checkpoints, their download and conversion, the torch reader).
"""

from keras_autoshuffle.applications.architecture import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    V1_GROUPS,
    V1_WIDTHS,
    V2_WIDTHS,
    Architecture,
    describe,
)
from keras_autoshuffle.applications.common import count_macs
from keras_autoshuffle.applications.preprocessing import (
    ResizeCenterCrop,
    evaluation_preprocessing,
    evaluation_sizes,
    imagenet_preprocessing,
    preprocess_input,
)
from keras_autoshuffle.applications.shufflenet_v1 import AutoShuffleNetV1, ShuffleNetV1
from keras_autoshuffle.applications.shufflenet_v2 import AutoShuffleNetV2, ShuffleNetV2
from keras_autoshuffle.applications.weights.registry import (
    CHECKPOINTS,
    Checkpoint,
    decode_predictions,
)
from keras_autoshuffle.applications.weights.torch_checkpoint import (
    CheckpointError,
    read_torch_checkpoint,
)
from keras_autoshuffle.applications.weights.torchvision import load_torchvision_weights
from keras_autoshuffle.layers import ChannelSplit, GroupedConv2D, shuffle_layers

__all__ = [
    "Architecture",
    "AutoShuffleNetV1",
    "AutoShuffleNetV2",
    "CHECKPOINTS",
    "Checkpoint",
    "CheckpointError",
    "ChannelSplit",
    "GroupedConv2D",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ResizeCenterCrop",
    "ShuffleNetV1",
    "ShuffleNetV2",
    "V1_GROUPS",
    "V1_WIDTHS",
    "V2_WIDTHS",
    "count_macs",
    "decode_predictions",
    "describe",
    "evaluation_preprocessing",
    "evaluation_sizes",
    "imagenet_preprocessing",
    "load_torchvision_weights",
    "preprocess_input",
    "read_torch_checkpoint",
    "shuffle_layers",
]
