"""The training commands' command line (`keras_autoshuffle.commands`): shared options,
`run_from_args`, the summary."""

import argparse
import contextlib
import dataclasses
import functools
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from keras_autoshuffle._validation import positive_int_argument as _positive_int
from keras_autoshuffle.training.distribution import STRATEGIES, is_chief, make_strategy
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
    from keras_autoshuffle.finetuning.report import INT8_RUNTIMES

    for key, runtime in INT8_RUNTIMES.items():
        if key not in report:
            continue
        entry = report[key]
        lines.append(
            f"  int8 {runtime}: accuracy {entry['accuracy']:.4f} "
            f"(float {entry['float_accuracy']:.4f}), top-1 agreement "
            f"{entry['top1_agreement']:.4f}, {entry['size_ratio']:.2f}x smaller"
            + (" (refused: below the thresholds, no file written)" if entry.get("refused") else "")
        )
    for name, why in report.get("export_skipped", {}).items():
        lines.append(f"  {name}: not exported ({why})")
    lines.append("Files:")
    lines.extend(f"  {name:12s}{path}" for name, path in report["files"].items())
    return "\n".join(lines)


def _sinkhorn_iterations(text):
    from keras_autoshuffle.constraints import check_iterations

    try:
        return check_iterations(_positive_int(text), "sinkhorn_iterations")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _seed(text):
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2**32 - 1], got {text!r}")
    return value


def _export_formats(text):
    from keras_autoshuffle.export import FORMATS

    formats = tuple(f.strip() for f in text.split(","))
    if not all(f in FORMATS for f in formats):
        raise argparse.ArgumentTypeError(
            f"must be formats of {','.join(FORMATS)} separated by commas, got {text!r}"
        )
    return formats


class _FormatsAction(argparse.Action):
    """`--export-formats onnx openvino` or `onnx,openvino`: one flat tuple of formats."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, tuple(f for group in values for f in group))


def _non_negative_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def _non_negative_float(text):
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def _penalty(text):
    from keras_autoshuffle._validation import MAX_PENALTY

    value = _non_negative_float(text)
    if value > MAX_PENALTY:  # lambda x P(M) would overflow the loss
        raise argparse.ArgumentTypeError(f"must be at most {MAX_PENALTY:g}, got {text!r}")
    return value


def _positive_float(text):
    value = _non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def add_arguments(
    parser: argparse.ArgumentParser, datasets: Sequence[str], default_dataset: str
) -> argparse.ArgumentParser:
    """The command-line options shared by the training commands."""
    _add_network_arguments(parser, datasets, default_dataset)
    _add_training_arguments(parser)
    _add_run_arguments(parser)
    return parser


def _add_network_arguments(parser, datasets, default_dataset):
    """The data, the network and its shuffles."""
    parser.add_argument("--dataset", choices=datasets, default=default_dataset, help="data set")
    parser.add_argument("--model", choices=("v1", "v2"), default="v2", help="ShuffleNet version")
    parser.add_argument(
        "--width",
        type=float,
        default=None,
        help="width multiplier (default: 1.0 on cifar10 and imagenet2012, 0.5 on digits and "
        "fashion_mnist)",
    )
    parser.add_argument(
        "--groups", type=_positive_int, default=3, help="group count of ShuffleNet v1"
    )
    parser.add_argument(
        "--shuffle",
        choices=("manual", "auto"),
        default="manual",
        help="the channel shuffle: ShuffleNet's fixed one (manual, recommended) or "
        "AutoShuffleNet's learned one (auto, a study: it tied or lost in this project's runs)",
    )
    parser.add_argument(
        "--padding",
        choices=("torch", "same"),
        default="torch",
        help="stride-2 padding: PyTorch's (torchvision-compatible) or Keras's 'same' (no PAD "
        "ops in LiteRT)",
    )
    parser.add_argument(
        "--sinkhorn-iterations",
        type=_sinkhorn_iterations,
        default=10,
        help="constraint passes per step of each learned shuffle (1: the paper's Algorithm 1, "
        "which stalled short of permutations in docs/training.md's runs; 10 ended on them); "
        "--shuffle auto only",
    )
    parser.add_argument(
        "--shuffle-initializer",
        choices=("random", "manual"),
        default="random",
        help="where learned shuffles start: the paper's random matrix or the manual shuffle; "
        "--shuffle auto only",
    )
    parser.add_argument(
        "--shuffle-forward",
        choices=("relaxed", "hard"),
        default="relaxed",
        help="learned shuffles compute M x (relaxed) or the nearest permutation of M, with a "
        "straight-through gradient (hard); --shuffle auto only",
    )


def _add_training_arguments(parser):
    """The search, the recipe's overrides, how the steps run, the data's origin."""
    parser.add_argument(
        "--search-epochs",
        type=_non_negative_int,
        default=None,
        help="search, then retrain: learn the shuffles this many epochs (0: harden the fresh "
        "net's matrices; with --balanced, balanced hardening), then train the net with them "
        "fixed from fresh weights for the whole recipe (default: no search; --shuffle auto "
        "only)",
    )
    parser.add_argument(
        "--penalty",
        "--lambda",
        dest="penalty",
        type=_penalty,
        default=None,
        help="lambda, the weight of the learned shuffles' l1-2 penalty (default: the "
        "--dataset recipe's)",
    )
    parser.add_argument(
        "--epochs",
        type=_positive_int,
        default=None,
        help="epochs (per cycle; default: the --dataset recipe's)",
    )
    parser.add_argument(
        "--batch-size",
        type=_positive_int,
        default=None,
        help="global batch, over all replicas (default: the --dataset recipe's)",
    )
    parser.add_argument(
        "--learning-rate",
        type=_positive_float,
        default=None,
        help="the first cycle's initial learning rate (default: the --dataset recipe's)",
    )
    parser.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="auto",
        help="distribution strategy (auto: multi-worker when TF_CONFIG lists several "
        "workers, mirrored over several local GPUs, else one device)",
    )
    parser.add_argument("--mixed-precision", action="store_true", help="fp16 GPU / bf16 CPU")
    parser.add_argument("--jit-compile", action="store_true", help="XLA (slower on CPU)")
    parser.add_argument(
        "--data-dir",
        default=None,
        help="TFDS data directory (default: TFDS's, ~/tensorflow_datasets; Fashion-MNIST is "
        "also looked for in Debian's folder)",
    )
    parser.add_argument(
        "--download",
        action="store_true",
        help="download and prepare CIFAR-10 into --data-dir when it is missing there",
    )


def _add_run_arguments(parser):
    """The output, the seed, the exports, the hardening, what is shown."""
    parser.add_argument(
        "--output", required=True, help="the run's folder (created; a killed run resumes there)"
    )
    parser.add_argument(
        "--seed", type=_seed, default=0, help="seed of the weights, data order and augmentation"
    )
    parser.add_argument(
        "--max-train-examples",
        type=_positive_int,
        default=None,
        help="use only the first N training examples (default: all)",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace a finished run in --output"
    )
    parser.add_argument(
        "--no-export", action="store_true", help="write model.keras only: no SavedModel, LiteRT"
    )
    parser.add_argument(
        "--export-formats",
        type=_export_formats,
        nargs="+",
        action=_FormatsAction,
        default=None,
        help="export exactly these formats (e.g. saved_model,litert or onnx openvino), "
        "refusing before training any this backend, precision or install cannot write (onnx, "
        "openvino: pip install 'keras-autoshuffle[onnx,openvino]'; default: SavedModel and "
        "LiteRT where possible, the others left out with a warning)",
    )
    parser.add_argument(
        "--int8",
        action="store_true",
        help="also write full-integer files of the folded net (float32 in and out): "
        "model_int8.tflite, and model_int8.onnx / openvino_int8/ with ONNX / OpenVINO exports "
        "(OpenVINO's: pip install 'keras-autoshuffle[openvino-int8]'), calibrated on training "
        "images, checked on the test set (top-1 agreement with the float model >= 0.99, "
        "accuracy drop <= 0.5 points; refused below them)",
    )
    parser.add_argument(
        "--balanced",
        action="store_true",
        help="balanced hardening: permutations that fold as cheaply as the manual shuffle "
        "(--shuffle auto only)",
    )
    parser.add_argument(
        "--harden-at-epoch",
        type=_positive_int,
        default=None,
        help="harden after this many epochs and fine-tune the rest (default: at the end)",
    )
    parser.add_argument(
        "--verbose",
        type=int,
        default=1,
        choices=(0, 1, 2),
        help="Keras's verbose: 0 silent, 1 progress bar, 2 one line per epoch",
    )


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
        print(f"error: {message}", file=sys.stderr)
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
                **{name: getattr(args, name) for name in passed},
            )
    # A refused folder or file, a full or read-only disk, a divergence: one line.
    except (ValueError, OSError, RuntimeError) as error:
        # The exports take at most the backup's size each (weights and optimizer state).
        backup = os.path.join(args.output, BACKUP, WEIGHTS_FILE)
        needed = os.path.getsize(backup) * 4 if os.path.isfile(backup) else 0
        full = full_disk_error(error, args.output, needed)
        if full is None and not isinstance(error, (ValueError, OSError, TrainingDivergedError)):
            raise
        sys.exit(f"error: {full or error}")
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
        sys.exit(f"error: {error}")


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
        sys.exit(f"error: {error}")
    except Exception as error:  # TFDS's download: the network, a mirror, a missing module
        if not args.download:
            raise
        folder = args.data_dir or "TFDS's folder"
        sys.exit(
            f"error: {args.dataset} could not be downloaded into {folder} "
            f"({type(error).__name__}: {error}). Check the network and the folder, or prepare "
            f"it on a machine with a network (`tfds build {args.dataset} --data_dir DIR`) and "
            "pass --data-dir DIR."
        )
    if args.max_train_examples:
        train_data = train_data.subset(args.max_train_examples)
    if recipe.batch_size > train_data.num_examples:  # no full batch: nothing to train on
        _error(
            parser,
            f"argument --batch-size: must be at most the {train_data.num_examples} training "
            f"examples, got {recipe.batch_size}",
        )
    return train_data, test_data
