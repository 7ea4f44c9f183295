"""Search, then retrain: learned shuffles chosen first, then trained from fresh weights.

The relaxed phase of the paper trains the whole network through averaging shuffles; this
separates what it finds (the hardened routing) from the damage it does to the other
weights. Phase 1 (`search/` inside the run's directory) learns the shuffles for
`search_epochs` epochs and hardens them; phase 2 builds the same net with those
permutations fixed from the first step (`shuffle_permutations`), with the initial weights
the manual net of the same seed has, and trains it for the whole recipe. With
`search_epochs=0` the routing is the hardening of the freshly built net's matrices (with
`balanced=True`: a routing that folds as cheaply as the manual one, chosen before any
training). Each phase is a `train()` run, so each resumes after a kill.
"""

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from keras_autoshuffle import _validation
from keras_autoshuffle._atomic import as_json, write_json
from keras_autoshuffle.data import EpochData
from keras_autoshuffle.hardening import harden_model
from keras_autoshuffle.layers import RelaxedShuffle, checked_permutation, shuffle_layers
from keras_autoshuffle.training.divergence import DIVERGENCE_FILE
from keras_autoshuffle.training.fault_tolerance import (
    BACKUP,
    SEARCH_DIR,
    SETTINGS_FILE,
    RunDirectoryError,
    clear_finished_run,
    damaged,
    read_json,
    unusable_folder,
)
from keras_autoshuffle.training.identity import differences, recipe_fields
from keras_autoshuffle.training.loops import BALANCED_TIME_LIMIT, train
from keras_autoshuffle.training.recipes import Recipe

PERMUTATIONS_FILE = "permutations.json"
# What defines the search (its settings, recipe, seed, epochs, balanced), written first.
DEFINITION_FILE = "definition.json"
_REDO = "Delete the search folder to search again."


def search_then_retrain(
    model_fn: Callable[..., keras.Model],
    train_data: EpochData,
    test_data: EpochData,
    recipe: Recipe,
    output_dir: str | os.PathLike,
    *,
    search_epochs: int,
    balanced: bool = False,
    seed: int = 0,
    settings: dict[str, Any] | None = None,
    **train_kwargs: Any,
) -> dict[str, Any]:
    """Learns the shuffles, hardens them, then trains the net with them fixed.

    Args:
        model_fn: builds the learned-shuffle model; called with no arguments for the
            search and with `shuffle_permutations={name: permutation}` for the retraining.
        train_data: as `train()`'s.
        test_data: as `train()`'s.
        recipe: as `train()`'s; the search takes its first cycle's learning rate.
        output_dir: as `train()`'s.
        search_epochs: epochs of the search, an integer >= 0 (0: harden the fresh net).
        balanced: balanced hardening of the searched matrices (`harden_model`).
        seed: as `train()`'s.
        settings: as `train()`'s.
        **train_kwargs: passed on to the retraining's `train()`; the search gets only
            `verbose`.

    Returns:
        The retraining's report, with `search`: the epochs, whether balanced, the P(M)
            at hardening and the permutations' file.
    """
    search_epochs = _validation.non_negative_int(search_epochs, "search_epochs")
    if search_epochs >= recipe.epochs:
        raise ValueError(
            f"`search_epochs` must be below the recipe's {recipe.epochs} epochs (the search "
            f"is the short phase). Received: search_epochs={search_epochs}"
        )
    _validation.choice(balanced, (False, True), "balanced")
    seed = _validation.seed(seed)
    retrain_settings = {
        **(settings or {}),
        "search_epochs": search_epochs,
        "search_balanced": balanced,
    }
    search_dir = os.path.join(output_dir, SEARCH_DIR)
    definition = _check_before_search(
        output_dir, recipe, settings, retrain_settings, seed, train_kwargs.get("overwrite", False)
    )
    search = {"epochs": search_epochs, "balanced": balanced}
    permutations, search["l12_penalty_at_hardening"] = _search(
        model_fn,
        train_data,
        test_data,
        recipe,
        search_dir,
        search_epochs,
        balanced,
        seed,
        settings,
        train_kwargs.get("verbose", 1),
        definition,
    )
    search["permutations"] = os.path.join(SEARCH_DIR, PERMUTATIONS_FILE)

    def retrain_fn():
        return model_fn(shuffle_permutations=permutations)

    return train(
        retrain_fn,
        train_data,
        test_data,
        recipe,
        output_dir,
        seed=seed,
        settings=retrain_settings,
        report_entries={"search": search},
        **train_kwargs,
    )


def _check_before_search(output_dir, recipe, settings, retrain_settings, seed, overwrite):
    """Refuses before any training a finished run (or removes it with `overwrite`), a
    killed retraining of other settings, and a search made by other settings; returns
    what defines the search, written into `search/` before its first file."""
    try:  # a file where the folder (or one above it) should be: OSError
        clear_finished_run(output_dir, overwrite)
        # What train() records itself (the recipe's values, `balanced=False`) is its to check.
        recorded_by_train = {"mixed_precision", "balanced", *recipe_fields(recipe)}
        _check_killed_retraining(
            output_dir,
            {k: v for k, v in retrain_settings.items() if k not in recorded_by_train}
            | {"seed": seed},
        )
        definition = as_json(
            {**(settings or {}), **recipe_fields(recipe), "seed": seed, **retrain_settings}
        )
        _start_search(os.path.join(output_dir, SEARCH_DIR), definition)
        return definition
    except OSError as error:
        raise unusable_folder(output_dir, error) from None


def _diverged(output_dir):
    """Whether the run or its search diverged (then its learning rate may change)."""
    search_dir = os.path.join(output_dir, SEARCH_DIR)
    if any(
        os.path.exists(os.path.join(folder, BACKUP, DIVERGENCE_FILE))
        for folder in (output_dir, search_dir)
    ):
        return True
    report = os.path.join(search_dir, "report.json")
    return os.path.exists(report) and "resumed_after_divergence" in str(
        read_json(report, "search report", "Delete the search folder.")
    )


def _differences(saved, expected, output_dir, keys=None):
    """The settings (of `keys`) whose values differ, as 'key=value (recorded: value)'."""
    return differences(saved, expected, _diverged(output_dir), keys, label="recorded")


def _check_killed_retraining(output_dir, expected):
    """RunDirectoryError where `output_dir` holds a killed run of other settings."""
    path = os.path.join(output_dir, BACKUP, SETTINGS_FILE)
    if not os.path.exists(path):
        return
    saved = read_json(path, "run settings", fields={})
    expected = as_json(expected)
    differ = _differences(saved, expected, output_dir, [k for k in expected if k in saved])
    if differ:
        raise RunDirectoryError(
            f"{output_dir} holds the backup of a killed run with other settings; searching "
            "for it would mix two runs. Rerun with the same settings, or use another output "
            f"directory, or delete {os.path.dirname(path)}. Received: {differ}"
        )


def _check_definition(path, saved, definition, output_dir):
    if not isinstance(saved, dict):
        raise damaged(path, "search definition", "not an object of settings", saved, _REDO)
    differ = _differences(saved, definition, output_dir)
    if differ:
        raise RunDirectoryError(
            f"{path} records a search made with other settings; retraining its permutations "
            f"would mix two runs. Rerun with the same settings, or use another output "
            f"directory, or delete {os.path.dirname(path)} to search again. Received: {differ}"
        )


def _start_search(search_dir, definition):
    """Writes what defines the search into `search_dir` before its first file; refuses
    a folder holding a search of another definition (or of none)."""
    path = os.path.join(search_dir, DEFINITION_FILE)
    if os.path.exists(path):
        saved = read_json(path, "search definition", _REDO)
        _check_definition(path, saved, definition, os.path.dirname(search_dir))
    elif os.path.isdir(search_dir) and os.listdir(search_dir):
        raise RunDirectoryError(
            f"{search_dir} holds files but no {DEFINITION_FILE} saying what search made them, "
            f"so they are not reused. {_REDO} Received: {sorted(os.listdir(search_dir))}"
        )
    else:
        write_json(path, definition)


def _search(
    model_fn,
    train_data,
    test_data,
    recipe,
    search_dir,
    epochs,
    balanced,
    seed,
    settings,
    verbose,
    definition,
):
    """Phase 1 (resumable): the permutations found, read back once written."""
    path = os.path.join(search_dir, PERMUTATIONS_FILE)
    if os.path.exists(path):
        return _read_permutations(path, definition, os.path.dirname(search_dir))
    if epochs == 0:
        keras.utils.set_random_seed(seed)
        model = model_fn()
        layers = _hardenable(model)
        penalty = float(sum(layer.l12_penalty() for layer in layers))
        harden_model(model, balanced=balanced, time_limit=BALANCED_TIME_LIMIT)
    else:
        short = dataclasses.replace(
            recipe, learning_rates=recipe.learning_rates[:1], cycle_epochs=(epochs,)
        )
        finished = os.path.join(search_dir, "report.json")
        if os.path.exists(finished):  # killed after the search's run, before this file
            report = read_json(finished, "search report", "Delete the search folder.")
        else:
            report = train(
                model_fn,
                train_data,
                test_data,
                short,
                search_dir,
                seed=seed,
                export=False,
                settings=settings,
                balanced=balanced,
                verbose=verbose,
            )
        penalty = report.get("l12_penalty_at_hardening") if isinstance(report, dict) else None
        if not isinstance(penalty, (int, float)):
            raise ValueError(
                f"{finished} is not the report of a search run; delete {search_dir} to search "
                f"again. Received: l12_penalty_at_hardening={penalty!r}"
            )
        model = keras.saving.load_model(os.path.join(search_dir, "model.keras"), safe_mode=True)
    permutations = {
        layer.name: np.asarray(layer.permutation).tolist()
        for layer in shuffle_layers(model)
        if isinstance(layer, RelaxedShuffle)
    }
    os.makedirs(search_dir, exist_ok=True)
    record = {"l12_penalty_at_hardening": penalty, "permutations": permutations}
    write_json(path, {**record, "definition": definition})
    return permutations, penalty


def _hardenable(model):
    layers = [layer for layer in shuffle_layers(model) if isinstance(layer, RelaxedShuffle)]
    if not layers or any(layer.is_hardened for layer in layers):
        raise ValueError(
            "search_then_retrain needs a model_fn that builds learned, relaxed shuffles "
            f"(shuffle='auto'). Received: a model with {len(layers)} RelaxedShuffle layers"
        )
    return layers


def _read_permutations(path, definition, output_dir):
    record = read_json(path, "searched permutations", _REDO)
    perms = record.get("permutations") if isinstance(record, dict) else None
    penalty = record.get("l12_penalty_at_hardening") if isinstance(record, dict) else None
    if (
        not isinstance(perms, dict)
        or not isinstance(penalty, (int, float))
        or not all(isinstance(v, list) for v in perms.values())
    ):
        raise ValueError(
            f"{path} is not a record of searched permutations ({{'permutations': {{name: "
            "list}, 'l12_penalty_at_hardening': number}); delete it to search again. "
            f"Received: {str(record)[:200]}"
        )
    _check_definition(path, record.get("definition"), definition, output_dir)
    for name, permutation in perms.items():
        try:
            checked_permutation(permutation, f"permutation of {name}")
        except ValueError as error:
            raise damaged(path, "searched permutations", str(error), name, _REDO) from None
    return perms, float(penalty)
