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

import keras
import numpy as np

from keras_autoshuffle import _validation
from keras_autoshuffle.hardening import harden_model
from keras_autoshuffle.layers import RelaxedShuffle, shuffle_layers
from keras_autoshuffle.training.fault_tolerance import read_json, write_json
from keras_autoshuffle.training.loops import BALANCED_TIME_LIMIT, train

SEARCH_DIR = "search"
PERMUTATIONS_FILE = "permutations.json"


def search_then_retrain(
    model_fn,
    train_data,
    test_data,
    recipe,
    output_dir,
    *,
    search_epochs,
    balanced=False,
    seed=0,
    settings=None,
    **train_kwargs,
):
    """Learns the shuffles, hardens them, then trains the net with them fixed.

    Args:
        model_fn: builds the learned-shuffle model; called with no arguments for the
            search and with `shuffle_permutations={name: permutation}` for the retraining
            (as `make_model_fn`'s functions and the builders take it).
        train_data, test_data, recipe, output_dir, seed, settings: as `train()`; the
            retraining uses the whole recipe, the search its first cycle's learning
            rate decayed over `search_epochs`.
        search_epochs: epochs of the search, an integer >= 0 (0: harden the fresh net).
        balanced: balanced hardening of the searched matrices (`harden_model`).
        **train_kwargs: passed on to the retraining's `train()` (`export`, `callbacks`,
            `overwrite`, ...); the search gets only `verbose`.

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
    search_dir = os.path.join(output_dir, SEARCH_DIR)
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
        settings={**(settings or {}), "search_epochs": search_epochs, "search_balanced": balanced},
        report_entries={"search": search},
        **train_kwargs,
    )


def _search(
    model_fn, train_data, test_data, recipe, search_dir, epochs, balanced, seed, settings, verbose
):
    """Phase 1 (resumable): the permutations found, read back once written."""
    path = os.path.join(search_dir, PERMUTATIONS_FILE)
    if os.path.exists(path):
        return _read_permutations(path)
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
    write_json(path, {"l12_penalty_at_hardening": penalty, "permutations": permutations})
    return permutations, penalty


def _hardenable(model):
    layers = [layer for layer in shuffle_layers(model) if isinstance(layer, RelaxedShuffle)]
    if not layers or any(layer.is_hardened for layer in layers):
        raise ValueError(
            "search_then_retrain needs a model_fn that builds learned, relaxed shuffles "
            f"(shuffle='auto'). Received: a model with {len(layers)} RelaxedShuffle layers"
        )
    return layers


def _read_permutations(path):
    record = read_json(path, "searched permutations")
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
    return perms, float(penalty)
