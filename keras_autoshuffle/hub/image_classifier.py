"""`ShuffleNetImageClassifier`: keras-hub's `ImageClassifier` on a `ShuffleNetBackbone`,
with its class names; `from_preset` also builds the registry's presets
(`shufflenet_v2_x1_0_imagenet`, ...: `hub.presets`)."""

import os
from typing import Any

import keras
from keras_hub.models import ImageClassifier

from keras_autoshuffle._class_names import check_class_names
from keras_autoshuffle.hub import presets
from keras_autoshuffle.hub.backbone import ShuffleNetBackbone
from keras_autoshuffle.hub.image_classifier_preprocessor import (
    ShuffleNetImageClassifierPreprocessor,
)


@keras.saving.register_keras_serializable(package="keras_autoshuffle")
class ShuffleNetImageClassifier(ImageClassifier):
    """A ShuffleNet image classifier: `backbone`, average pooling, a Dense layer
    (`predictions`), and a preprocessor that takes raw images (`fit`, `predict`).

    Args:
        backbone: a `ShuffleNetBackbone`.
        num_classes: the number of classes.
        preprocessor: a `ShuffleNetImageClassifierPreprocessor`, or None (inputs are
            the model's already).
        class_names: the name of each output, in order, or None; saved in the preset.
        **kwargs: other `ImageClassifier` arguments: `activation` (of the Dense layer;
            default None, logits, as torchvision's), `pooling`, `dropout`, `name`.

    Example:
        >>> classifier = ShuffleNetImageClassifier.from_preset("shufflenet_v2_x1_0_imagenet")
        >>> classifier.predict(images)  # raw pixels, any size
        >>> tuned = ShuffleNetImageClassifier.from_preset(
        ...     "shufflenet_v2_x1_0_imagenet", num_classes=5)  # a new head
    """

    backbone_cls = ShuffleNetBackbone
    preprocessor_cls = ShuffleNetImageClassifierPreprocessor

    def __init__(
        self,
        backbone: ShuffleNetBackbone,
        num_classes: int,
        preprocessor: ShuffleNetImageClassifierPreprocessor | None = None,
        class_names: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        if class_names is not None:
            new_head = "(num_classes; pass class_names=None, or new names, with a new num_classes)"
            class_names = check_class_names(class_names, num_classes, "class_names", new_head)
        super().__init__(backbone, num_classes, preprocessor=preprocessor, **kwargs)
        self.class_names = class_names

    def get_config(self) -> dict:
        return {**super().get_config(), "class_names": self.class_names}

    @classmethod
    def from_preset(
        cls, preset: str | os.PathLike, load_weights: bool = True, **kwargs: Any
    ) -> "ShuffleNetImageClassifier":
        """The classifier of a preset: a name of `presets` (built once from the weights
        registry, then cached) or a folder written by `save_to_preset`. With
        `num_classes`, a new head (and `class_names`, default none) on the preset's
        backbone.

        Raises:
            ValueError: a folder that is not a whole preset of this package, naming the
                file and the field.
        """
        folder = presets.preset_folder(preset)
        new_head = "num_classes" in kwargs
        if new_head:
            kwargs.setdefault("class_names", None)
        return presets.load_checked(
            folder, super().from_preset, load_weights, not new_head, **kwargs
        )

    def fit(self, *args: Any, **kwargs: Any) -> keras.callbacks.History:
        """keras-hub's `fit` (raw images through the preprocessor), with the optimizer
        built before the training step is traced, as Keras's JAX and torch trainers build
        it. TensorFlow's trainer otherwise creates the optimizer's variables inside the
        step's first trace, which nearly doubles a first `fit`'s time (a 1.0x v2 at 64 px:
        38-43 s against 21-25 s)."""
        if self.optimizer is not None and not self.optimizer.built:
            self.optimizer.build(self.trainable_variables)
        return super().fit(*args, **kwargs)
