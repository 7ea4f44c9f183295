"""keras-autoshuffle: learned channel permutations (AutoShuffleNet) for Keras."""

# `optimizers` registers CoupledSGD and LinearCycles, which saved checkpoints reference.
# TensorFlow-only parts (data, training, export) are imported on use.
from keras_autoshuffle import applications, optimizers
from keras_autoshuffle.callbacks import (
    HardenShuffles,
    RoundingMonitor,
    ShufflePenaltyLogger,
    format_report,
    harden_model,
)
from keras_autoshuffle.constraints import DoublyStochastic
from keras_autoshuffle.layers import (
    ChannelShuffle,
    RelaxedShuffle,
    relaxed_shuffles,
    shuffle_layers,
    total_penalty,
)
from keras_autoshuffle.permutations import (
    argmax_agrees,
    argmax_permutation,
    distance_to_permutation,
    group_shuffle_permutation,
    invert_permutation,
    is_permutation_matrix,
    nearest_permutation,
    permutation_matrix,
)
from keras_autoshuffle.regularizers import L12Penalty, l12_penalty

__version__ = "0.1.0"
