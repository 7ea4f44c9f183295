"""A run's identity: the one record of the settings that define a training.

A killed run resumes only into the same identity (`fault_tolerance.prepare_run_directory`
compares the record stored in its backup with the rerun's). What is not in it does not
change what is trained: where the files go, what is shown (`verbose`), what is exported
(`export`, `int8`), `overwrite`, how the steps run (`strategy`, `jit_compile`: the report
adds these), and where the data is read from (`data_dir`, `manual_dir`).
"""

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from keras_autoshuffle._atomic import as_json

if TYPE_CHECKING:
    from keras_autoshuffle.training.recipes import Recipe

# Settings a resume may change after a divergence (the advice of TrainingDivergedError).
CHANGEABLE_AFTER_DIVERGENCE = ("learning_rates",)


@dataclasses.dataclass(frozen=True)
class RunIdentity:
    """The settings that define a training, each with its default.

    A record stored before a setting existed takes its default on resume (a new setting's
    default trains as the runs before it did), except a field marked
    `metadata={"unrecorded": True}` (what a run measures), not compared where a stored
    record lacks it. A setting with another value, or one this version does not define,
    is refused by name. `train()` fills the recipe's, the data's and the network's
    fields; the command line, `search_then_retrain` and a caller's `settings` the others.
    """

    # The `Recipe`'s (`epochs`: their total).
    learning_rates: tuple = ()
    cycle_epochs: tuple = ()
    epochs: int = 0
    penalty: float = 0.0
    momentum: float = 0.0
    weight_decay: float = 0.0
    batch_size: int = 0
    seed: int = 0  # the initial weights', the data order's and the augmentation's
    train_examples: int = 0
    test_examples: int = 0
    # The network as built: a builder change is not resumed into. `layer_types` (its
    # layers counted by type) is not compared where a record written before it lacks it.
    model_name: str = ""
    parameters: int = 0
    layer_types: dict = dataclasses.field(default_factory=dict, metadata={"unrecorded": True})
    mixed_precision: str | bool = False  # the dtype policy's name, or False
    harden_at_epoch: int | None = None
    balanced: bool = False
    search_epochs: int | None = None  # `search_then_retrain`'s search (None: no search)
    search_balanced: bool = False
    # The command line's network and data (`add_arguments`).
    dataset: str | None = None
    model: str | None = None
    width: float | None = None
    groups: int | None = None
    shuffle: str | None = None
    padding: str = "torch"
    sinkhorn_iterations: int = 10
    shuffle_initializer: str = "random"
    shuffle_forward: str = "relaxed"
    max_train_examples: int | None = None
    label_smoothing: float = 0.0
    class_weights: tuple | None = None
    # A fine-tuning's: the starting weights (a file's SHA-256), what is frozen ("base",
    # "batch_norm" or None), the input side, the flips, the SHA-256 of the split's record,
    # whether training reads cached decoded images.
    base_weights: str | None = None
    frozen: str | None = None
    image_size: int | None = None
    flip: bool | None = None
    images: str | None = None
    image_cache: bool | None = None

    @classmethod
    def make(cls, settings: dict[str, Any] | None, **fields: Any) -> "RunIdentity":
        """The identity of `settings` (a dict of field values) and `fields` (which win);
        a key that is no field raises ValueError naming it."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(settings or {}) - names)
        if unknown:
            raise ValueError(
                f"`settings` takes the fields of RunIdentity ({', '.join(sorted(names))}). "
                f"Received: {', '.join(f'{k}={settings[k]!r}' for k in unknown)}"
            )
        return cls(**{**(settings or {}), **fields})

    def record(self) -> dict[str, Any]:
        """The record as stored (JSON's types: tuples as lists)."""
        return as_json(dataclasses.asdict(self))


def recipe_fields(recipe: "Recipe") -> dict[str, Any]:
    """The identity's fields a `Recipe` gives."""
    return {
        "learning_rates": tuple(recipe.learning_rates),
        "cycle_epochs": tuple(recipe.cycle_epochs),
        "epochs": recipe.epochs,
        "penalty": recipe.penalty,
        "momentum": recipe.momentum,
        "weight_decay": recipe.weight_decay,
        "batch_size": recipe.batch_size,
    }


# The fields a stored record may lack without a default standing in (not compared then).
UNRECORDED = tuple(f.name for f in dataclasses.fields(RunIdentity) if f.metadata.get("unrecorded"))


def differences(
    saved: dict[str, Any],
    expected: dict[str, Any],
    diverged: bool = False,
    keys: Sequence[str] | None = None,
    label: str = "backup",
) -> str:
    """'name=value (backup: value)' for each setting of `keys` (default: all) whose
    values differ between two stored records; a field missing from either takes its
    default (one of UNRECORDED missing from `saved` is not compared), a key RunIdentity
    does not define is named as unknown. After a divergence the learning rates may
    differ."""
    defaults, expected = RunIdentity().record(), as_json(expected)
    if keys is None:
        keys = sorted(saved.keys() | expected.keys() | defaults.keys())
        keys = [k for k in keys if not (k in UNRECORDED and k not in saved)]
    unknown = [k for k in keys if k not in defaults and k in saved and k not in expected]
    saved, expected = {**defaults, **saved}, {**defaults, **expected}
    differ = [k for k in keys if saved.get(k) != expected.get(k) and k not in unknown]
    if diverged:
        differ = [k for k in differ if k not in CHANGEABLE_AFTER_DIVERGENCE]
    named = [f"{k}={expected.get(k)!r} ({label}: {saved.get(k)!r})" for k in differ]
    named += [
        f"{k}: a setting this version does not define ({label}: {saved[k]!r}; written by "
        "a newer version?)"
        for k in unknown
    ]
    return ", ".join(named)
