"""Training: the paper's recipes (`recipes`), distribution (`distribution`,
`multi_worker`), `train()` with fault tolerance (`loops`, `identity`, `fault_tolerance`,
`backup`, `divergence`, `run_lock`), the exports (`exports`), `search_then_retrain`
(`search`) and the training commands' runs (`cli`).

Reference:
    Lyu et al., AutoShuffleNet, https://arxiv.org/abs/1901.08624 (Section 4)
"""

from keras_autoshuffle.optimizers import CoupledSGD, LinearCycles
from keras_autoshuffle.training.cli import format_run_summary, make_model_fn, run_from_args
from keras_autoshuffle.training.distribution import (
    STRATEGIES,
    cpu_mirrored_strategy,
    make_strategy,
    mixed_precision_policy,
)
from keras_autoshuffle.training.divergence import TrainingDivergedError
from keras_autoshuffle.training.fault_tolerance import RunDirectoryError
from keras_autoshuffle.training.identity import RunIdentity
from keras_autoshuffle.training.loops import BALANCED_TIME_LIMIT, train
from keras_autoshuffle.training.recipes import RECIPES, Recipe, get_recipe, make_optimizer
from keras_autoshuffle.training.search import search_then_retrain
from keras_autoshuffle_cli.train import add_arguments
