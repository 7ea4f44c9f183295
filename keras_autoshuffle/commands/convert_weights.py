"""Convert a torchvision ShuffleNetV2 checkpoint (`.pth`) into a Keras weights file.

Reads the checkpoint with torch where it is installed, else with
`keras_autoshuffle.applications.read_torch_checkpoint` (no torch needed; both of PyTorch's
formats). The width and the class count are read from the checkpoint; the Keras net is
`ShuffleNetV2(width, stem="imagenet", classes=...)`, whose logits equal torchvision's
(max difference 1e-5 to 5e-5 measured at 224x224 and 225x225 for every width).

Usage:
    autoshuffle-convert-weights shufflenetv2_x1-5666bf0f80.pth shufflenet_v2_x1_0.weights.h5

`--no-top` leaves the classifier out (for `include_top=False`, to fine-tune a new head).
The output is written atomically (under a temporary name in its folder, then moved into
place): an interrupted conversion leaves the old file or none, never half a file. Every
refusal (a damaged checkpoint, a classifier of no classes, an output in a missing folder
or that is a folder) ends the command with a message naming the file and the value.
Then, in Keras (manual shuffles, or learned ones starting at the manual shuffle):
    ShuffleNetV2(1.0, stem="imagenet", weights="shufflenet_v2_x1_0.weights.h5")
    AutoShuffleNetV2(1.0, stem="imagenet", weights="shufflenet_v2_x1_0.weights.h5",
                     shuffle_initializer="manual")
"""

import argparse
import os
import sys

import numpy as np

from keras_autoshuffle import _atomic, _startup
from keras_autoshuffle._terminal import printable
from keras_autoshuffle.applications import (
    CheckpointError,
    ShuffleNetV2,
    load_torchvision_weights,
    read_torch_checkpoint,
)
from keras_autoshuffle.applications.architecture import V2_CONFIGS
from keras_autoshuffle.applications.weights.pretrained import mark_padding
from keras_autoshuffle.applications.weights.torchvision import torchvision_width
from keras_autoshuffle.commands._help import command_parser


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


EXAMPLE = "autoshuffle-convert-weights shufflenetv2_x1-5666bf0f80.pth x1_0.weights.h5"


def parser() -> argparse.ArgumentParser:
    """The command's argument parser (its `--help` shows an example)."""
    p = command_parser("autoshuffle-convert-weights", __doc__.split("\n\n")[0], EXAMPLE)
    p.add_argument("checkpoint", help="torchvision ShuffleNetV2 checkpoint (.pth)")
    p.add_argument("output", help="Keras weights file to write (.weights.h5)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.add_argument(
        "--no-top", action="store_true", help="leave the classifier out (include_top=False)"
    )
    return p


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
