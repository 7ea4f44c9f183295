"""Reading an image folder in `fit`: an iterator per epoch against one per fit, side by side.

    python -m experiments.fit_iterators --json docs/results/fit_iterators.json

In one process, in interleaved rounds: a fine-tuning phase's reading of a folder of
synthetic photos (`experiments.finetune_throughput.write_photos`), a ShuffleNet v2 of
`--width` (random seeded weights, the same each round; 0: global pooling and a dense
layer, the reading alone) trained for `--epochs` with a validation pass each epoch, then
evaluated and its validation probabilities predicted, by

- "per_epoch": the pipeline's dataset of one epoch (`fit_dataset` before this change, a
  cardinality of one epoch's steps) and the validation split as it is: Keras opens two
  training iterators an epoch (the next one at an epoch's end, another at the next
  epoch's start), two per validation pass, evaluation and prediction;
- "one_per_fit": the package's: the endless `fit_dataset` with `steps_per_epoch`, the
  validation split repeated with `validation_steps`, `_keras_internals.one_pass` for the
  evaluation and the prediction.

Before timing, a round of each counts the tf.data iterators it opens, and their weights
are compared (the same batches in the same order give the same weights). Rows: seconds
per round of each route, and one_per_fit over per_epoch per round (median, 95% bootstrap
interval: `experiments.timing.paired_ratio`).
"""

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

from experiments.finetune_throughput import environment, write_photos, write_rows  # noqa: E402
from experiments.timing import paired_ratio  # noqa: E402


def per_epoch_dataset(train, batch_size, counter):
    """`fit_dataset` before this change: the epoch `counter` holds, one epoch long."""
    import tensorflow as tf

    data = tf.data.Dataset.from_tensors(0).map(lambda _: counter.variable.read_value())
    data = data.flat_map(lambda epoch: train.epoch_dataset(epoch, batch_size))
    return data.apply(tf.data.experimental.assert_cardinality(train.steps(batch_size)))


class IteratorCount:
    """Counts the tf.data iterators opened while active (TensorFlow's op wrapper, private:
    no public hook sees an iterator open)."""

    def __enter__(self):
        from tensorflow.python.ops import gen_dataset_ops

        self.module, self.original, self.count = gen_dataset_ops, gen_dataset_ops.make_iterator, 0

        def counted(*args, **kwargs):
            self.count += 1
            return self.original(*args, **kwargs)

        gen_dataset_ops.make_iterator = counted
        return self

    def __exit__(self, *exc):
        self.module.make_iterator = self.original


def phase(route, train, val, args):
    """One phase's reading by `route`; returns the trained weights."""
    import keras

    from keras_autoshuffle._keras_internals import one_pass
    from keras_autoshuffle.applications import ShuffleNetV2
    from keras_autoshuffle.data.pipeline import EpochCounter

    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    shape = (args.size, args.size, 3)
    if args.width:
        model = ShuffleNetV2(args.width, weights=None, input_shape=shape, classes=2)
    else:  # a net whose step costs next to nothing: the reading alone
        layers = [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2, "softmax")]
        model = keras.Sequential([keras.Input(shape), *layers])
    model.compile("sgd", "sparse_categorical_crossentropy", metrics=["accuracy"])
    counter, batch = EpochCounter(), args.batch
    test = val.eval_dataset(batch)
    if route == "per_epoch":
        fit = dict(x=per_epoch_dataset(train, batch, counter), validation_data=test)
        reads = {"x": test}
    else:
        fit = dict(x=train.fit_dataset(batch, counter), steps_per_epoch=train.steps(batch))
        fit.update(validation_data=test.repeat(), validation_steps=val.steps(batch, False))
        reads = one_pass(test)
    model.fit(**fit, epochs=args.epochs, callbacks=[counter.callback()], verbose=0)
    model.evaluate(**reads, verbose=0)
    model.predict(**reads, verbose=0)
    return model.get_weights()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=float, default=0.5, help="0: pooling and a dense layer")
    parser.add_argument("--size", type=int, default=64, help="image size")
    parser.add_argument("--photos", type=int, default=96, help="training photos")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5, help="rounds")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)

    from keras_autoshuffle import data

    folder = tempfile.mkdtemp()
    root, examples = write_photos(folder, 640, 480, args.photos + args.photos // 4)
    options = dict(image_size=args.size, seed=1)
    train = data.ImageFolderData(root, examples[: args.photos], 2, **options)
    val = data.ImageFolderData(root, examples[args.photos :], 2, training=False, **options)
    routes = ("per_epoch", "one_per_fit")
    weights, iterators = [], {}
    for route in routes:
        with IteratorCount() as opened:
            weights.append(phase(route, train, val, args))
        iterators[route] = opened.count
    same = all(np.array_equal(a, b) for a, b in zip(*weights, strict=True))
    print("same weights:", same, "iterators opened:", iterators, flush=True)
    seconds = {route: [] for route in routes}
    for _ in range(args.repeats):
        for route in routes:
            start = time.perf_counter()
            phase(route, train, val, args)
            seconds[route].append(time.perf_counter() - start)
        print({route: round(s[-1], 2) for route, s in seconds.items()}, flush=True)
    ratio = paired_ratio(seconds["one_per_fit"], seconds["per_epoch"])
    document = {
        "experiment": "fit_iterators",
        "command": "python -m experiments.fit_iterators "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "environment": environment(),
        "settings": vars(args),
        "same_weights": same,
        "iterators_opened": iterators,
        "rows": [
            {"route": route, "seconds": float(np.median(s)), "rounds": [round(x, 2) for x in s]}
            for route, s in seconds.items()
        ],
        "one_per_fit_over_per_epoch": [round(v, 3) for v in ratio],
    }
    print(document["rows"], document["one_per_fit_over_per_epoch"], flush=True)
    write_rows(args.json, document)


if __name__ == "__main__":
    main()
