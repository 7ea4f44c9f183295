"""Fashion-MNIST as a folder of PNG files: real images, laid out as `autoshuffle-finetune` reads.

    python -m experiments.fashion_mnist_folder OUTPUT --classes 5 6 7 8 9 \\
        --train-per-class 100 --val-per-class 300 --seed 0

writes `OUTPUT/train/<class name>/<index>.png` from the training IDX files and
`OUTPUT/val/<class name>/<index>.png` from the test IDX files (Debian's
`dataset-fashion-mnist`, read by `keras_autoshuffle.data.load_fashion_mnist`): 28x28
grey PNGs (mode L), pixel for pixel the IDX arrays, `<index>` being the image's position
in its IDX file. Per class, a seeded choice of `--train-per-class` training images
(`--seed`) and `--val-per-class` test images (`--val-seed`, so that runs of different
seeds share one validation set); without a count, all of that class's images.

The choice of class `c` is the first `n` of a permutation of its images seeded by
`(seed, c, split)`: it does not depend on which other classes are written, and for one
seed a smaller choice is part of a larger one (20 per class are among the 100).

The folder is written under `OUTPUT.partial` and renamed into place, so a killed writer
leaves no half folder (a leftover `.partial` is removed by the next call). An existing
`OUTPUT` holding exactly the files asked for is kept (nothing is written); one holding
anything else is refused.
"""

import argparse
import json
import os
import shutil
import sys

import numpy as np

CLASS_NAMES = (
    "T-shirt_top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle_boot",
)
"""Fashion-MNIST's class names by label, as folder names (no '/' or spaces)."""

# The folder of each split and the IDX split its images come from.
SPLITS = {"train": "train", "val": "test"}
_SPLIT_CODES = {"train": 0, "val": 1}


def check_classes(classes):
    """`classes` as a tuple of distinct labels 0..9, at least two (a classifier's)."""
    classes = tuple(classes)
    if (
        len(classes) < 2
        or len(set(classes)) != len(classes)
        or not all(isinstance(c, (int, np.integer)) and not isinstance(c, bool) for c in classes)
        or not all(0 <= c < len(CLASS_NAMES) for c in classes)
    ):
        raise ValueError(
            "`classes` must be at least two distinct Fashion-MNIST labels in 0..9. "
            f"Received: classes={classes!r}"
        )
    return tuple(int(c) for c in classes)


def _check_count(value, name):
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1
    ):
        raise ValueError(f"`{name}` must be a positive integer or None. Received: {value!r}")


def choose(labels, classes, per_class, seed, split="train"):
    """The images of each class to write: `{class: sorted indices into labels}`.

    Per class `c`, the first `per_class` of a permutation of its indices seeded by
    `(seed, c, split)` (all its indices when `per_class` is None).

    Raises:
        ValueError: a class has fewer than `per_class` images.
    """
    chosen = {}
    for c in classes:
        indices = np.flatnonzero(np.asarray(labels) == c)
        if per_class is not None:
            if per_class > len(indices):
                raise ValueError(
                    f"Class {c} ({CLASS_NAMES[c]}) has {len(indices)} images in the {split} "
                    f"split, fewer than asked for. Received: per_class={per_class}"
                )
            rng = np.random.default_rng([seed, c, _SPLIT_CODES[split]])
            indices = np.sort(indices[rng.permutation(len(indices))[:per_class]])
        chosen[c] = indices
    return chosen


def planned_files(classes, train_per_class=None, val_per_class=None, seed=0, val_seed=0, data=None):
    """`{split folder: {class name: sorted indices}}` of what `write_folder` writes; `data`:
    `load_fashion_mnist`'s `((x_train, y_train), (x_test, y_test))`."""
    (_, y_train), (_, y_test) = data
    labels = {"train": y_train, "val": y_test}
    counts = {"train": (train_per_class, seed), "val": (val_per_class, val_seed)}
    return {
        split: {
            CLASS_NAMES[c]: indices
            for c, indices in choose(labels[split], classes, *counts[split], split).items()
        }
        for split in SPLITS
    }


def _listing(folder):
    """`{split: {class name: sorted file names}}` of an image folder (None for anything
    that is not that layout)."""
    found = {}
    for split in sorted(os.listdir(folder)):
        path = os.path.join(folder, split)
        if not os.path.isdir(path) or os.path.islink(path):
            return None
        found[split] = {}
        for name in sorted(os.listdir(path)):
            inner = os.path.join(path, name)
            if not os.path.isdir(inner) or os.path.islink(inner):
                return None
            found[split][name] = sorted(os.listdir(inner))
    return found


def _summary(output, plan, reused):
    return {
        "output": os.fspath(output),
        "classes": list(plan["train"]),
        "images": {split: {k: len(v) for k, v in plan[split].items()} for split in plan},
        "reused": reused,
    }


def write_folder(
    output,
    classes,
    train_per_class=None,
    val_per_class=None,
    seed=0,
    val_seed=0,
    data_dir=None,
):
    """Writes Fashion-MNIST images of `classes` as `output/{train,val}/<class name>/<i>.png`.

    Args:
        output: the folder to create (its parent must exist).
        classes: Fashion-MNIST labels (0..9), at least two.
        train_per_class: training images per class (None: all 6,000), chosen by `seed`.
        val_per_class: test images per class in `val/` (None: all 1,000), chosen by
            `val_seed`.
        seed: picks the training images.
        val_seed: picks the validation images (kept fixed across runs of one study).
        data_dir: where the IDX files are (default: `load_fashion_mnist`'s places).

    Returns:
        `{"output", "classes": [names], "images": {split: {name: count}}, "reused"}`;
        `reused` is True where `output` already held exactly these files.

    Raises:
        FileExistsError: `output` exists and holds anything else.
        ValueError: bad classes or counts, or a class with fewer images than asked for.
    """
    from PIL import Image

    from keras_autoshuffle.data import load_fashion_mnist

    classes = check_classes(classes)
    _check_count(train_per_class, "train_per_class")
    _check_count(val_per_class, "val_per_class")
    output = os.path.abspath(os.fspath(output))
    data = load_fashion_mnist(data_dir)
    plan = planned_files(classes, train_per_class, val_per_class, seed, val_seed, data)
    expected = {
        split: {name: sorted(f"{i}.png" for i in indices) for name, indices in per.items()}
        for split, per in plan.items()
    }
    if os.path.lexists(output) and not (os.path.isdir(output) and not os.listdir(output)):
        found = _listing(output) if os.path.isdir(output) else None
        if found != expected:
            raise FileExistsError(
                f"{output} exists and does not hold exactly the images asked for (other "
                "classes, counts or seeds, or other files); remove it or choose another "
                f"output. Received: classes={list(classes)}, train_per_class={train_per_class}, "
                f"val_per_class={val_per_class}, seed={seed}, val_seed={val_seed}"
            )
        return _summary(output, plan, reused=True)
    temporary = output + ".partial"
    if os.path.lexists(temporary):
        shutil.rmtree(temporary)  # a killed writer's
    images = {"train": data[0][0], "val": data[1][0]}
    try:
        for split, per in plan.items():
            for name, indices in per.items():
                folder = os.path.join(temporary, split, name)
                os.makedirs(folder)
                for i in indices:
                    Image.fromarray(np.ascontiguousarray(images[split][i])).save(
                        os.path.join(folder, f"{i}.png"), format="PNG"
                    )
        os.replace(temporary, output)  # an empty `output` directory is replaced too
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return _summary(output, plan, reused=False)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", help="the folder to create")
    parser.add_argument(
        "--classes", type=int, nargs="+", default=list(range(10)), help="labels 0..9"
    )
    parser.add_argument("--train-per-class", type=int, default=None, help="default: all")
    parser.add_argument("--val-per-class", type=int, default=None, help="default: all")
    parser.add_argument("--seed", type=int, default=0, help="picks the training images")
    parser.add_argument("--val-seed", type=int, default=0, help="picks the validation images")
    parser.add_argument("--data-dir", default=None, help="the folder of the IDX files")
    args = parser.parse_args(argv)
    try:
        summary = write_folder(
            args.output,
            args.classes,
            args.train_per_class,
            args.val_per_class,
            args.seed,
            args.val_seed,
            args.data_dir,
        )
    except (ValueError, FileExistsError) as error:
        parser.error(str(error))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
