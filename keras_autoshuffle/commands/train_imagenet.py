"""Train a (Auto)ShuffleNet on ImageNet (ILSVRC 2012) with the paper's two-cycle recipe.

    autoshuffle-train-imagenet --data-dir ~/tensorflow_datasets \
        --manual-dir ~/imagenet_archives --model v2 --width 1.0 --output runs/imagenet

ImageNet cannot be downloaded automatically: put ILSVRC2012_img_train.tar and
ILSVRC2012_img_val.tar (from image-net.org) in --manual-dir; TFDS prepares them once.
The recipe: two cycles of 100 epochs (--epochs sets each), lr 0.2 then 0.1 decaying
linearly, the second cycle continuing from the first one's weights; momentum 0.9, weight
decay 4e-5, lambda 2e-3, global batch 512. Outputs as `autoshuffle-train`'s.
Across hosts: set TF_CONFIG on every host and pass --strategy multi-worker.
"""

import argparse


def main(argv=None):
    """Runs the `autoshuffle-train-imagenet` command on `argv` (default: the command line)."""
    from keras_autoshuffle import training

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    training.add_arguments(parser, ("imagenet2012",), "imagenet2012")
    parser.add_argument("--manual-dir", default=None, help="folder with the ImageNet tar files")
    args = parser.parse_args(argv)
    if args.width is None:
        args.width = 1.0
    training.run_from_args(
        args, recipe_name="imagenet", stem="imagenet", manual_dir=args.manual_dir, parser=parser
    )
    return 0
