"""The two phases of the fine-tuning recipe, each a `training.train()` run in its own
folder: the head alone on the frozen base, then the whole net but BatchNormalization."""

import os

from keras_autoshuffle.finetuning import network
from keras_autoshuffle.finetuning.run_folder import ALL_DIR, HEAD_DIR, REPORT_FILE
from keras_autoshuffle.training.fault_tolerance import RunDirectoryError, read_json
from keras_autoshuffle.training.identity import differences, recipe_fields
from keras_autoshuffle.training.loops import train
from keras_autoshuffle.training.recipes import Recipe

MOMENTUM, WEIGHT_DECAY, HEAD_RATE_FACTOR = 0.9, 4e-5, 10


def train_phases(
    output_dir: str,
    weights: str | os.PathLike | None,
    options: dict,
    settings: dict,
    build: dict,
    phase: dict,
) -> None:
    """The head phase (with pretrained weights) and the whole-net phase, each `train()`
    into its folder (`_run_phase`: a finished one is not trained again)."""
    pretrained = weights is not None
    start = weights
    if options["head_epochs"]:
        _run_phase(
            lambda: network.freeze(_classifier(build, weights), network.FROZEN_BASE),
            _recipe(options, HEAD_RATE_FACTOR * options["learning_rate"], "head_epochs"),
            os.path.join(output_dir, HEAD_DIR),
            {**settings, "frozen": network.FROZEN_BASE},
            **phase,
        )
        start = os.path.join(output_dir, HEAD_DIR, "model.keras")
    frozen = network.FROZEN_BATCH_NORM if pretrained else None
    head_trained = bool(options["head_epochs"])
    _run_phase(
        lambda: network.freeze(_classifier(build, start, with_head=head_trained), frozen),
        _recipe(options, options["learning_rate"], "epochs"),
        os.path.join(output_dir, ALL_DIR),
        {**settings, "frozen": frozen},
        **phase,
    )


def _recipe(options, rate, epochs):
    return Recipe(
        penalty=0.0,
        learning_rates=(rate,),
        cycle_epochs=(options[epochs],),
        momentum=MOMENTUM,
        weight_decay=WEIGHT_DECAY,
        batch_size=options["batch_size"],
        description="fine-tuning, " + epochs.replace("_", " "),
    )


def _classifier(build, weights, with_head=False):
    return network.build_classifier(
        build["width"], build["classes"], build["size"], weights, with_head=with_head
    )


def _run_phase(model_fn, recipe, run_dir, settings, train_data, val_data, seed, **train_kwargs):
    """One phase: `train()` into `run_dir`; a phase finished before (its report.json) is
    not trained again if its settings are this run's, and refused by name otherwise."""
    report_path = os.path.join(run_dir, REPORT_FILE)
    if os.path.exists(report_path):
        saved = read_json(report_path, "fine-tuning phase report").get("settings", {})
        expected = {
            **settings,
            **recipe_fields(recipe),
            "seed": seed,
            "label_smoothing": train_kwargs["label_smoothing"],
            "class_weights": train_kwargs["class_weight"],
        }
        differ = differences(saved, expected, keys=sorted(expected), label="finished phase")
        if differ:
            raise RunDirectoryError(
                f"{run_dir} holds a finished phase with other settings; resuming would mix "
                "two runs. Rerun with the same arguments, or use another output folder. "
                f"Received: {differ}"
            )
        return
    train(
        model_fn,
        train_data,
        val_data,
        recipe,
        run_dir,
        seed=seed,
        export=False,
        settings=settings,
        **train_kwargs,
    )
