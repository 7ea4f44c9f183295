"""`SmoothedSparseCrossentropy`: cross-entropy of integer labels with label smoothing.

Keras 3's `SparseCategoricalCrossentropy` has no `label_smoothing` (its dense twin has):
the labels are made one-hot inside the loss, so the data stay integer labels and the
`accuracy` metric stays the sparse one.
"""

from typing import Any

import keras
from keras import ops

from keras_autoshuffle import _validation


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class SmoothedSparseCrossentropy(keras.losses.Loss):
    """Categorical cross-entropy of integer labels against probabilities, with label
    smoothing: the target is `(1 - label_smoothing)` on the label plus
    `label_smoothing / classes` on every class (`keras.losses.categorical_crossentropy`).

    Args:
        label_smoothing: in [0, 1); 0 is plain sparse cross-entropy.
        name: the loss's name.
    """

    def __init__(
        self,
        label_smoothing: float = 0.1,
        name: str = "smoothed_sparse_crossentropy",
        **kwargs: Any,
    ) -> None:
        super().__init__(name=name, **kwargs)
        self.label_smoothing = _validation.fraction_below_one(label_smoothing, "label_smoothing")

    def call(self, y_true: Any, y_pred: Any) -> Any:
        classes = ops.shape(y_pred)[-1]
        labels = ops.cast(ops.reshape(y_true, (-1,)), "int32")
        targets = ops.one_hot(labels, classes, dtype=y_pred.dtype)
        return keras.losses.categorical_crossentropy(
            targets, y_pred, label_smoothing=self.label_smoothing
        )

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "label_smoothing": self.label_smoothing}
