"""ShuffleNet v1 / v2 and AutoShuffleNet v1 / v2 builders in the keras.applications style."""

from keras_autoshuffle.applications.architecture import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    V1_GROUPS,
    V1_WIDTHS,
    V2_WIDTHS,
    Architecture,
    describe,
)
from keras_autoshuffle.applications.checkpoints import CHECKPOINTS, Checkpoint
from keras_autoshuffle.applications.common import count_macs
from keras_autoshuffle.applications.preprocessing import (
    ResizeCenterCrop,
    evaluation_preprocessing,
    preprocess_input,
)
from keras_autoshuffle.applications.pretrained import decode_predictions
from keras_autoshuffle.applications.registry import (
    get_weights,
    imagenet_preprocessing,
    list_models,
    list_weights,
)
from keras_autoshuffle.applications.shufflenet_v1 import AutoShuffleNetV1, ShuffleNetV1
from keras_autoshuffle.applications.shufflenet_v2 import AutoShuffleNetV2, ShuffleNetV2
from keras_autoshuffle.applications.torch_checkpoint import CheckpointError, read_torch_checkpoint
from keras_autoshuffle.applications.torchvision_weights import load_torchvision_weights
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
    "get_weights",
    "imagenet_preprocessing",
    "list_models",
    "list_weights",
    "load_torchvision_weights",
    "preprocess_input",
    "read_torch_checkpoint",
    "shuffle_layers",
]
