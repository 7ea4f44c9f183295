"""Backend-neutral optimizer pieces of the paper's recipes: linear LR cycles, coupled L2 SGD."""

from collections.abc import Sequence
from typing import Any

import keras
from keras import ops

from keras_autoshuffle import _keras_internals, _validation


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class LinearCycles(keras.optimizers.schedules.LearningRateSchedule):
    """Linear decay to 0 within each cycle: `lr_c * (1 - (step - start_c) / steps_c)`.

    One cycle is the paper's CIFAR-10 schedule; `(0.2, 0.1)` over two equal cycles its
    ImageNet one (the second cycle starts from the first one's weights at 0.1).

    Args:
        learning_rates: initial learning rate of each cycle, finite numbers > 0.
        cycle_steps: optimizer steps in each cycle, positive integers.
    """

    def __init__(self, learning_rates: Sequence[float], cycle_steps: Sequence[int]) -> None:
        if (
            isinstance(learning_rates, (str, bytes))
            or not hasattr(learning_rates, "__len__")
            or not hasattr(cycle_steps, "__len__")
            or len(learning_rates) != len(cycle_steps)
            or not learning_rates
        ):
            raise ValueError(
                "`learning_rates` and `cycle_steps` must be non-empty and equally long. "
                f"Received: learning_rates={learning_rates}, cycle_steps={cycle_steps}"
            )
        for steps in cycle_steps:
            _validation.positive_int(steps, "cycle_steps")
        for lr in learning_rates:
            _validation.positive_float(lr, "learning_rates")
        self.learning_rates = [float(lr) for lr in learning_rates]
        self.cycle_steps = [int(s) for s in cycle_steps]

    def __call__(self, step: Any) -> Any:
        step = ops.cast(step, "float32")
        lr = ops.zeros((), "float32")
        start = 0
        for peak, steps in zip(self.learning_rates, self.cycle_steps, strict=True):
            inside = ops.logical_and(step >= start, step < start + steps)
            value = peak * (1.0 - (step - start) / steps)
            lr = ops.where(inside, value, lr)
            start += steps
        return lr

    def get_config(self) -> dict[str, Any]:
        return {"learning_rates": self.learning_rates, "cycle_steps": self.cycle_steps}


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class CoupledSGD(keras.optimizers.SGD):
    """SGD with momentum and coupled L2 weight decay, as PyTorch's `SGD(weight_decay=...)`.

    The gradient of each variable becomes `g + l2 * w` before the momentum update (Keras's
    own `weight_decay` is decoupled: it shrinks the weights outside the momentum).
    Variables passed to `exclude_from_weight_decay` are not decayed.

    Args:
        learning_rate: float or schedule.
        momentum: momentum factor.
        l2: the coupled weight-decay factor (>= 0).
    """

    def __init__(
        self,
        learning_rate: float | keras.optimizers.schedules.LearningRateSchedule = 0.01,
        momentum: float = 0.0,
        nesterov: bool = False,
        l2: float = 0.0,
        **kwargs: Any,
    ) -> None:
        l2 = _validation.non_negative_float(l2, "l2")
        super().__init__(
            learning_rate=learning_rate, momentum=momentum, nesterov=nesterov, **kwargs
        )
        self.l2 = l2

    def update_step(self, gradient: Any, variable: keras.Variable, learning_rate: Any) -> None:
        if self.l2 and _keras_internals.uses_weight_decay(self, variable):
            gradient = ops.add(ops.cast(gradient, variable.dtype), ops.multiply(self.l2, variable))
        super().update_step(gradient, variable, learning_rate)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "l2": self.l2}
