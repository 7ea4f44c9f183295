"""keras-autoshuffle: ShuffleNet v1/v2 for Keras 3; AutoShuffleNet's learned shuffle as a study.

torchvision's ImageNet weights for ShuffleNet v2, shuffles folded away for inference, LiteRT,
ONNX and OpenVINO export, fine-tuning on a folder of images. Importing the package registers
every custom object (layers, constraint, regularizer, optimizer pieces), so `.keras` files
load with `safe_mode=True`; the keras-hub classes (`hub`) register once keras-hub is
imported. TensorFlow-only parts (`data`, `training`, `export`,
`prediction`) are imported on use. The experiments that produced the docs' numbers live
outside the package, in the repository's `experiments/`.
"""

# First: it imports Keras (and with it TensorFlow) without TensorFlow's start-up lines in the
# installed commands, which import this package once their arguments are parsed
# (`keras_autoshuffle_cli`: `--help` imports none of this).
from keras_autoshuffle import _startup

# isort: split
from keras_autoshuffle import applications, hardening, optimizers
from keras_autoshuffle.callbacks import HardenShuffles, RoundingMonitor, ShufflePenaltyLogger
from keras_autoshuffle.constraints import DoublyStochastic
from keras_autoshuffle.hardening import (
    format_hardening_report,
    harden_and_evaluate,
    harden_model,
    nearest_balanced_permutation,
)
from keras_autoshuffle.layers import (
    ChannelShuffle,
    ChannelSlice,
    ChannelSplit,
    GroupedConv2D,
    RelaxedShuffle,
    relaxed_shuffles,
    shuffle_layers,
    total_l12_penalty,
)
from keras_autoshuffle.permutations import (
    argmax_agrees,
    argmax_permutation,
    block_counts,
    distance_to_permutation,
    group_shuffle_permutation,
    invert_permutation,
    is_permutation_matrix,
    matched_mass,
    nearest_permutation,
    permutation_matrix,
)
from keras_autoshuffle.regularizers import L12Penalty, l12_penalty

# The keras-hub classes (`keras_autoshuffle.hub`) register when keras-hub is imported.
from keras_autoshuffle import _hub_hook  # isort: skip

_hub_hook.install()

__version__ = "0.1.0"
