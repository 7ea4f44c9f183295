"""What balanced hardening costs in accuracy, measured on the embedded digits.

Trains an AutoShuffleNet (CIFAR stem) with the digits preset, then, from the same relaxed
weights, rounds its shuffles two ways: plain hardening (nearest permutations) and balanced
hardening (nearest permutations that fold into the manual net's routing cost, see
docs/lab-notes/inference.md). Each is evaluated as rounded and after a short fine-tuning with the
permutations fixed (SGD, lr 0.02 decaying linearly to 0, momentum 0.9).

Run: python examples/balanced_hardening_cost.py --model v2 [--epochs 10] [--finetune 3]
"""

import argparse
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402

import keras_autoshuffle as ka  # noqa: E402
from keras_autoshuffle import data, training  # noqa: E402
from keras_autoshuffle.applications import AutoShuffleNetV1, AutoShuffleNetV2  # noqa: E402

BATCH = 64


def build(name, penalty, train):
    common = dict(input_shape=train.input_shape, classes=train.num_classes, stem="cifar")
    if name == "v1":
        return AutoShuffleNetV1(width=0.5, groups=3, penalty=penalty, **common)
    return AutoShuffleNetV2(width=0.5, penalty=penalty, **common)


def accuracy(model, test):
    return model.evaluate(test.eval_dataset(BATCH), verbose=0, return_dict=True)["accuracy"]


def finetune(model, train, first_epoch, epochs):
    steps = train.steps(BATCH) * epochs
    schedule = keras.optimizers.schedules.PolynomialDecay(0.02, steps, 0.0)
    model.compile(
        optimizer=keras.optimizers.SGD(schedule, momentum=0.9),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    for epoch in range(first_epoch, first_epoch + epochs):
        model.fit(train.epoch_dataset(epoch, BATCH), epochs=1, verbose=0)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("v1", "v2"), default="v2")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--finetune", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    keras.utils.set_random_seed(args.seed)
    train, test = data.digits(seed=args.seed)
    recipe = training.get_recipe("digits", epochs=args.epochs)
    model = build(args.model, recipe.penalty, train)
    model.compile(
        optimizer=training.make_optimizer(recipe, train.steps(BATCH), model),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    counter = data.EpochCounter()
    model.fit(
        train.fit_dataset(BATCH, counter),
        epochs=recipe.epochs,
        callbacks=[counter.callback()],
        verbose=0,
    )
    penalty = ka.total_l12_penalty(model)
    print(f"relaxed: accuracy {accuracy(model, test):.4f}, penalty sum {penalty:.1f}")
    path = os.path.join(tempfile.mkdtemp(), "relaxed.keras")
    model.save(path)
    for balanced in (False, True):
        rounded = keras.saving.load_model(path, safe_mode=True)
        report = ka.harden_model(rounded, balanced=balanced, time_limit=60)
        name = "balanced" if balanced else "plain"
        line = f"{name}: rounded {accuracy(rounded, test):.4f}"
        if balanced:
            kept = sum(e["mass"] for e in report if "mass" in e)
            plain = sum(e["plain_mass"] for e in report if "mass" in e)
            proven = all(e.get("optimal", True) for e in report)
            line += f" (matched mass {kept / plain:.3f} of plain's, all optimal: {proven})"
        if args.finetune:
            finetune(rounded, train, recipe.epochs, args.finetune)
            line += f", after {args.finetune} epochs of fine-tuning {accuracy(rounded, test):.4f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
