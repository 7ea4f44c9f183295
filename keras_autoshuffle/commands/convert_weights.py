"""`autoshuffle-convert-weights`'s work: `main` converts a torchvision ShuffleNetV2
checkpoint into a Keras weights file, with `read_checkpoint`, `model_for`, `check_output` and
`write_weights`. The command line (`parser`, the options' help, the command's description)
is `keras_autoshuffle_cli.convert_weights`, which the installed command runs first: `--help`
without TensorFlow.
"""

import os
import sys

import numpy as np

from keras_autoshuffle import _atomic, _startup
from keras_autoshuffle.applications import (
    CheckpointError,
    ShuffleNetV2,
    load_torchvision_weights,
    read_torch_checkpoint,
)
from keras_autoshuffle.applications.architecture import V2_CONFIGS
from keras_autoshuffle.applications.weights.pretrained import mark_padding
from keras_autoshuffle.applications.weights.torchvision import torchvision_width
from keras_autoshuffle_cli._terminal import printable
from keras_autoshuffle_cli.convert_weights import parser


def read_checkpoint(path):
    """The state dict of a `.pth` file, read without running any pickled code: with
    `torch.load(weights_only=True)` where torch is installed, else with this package's
    `read_torch_checkpoint` (NumPy only; the same arrays, bit for bit, on the test files)."""
    try:
        import torch
    except ImportError:
        try:
            return read_torch_checkpoint(path)
        except CheckpointError as error:
            sys.exit(printable(str(error)))
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for a damaged or foreign file
        sys.exit(
            printable(
                f"{path} is not a readable PyTorch checkpoint ({type(error).__name__}: {error})"
            )
        )
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        sys.exit(f"{path} holds a {type(state).__name__}, not a state dict.")
    return state


def model_for(state_dict, include_top=True, path="the checkpoint"):
    """The ShuffleNetV2 the state dict's shapes describe (`path` names it in refusals)."""
    fc = state_dict.get("fc.weight")
    if "conv5.0.weight" not in state_dict or (include_top and fc is None):
        sys.exit(f"{path} is not a torchvision ShuffleNetV2 (no conv5.0 / fc weights).")
    try:
        width = torchvision_width(state_dict)
    except ValueError as error:
        sys.exit(printable(f"{path}: {error}"))
    if width is None:
        shape = tuple(np.shape(state_dict["conv5.0.weight"]))
        sys.exit(
            f"{path}: no torchvision ShuffleNetV2 width has this checkpoint's stage-4 channels. "
            f"Received: conv5.0.weight of shape {shape}"
        )
    classes = 1000
    if include_top:
        shape = tuple(np.shape(fc))
        features = V2_CONFIGS[width][-1]
        if len(shape) != 2 or shape[0] < 1 or shape[1] != features:
            sys.exit(
                f"{path}: the classifier fc.weight must have shape (classes >= 1, {features}) "
                f"for ShuffleNetV2 x{width:g}. Received: fc.weight of shape {shape}"
            )
        classes = int(shape[0])
    try:
        return ShuffleNetV2(
            width,
            include_top=include_top,
            stem="imagenet",
            input_shape=(224, 224, 3),
            classes=classes,
            classifier_activation=None,
        )
    except ValueError as error:
        sys.exit(printable(f"{path}: {error}"))


def check_output(output, overwrite):
    """Refuses, before anything is read, an output the command cannot write (`sys.exit`)."""
    if not output.endswith(".weights.h5"):
        sys.exit(f"The output must end in .weights.h5. Received: output={output!r}")
    folder = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(folder):
        sys.exit(
            f"The output's folder {folder} does not exist (or is not a folder): create it "
            f"first. Received: output={output!r}"
        )
    if os.path.isdir(output):
        sys.exit(
            f"The output {output} is a folder; --overwrite replaces files only. Received: "
            f"output={output!r}"
        )
    if os.path.lexists(output) and not overwrite:
        sys.exit(f"{output} exists; pass --overwrite to replace it. Received: output={output!r}")


def write_weights(model, output):
    """Writes `model`'s weights to `output` atomically, marked as fitting PyTorch's padding
    (so a padding="same" net refuses the file)."""

    def write(temporary):
        model.save_weights(temporary)
        mark_padding(temporary, "torch")

    try:
        _atomic.write_atomically(output, write)
    except OSError as error:
        sys.exit(
            printable(
                f"Cannot write {output} ({type(error).__name__}: {error}); nothing was "
                f"written. Received: output={output!r}"
            )
        )


def main(argv: list[str] | None = None) -> int:
    """Runs the `autoshuffle-convert-weights` command on `argv` (default: the command line);
    returns 0, or exits with a one-line message (status 1) on a refused file."""
    args = parser().parse_args(argv)
    _startup.find_devices_quietly()  # before TensorFlow first looks for them, noisily
    check_output(args.output, args.overwrite)
    state_dict = read_checkpoint(args.checkpoint)
    model = model_for(state_dict, include_top=not args.no_top, path=args.checkpoint)
    try:
        load_torchvision_weights(model, state_dict)
    except ValueError as error:
        sys.exit(printable(f"{args.checkpoint}: {error}"))
    write_weights(model, args.output)
    top = "no classifier" if args.no_top else f"{model.output_shape[-1]} classes"
    print(f"wrote {args.output}: {model.name}, {model.count_params():,} parameters, {top}")
    return 0
