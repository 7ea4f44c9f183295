"""The training commands' runs (`keras_autoshuffle.commands`): `run_from_args`, the summary.
Their shared options (`add_arguments`) are `keras_autoshuffle_cli.train`'s: parsed before
TensorFlow loads."""

import argparse
import contextlib
import dataclasses
import functools
import os
import sys
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from keras_autoshuffle.training.distribution import is_chief, make_strategy
from keras_autoshuffle.training.divergence import TrainingDivergedError
from keras_autoshuffle.training.fault_tolerance import (
    BACKUP,
    WEIGHTS_FILE,
    full_disk_error,
    locked_folder,
)
from keras_autoshuffle.training.identity import RunIdentity, recipe_fields
from keras_autoshuffle.training.loops import train
from keras_autoshuffle.training.recipes import get_recipe
from keras_autoshuffle.training.search import search_then_retrain
from keras_autoshuffle_cli._terminal import printable

if TYPE_CHECKING:
    import keras

    from keras_autoshuffle.data import EpochData


def format_run_summary(report: dict[str, Any]) -> str:
    """Human-readable lines: time, accuracies, penalty and where every file is."""
    lines = [
        f"Trained in {report['time']:.1f} s ({report['settings']['epochs']} epochs, "
        f"{report['settings']['strategy']}, {report['settings']['replicas']} replicas)"
    ]
    if report["layers"]:
        lines += [
            f"  test accuracy relaxed {report['relaxed_accuracy']:.4f}, rounded "
            f"{report['rounded_accuracy']:.4f} (relative change "
            f"{report['relative_change']:+.3e})",
            f"  sum of P(M) at hardening = {report['l12_penalty_at_hardening']:.4g} over "
            f"{len(report['layers'])} learned shuffles",
        ]
    else:  # manual shuffles: rounding changes nothing, so one accuracy
        lines.append(
            f"  test accuracy {report['final_accuracy']:.4f} (manual shuffles: nothing to harden)"
        )
    if report.get("epoch") and report["layers"]:
        lines.insert(
            2,
            f"  (hardened after epoch {report['epoch']}; final test accuracy "
            f"{report['final_accuracy']:.4f})",
        )
    for name, entry in report.get("export", {}).items():
        lines.append(f"  {name}: max |output - Keras| = {entry['max_abs_diff']:.2e}")
    from keras_autoshuffle.finetuning.report import INT8_RUNTIMES, int8_check_line

    for key in INT8_RUNTIMES:
        if key in report:
            lines.append(f"  {int8_check_line(key, report[key])}")
    for name, why in report.get("export_skipped", {}).items():
        lines.append(f"  {name}: not exported ({why})")
    lines.append("Files:")
    lines.extend(f"  {name:12s}{path}" for name, path in report["files"].items())
    return "\n".join(lines)


def make_model_fn(
    model: Literal["v1", "v2"],
    width: float,
    shuffle: Literal["manual", "auto"],
    penalty: float,
    train_data: "EpochData",
    stem: Literal["imagenet", "cifar", "auto"],
    groups: int = 3,
    padding: Literal["torch", "same"] = "torch",
    sinkhorn_iterations: int = 10,
    shuffle_initializer: Literal["random", "manual"] = "random",
    shuffle_forward: Literal["relaxed", "hard"] = "relaxed",
) -> Callable[..., "keras.Model"]:
    """A function building ShuffleNet `model` ("v1" or "v2") for `train_data`'s images;
    its keyword arguments override the builder's (e.g. `shuffle_permutations`)."""
    # The builder's arguments: this function's own by name (`groups` for v1 only), and
    # the data's image shape and classes.
    arguments = {k: v for k, v in locals().items() if k not in ("model", "train_data")}
    if model == "v2":
        del arguments["groups"]
    arguments.update(input_shape=tuple(train_data.input_shape), classes=train_data.num_classes)
    from keras_autoshuffle import applications

    def model_fn(**overrides):
        # The learned-shuffle builders: they take `shuffle` ("manual" included) and its knobs.
        builder = applications.AutoShuffleNetV2 if model == "v2" else applications.AutoShuffleNetV1
        return builder(**{**arguments, **overrides})

    return model_fn


def _argument_errors(args, recipe):
    """What the options contradict (argparse checks each alone): messages, first first."""
    from keras_autoshuffle.applications import V1_GROUPS, V1_WIDTHS, V2_WIDTHS

    errors = []
    if not args.output.strip():  # "" would write the run into the working directory
        errors.append(f"argument --output: must name a folder, got {args.output!r}")
    widths = V2_WIDTHS if args.model == "v2" else V1_WIDTHS
    if args.width not in widths:
        errors.append(
            f"argument --width: must be one of {', '.join(map(str, widths))} with --model "
            f"{args.model}, got {args.width!r}"
        )
    if args.model == "v1" and args.groups not in V1_GROUPS:
        errors.append(
            "argument --groups: must be one of "
            f"{', '.join(map(str, V1_GROUPS))} with --model v1, "
            f"got {args.groups}"
        )
    for flag, value in (
        ("search-epochs", args.search_epochs),
        ("harden-at-epoch", args.harden_at_epoch),
    ):
        if value is not None and value >= recipe.epochs:
            errors.append(
                f"argument --{flag}: must be below the run's {recipe.epochs} epochs "
                f"(--epochs), got {value}"
            )
    if args.harden_at_epoch is not None and args.strategy == "multi-worker":
        errors.append("argument --harden-at-epoch: not with --strategy multi-worker")
    if args.shuffle == "manual":
        # What only learned shuffles use means nothing with manual ones (as the study).
        meaningless = {
            "--search-epochs": args.search_epochs is not None,
            "--balanced": args.balanced,
            "--shuffle-forward hard": args.shuffle_forward != "relaxed",
            "--shuffle-initializer manual": args.shuffle_initializer != "random",
        }
        for flag in (flag for flag, given in meaningless.items() if given):
            errors.append(f"argument {flag}: needs learned shuffles (--shuffle auto)")
    if args.download and args.dataset != "cifar10":
        # The others never download: digits ship with scikit-learn, Fashion-MNIST's files
        # come from Debian or --data-dir, ImageNet's archives from --manual-dir.
        errors.append(f"argument --download: only CIFAR-10 downloads, got --dataset {args.dataset}")
    if args.no_export and args.export_formats:
        errors.append(
            "argument --export-formats: not allowed with argument --no-export, got "
            f"{','.join(args.export_formats)}"
        )
    if args.int8_max_drop is not None and not args.int8:
        errors.append(f"argument --int8-max-drop: needs --int8, got {args.int8_max_drop:g}")
    if args.int8_weight_bits is not None and not args.int8:
        errors.append(f"argument --int8-weight-bits: needs --int8, got {args.int8_weight_bits}")
    quantizable = ("litert", "onnx", "openvino")
    if args.int8 and (
        args.no_export
        or (args.export_formats and not any(f in quantizable for f in args.export_formats))
    ):
        errors.append(
            "argument --int8: needs the LiteRT, ONNX or OpenVINO export, got "
            + (
                "--no-export"
                if args.no_export
                else f"--export-formats {','.join(args.export_formats)}"
            )
        )
    return errors


def _error(parser, message):
    """Ends the program as argparse's own errors do (usage, `error: ...`, status 2)."""
    if parser is None:
        print(f"error: {printable(message)}", file=sys.stderr)
        sys.exit(2)
    parser.error(message)


def run_from_args(
    args: argparse.Namespace,
    recipe_name: str,
    stem: Literal["imagenet", "cifar", "auto"],
    manual_dir: str | None = None,
    parser: argparse.ArgumentParser | None = None,
) -> dict[str, Any]:
    """What the training commands do: load the data, build the model, `train()`, print the summary.

    Options that contradict each other or the recipe end the program before anything
    runs, as argparse's own errors do (`parser.error`: usage, `error: ...`, status 2).
    """
    recipe = get_recipe(
        recipe_name,
        epochs=args.epochs,
        batch_size=args.batch_size,
        penalty=args.penalty,
        learning_rate=args.learning_rate,
    )
    errors = _argument_errors(args, recipe)
    if errors:
        _error(parser, errors[0])
    # MultiWorkerMirroredStrategy must exist before TensorFlow runs any op.
    strategy = make_strategy(args.strategy)
    _refuse_unexportable(args)  # before the data is read
    train_data, test_data = _load_data(args, recipe, manual_dir, parser)
    model_fn = make_model_fn(
        args.model,
        args.width,
        args.shuffle,
        recipe.penalty,
        train_data,
        stem,
        args.groups,
        args.padding,
        args.sinkhorn_iterations,
        args.shuffle_initializer,
        args.shuffle_forward,
    )
    # The run's identity: the options that are its fields (the recipe's come from it).
    names = {f.name for f in dataclasses.fields(RunIdentity)} - set(recipe_fields(recipe))
    settings = {name: value for name, value in vars(args).items() if name in names}
    run = train
    if args.search_epochs is not None:
        run = functools.partial(search_then_retrain, search_epochs=args.search_epochs)
    # train()'s options that are command-line options of the same name.
    passed = ("mixed_precision", "jit_compile", "seed", "harden_at_epoch", "balanced")
    passed += ("overwrite", "verbose", "int8")
    options = {name: getattr(args, name) for name in passed}
    if args.int8_max_drop is not None:
        options["max_accuracy_drop"] = args.int8_max_drop
    if args.int8_weight_bits is not None:
        options["int8_weight_bits"] = args.int8_weight_bits
    # One run at a time in --output (a worker writes into its own folder inside it).
    lock = locked_folder(args.output) if is_chief(strategy) else contextlib.nullcontext()
    try:
        with lock:
            report = run(
                model_fn,
                train_data,
                test_data,
                recipe,
                args.output,
                strategy=strategy,
                export=args.export_formats or not args.no_export,
                settings=settings,
                **options,
            )
    # A refused folder or file, a full or read-only disk, a divergence: one line.
    except (ValueError, OSError, RuntimeError) as error:
        # The exports take at most the backup's size each (weights and optimizer state).
        backup = os.path.join(args.output, BACKUP, WEIGHTS_FILE)
        needed = os.path.getsize(backup) * 4 if os.path.isfile(backup) else 0
        full = full_disk_error(error, args.output, needed)
        if full is None and not isinstance(error, (ValueError, OSError, TrainingDivergedError)):
            raise
        sys.exit(f"error: {printable(str(full or error))}")
    print(format_run_summary(report))
    return report


def _refuse_unexportable(args):
    """Ends the program where the asked export formats (or --int8's formats) cannot be
    written by this backend, install or precision (`exports.plan_export`, as `train()`
    plans with the built model's dtypes)."""
    if not (args.export_formats or args.int8):
        return
    import keras

    from keras_autoshuffle.training.distribution import mixed_precision_policy
    from keras_autoshuffle.training.exports import plan_export

    policy = mixed_precision_policy() if args.mixed_precision else "float32"
    received = " ".join(
        ([f"--export-formats {','.join(args.export_formats)}"] if args.export_formats else [])
        + (["--int8"] if args.int8 else [])
    )
    try:
        with warnings.catch_warnings():  # train() warns of what it leaves out
            warnings.simplefilter("ignore")
            dtypes = (keras.DTypePolicy(policy).compute_dtype,)
            plan_export(args.export_formats, dtypes, args.int8, received)
    except ValueError as error:
        sys.exit(f"error: {printable(str(error))}")


def _load_data(args, recipe, manual_dir, parser):
    """(train, test) splits of --dataset (the first --max-train-examples training ones)."""
    from keras_autoshuffle import data

    try:
        train_data, test_data = data.load(
            args.dataset,
            seed=args.seed,
            data_dir=args.data_dir,
            manual_dir=manual_dir,
            download=args.download,
        )
    except data.DataMissingError as error:
        sys.exit(f"error: {printable(str(error))}")
    except Exception as error:  # TFDS's download: the network, a mirror, a missing module
        if not args.download:
            raise
        folder = args.data_dir or "TFDS's folder"
        message = (
            f"{args.dataset} could not be downloaded into {folder} ({type(error).__name__}: "
            f"{error}). Check the network and the folder, or prepare it on a machine with a "
            f"network (`tfds build {args.dataset} --data_dir DIR`) and pass --data-dir DIR."
        )
        sys.exit(f"error: {printable(message)}")
    if args.max_train_examples:
        train_data = train_data.subset(args.max_train_examples)
    if recipe.batch_size > train_data.num_examples:  # no full batch: nothing to train on
        _error(
            parser,
            f"argument --batch-size: must be at most the {train_data.num_examples} training "
            f"examples, got {recipe.batch_size}",
        )
    return train_data, test_data
