"""Training: the paper's recipes, distribution, the loops with fault tolerance, the CLI.

- `recipes.py`: `Recipe`, `RECIPES`, `get_recipe`, `make_optimizer`;
- `distribution.py`: `make_strategy` and the strategy facts the loops need;
- `loops.py`: `train()` (fit on one host), hardening; `multi_worker.py`: the custom step
  across hosts; `job.py`: `TrainingJob`, what both loops are given, and the callbacks'
  order; `exports.py`: the exports, checked before training and written after it;
- `identity.py`: `RunIdentity`, the one record of the settings that define a run;
- `fault_tolerance.py`: a run's files, each checked before a resume (a damaged one
  named), the time, history and hardening records; `run_lock.py`: one run per folder;
  `backup.py`: the weights backup;
  `divergence.py`: a diverged run stopped at the step;
- `search.py`: `search_then_retrain`, learned shuffles searched, hardened, then fixed
  in a net trained from fresh weights;
- `cli.py`: the training commands' options, `run_from_args`, `format_run_summary`.

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
