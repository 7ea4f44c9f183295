"""ShuffleNet v1 / v2 and AutoShuffleNet v1 / v2 builders in the keras.applications style."""

from keras_autoshuffle.applications.common import (
    ChannelSplit,
    GroupedConv2D,
    count_macs,
    preprocess_input,
)
from keras_autoshuffle.applications.shufflenet_v1 import AutoShuffleNetV1, ShuffleNetV1
from keras_autoshuffle.applications.shufflenet_v2 import AutoShuffleNetV2, ShuffleNetV2
from keras_autoshuffle.layers import shuffle_layers

__all__ = [
    "AutoShuffleNetV1",
    "AutoShuffleNetV2",
    "ChannelSplit",
    "GroupedConv2D",
    "ShuffleNetV1",
    "ShuffleNetV2",
    "count_macs",
    "preprocess_input",
    "shuffle_layers",
]
