"""The paper's training recipes and the optimizer they describe.

Reference:
    Lyu et al., AutoShuffleNet, https://arxiv.org/abs/1901.08624 (Section 4)
"""

import dataclasses

import keras

from keras_autoshuffle import _validation
from keras_autoshuffle.layers import relaxed_shuffles
from keras_autoshuffle.optimizers import CoupledSGD, LinearCycles


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A training recipe.

    Args:
        penalty: lambda, the weight of the l1-2 penalty (models are built with it).
        learning_rates: the initial learning rate of each cycle; each decays linearly
            to 0 over its cycle; cycle c + 1 starts from cycle c's weights.
        cycle_epochs: epochs per cycle.
        momentum: SGD momentum.
        weight_decay: coupled L2 (PyTorch's `SGD(weight_decay=...)`), shuffle matrices excluded.
        batch_size: the global batch size (split over replicas and workers).
    """

    penalty: float
    learning_rates: tuple
    cycle_epochs: tuple
    momentum: float
    weight_decay: float
    batch_size: int
    description: str = ""

    def __post_init__(self):
        _validation.penalty(self.penalty)
        cycles = self.cycle_epochs
        sequences = (tuple, list)
        if not isinstance(cycles, sequences) or not isinstance(self.learning_rates, sequences):
            raise ValueError(
                "`learning_rates` and `cycle_epochs` must be tuples. Received: "
                f"learning_rates={self.learning_rates!r}, cycle_epochs={cycles!r}"
            )
        if not cycles or len(cycles) != len(self.learning_rates):
            raise ValueError(
                "`learning_rates` and `cycle_epochs` must be non-empty and equally long. "
                f"Received: learning_rates={self.learning_rates}, cycle_epochs={cycles}"
            )
        for epochs in cycles:
            _validation.positive_int(epochs, "cycle_epochs")
        for lr in self.learning_rates:
            _validation.positive_float(lr, "learning_rates")
        _validation.fraction_below_one(self.momentum, "momentum")
        _validation.non_negative_float(self.weight_decay, "weight_decay")
        _validation.positive_int(self.batch_size, "batch_size")

    @property
    def epochs(self) -> int:
        """The epochs of all cycles together."""
        return int(sum(self.cycle_epochs))


RECIPES = {
    # Paper Section 4: 200 epochs, lr 0.2 linear decay, momentum 0.95, wd 1e-4, batch 128.
    "cifar10": Recipe(1e-3, (0.2,), (200,), 0.95, 1e-4, 128, "the paper's CIFAR-10 recipe"),
    # Paper Section 4: two cycles of 100 epochs (lr 0.2, then 0.1 from cycle 1's weights),
    # momentum 0.9, wd 4e-5, batch 512 (4 GPUs).
    "imagenet": Recipe(2e-3, (0.2, 0.1), (100, 100), 0.9, 4e-5, 512, "the paper's ImageNet recipe"),
    # Quick start on the embedded digits (a few minutes on 2 CPU cores). lambda = 5e-2, not
    # 1e-3: the penalty's push scales with lambda x the summed learning rate x steps, and
    # 10 short epochs at 1e-3 leave the matrices far from permutations (rounding -> chance).
    "digits": Recipe(5e-2, (0.1,), (10,), 0.9, 1e-4, 64, "quick digits preset"),
    # The Fashion-MNIST study (docs/fashion_mnist): 10 epochs at batch 128, the digits
    # preset's optimizer; lambda x (sum of lr) = 0.78 on the study's 20,000 images (see
    # docs/lab-notes/training.md on choosing lambda).
    "fashion_mnist": Recipe(1e-2, (0.1,), (10,), 0.9, 1e-4, 128, "Fashion-MNIST study preset"),
}


def get_recipe(
    name: str,
    epochs: int | None = None,
    batch_size: int | None = None,
    penalty: float | None = None,
    learning_rate: float | None = None,
) -> Recipe:
    """A preset from RECIPES with optional overrides.

    Args:
        name: a key of RECIPES.
        epochs: epochs per cycle (every cycle gets this many).
        batch_size: global batch size.
        penalty: lambda.
        learning_rate: the first cycle's learning rate (later cycles keep their ratio).
    """
    _validation.choice(name, tuple(RECIPES), "recipe")
    recipe = RECIPES[name]
    changes = {}
    if epochs is not None:
        changes["cycle_epochs"] = (_validation.positive_int(epochs, "epochs"),) * len(
            recipe.cycle_epochs
        )
    if batch_size is not None:
        changes["batch_size"] = _validation.positive_int(batch_size, "batch_size")
    if penalty is not None:
        changes["penalty"] = _validation.penalty(penalty)
    if learning_rate is not None:
        scale = (
            _validation.positive_float(learning_rate, "learning_rate") / recipe.learning_rates[0]
        )
        changes["learning_rates"] = tuple(lr * scale for lr in recipe.learning_rates)
    return dataclasses.replace(recipe, **changes)


def make_optimizer(recipe: Recipe, steps_per_epoch: int, model: keras.Model) -> CoupledSGD:
    """CoupledSGD over LinearCycles; the shuffle matrices are excluded from the L2 decay.

    Why not decay M: the constraint renormalises every row and column to sum 1, so a
    decay cannot shrink M; over doubly stochastic matrices ||M||^2 is smallest at the
    uniform matrix and largest at permutations, so an L2 pull works against the penalty.
    """
    schedule = LinearCycles(
        recipe.learning_rates, [e * steps_per_epoch for e in recipe.cycle_epochs]
    )
    optimizer = CoupledSGD(schedule, momentum=recipe.momentum, l2=recipe.weight_decay)
    optimizer.exclude_from_weight_decay(var_list=[s.matrix for s in relaxed_shuffles(model)])
    return optimizer
