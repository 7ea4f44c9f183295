"""The cached training pipeline before and after issue 40's speed-up, side by side.

    python -m experiments.pipeline_speed --json runs/pipeline_speed.json

In one process, in interleaved rounds (a new random order each round), one training
epoch of `ImageFolderData.fit_dataset` through a new iterator from the
decoded-image cache, on `experiments.finetune_throughput`'s synthetic photos, by:

- "old": the pipeline before, rebuilt here (`Legacy`): one map reading each example and
  a second map augmenting it, the crop resized from uint8, the normalisation with
  per-channel constants broadcast by TensorFlow;
- "new": the library's pipeline: one map reading and augmenting each example, the crop
  cast to float32 before the resize (the same pixels), the normalisation with the
  constants repeated along each row of pixels (the same within float32 rounding).

Each photo size is measured with the folder's images ("epoch") and with them listed 4
times ("epoch x4": a longer epoch, the per-epoch start-up spread over 4x the images);
the difference between the two gives the start-up per epoch (the iterator and the map
functions built, optimised and instantiated again each epoch, as `model.fit` opens a
new iterator each epoch). Before timing, the old and new batches of one epoch are
compared (the largest difference is reported: float32 rounding of the normalisation).

Rows: the median images/s of each (photo, pipeline, epoch) with its rounds, the process
CPU seconds per image, and new over old per round (median and 95% bootstrap interval,
`experiments.timing.paired_ratio`).
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

DEFAULT_PHOTOS = ("1600x1200:200", "640x480:200", "4000x3000:64")
REPEATS = {"epoch": 1, "epoch x4": 4}


def legacy_class():
    """`ImageFolderData` with the training epoch as it was before this change."""
    import tensorflow as tf

    from keras_autoshuffle import applications, data
    from keras_autoshuffle.data.pipeline import example_seed

    def augment(image, seed, size, flip):
        seeds = tf.random.experimental.stateless_split(seed, 2)
        begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
            tf.shape(image),
            bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
            seed=seeds[0],
            min_object_covered=0.0,
            aspect_ratio_range=(3 / 4, 4 / 3),
            area_range=(0.08, 1.0),
            max_attempts=10,
            use_image_if_no_bounding_boxes=True,
        )
        image = tf.image.resize(tf.slice(image, begin, crop_size), (size, size), "bilinear")
        if flip:
            image = tf.image.stateless_random_flip_left_right(image, seed=seeds[1])
        image = tf.cast(image, tf.float32) / 255.0
        mean = tf.constant(applications.IMAGENET_MEAN, tf.float32)
        return (image - mean) / tf.constant(applications.IMAGENET_STD, tf.float32)

    class Legacy(data.ImageFolderData):
        def epoch_dataset(self, epoch, batch_size, training=True, num_shards=1, shard_index=0):
            assert training and num_shards == 1
            examples = self._examples(
                epoch, True, lambda image, label, index: (image, label, index)
            )
            augmented = examples.map(
                lambda image, label, index: (
                    augment(
                        image, example_seed(self.seed, epoch, index), self.image_size, self.flip
                    ),
                    label,
                ),
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True,
            )
            return augmented.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    return Legacy


def main(argv=None):
    from experiments.finetune_throughput import parse_photos, write_photos

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=None, help="write the rows here")
    parser.add_argument(
        "--photos", nargs="+", type=parse_photos, default=[parse_photos(p) for p in DEFAULT_PHOTOS]
    )
    parser.add_argument("--folder", default=os.path.join("runs", "finetune_throughput_photos"))
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=10, help="rounds")
    parser.add_argument("--note", default="", help="what else ran on the machine")
    args = parser.parse_args(argv)

    from experiments.finetune_throughput import environment
    from experiments.timing import paired_ratio
    from keras_autoshuffle import data
    from keras_autoshuffle.data.pipeline import EpochCounter
    from keras_autoshuffle.training.loops import reproducible_steps

    classes = {"old": legacy_class(), "new": data.ImageFolderData}
    functions, counts, largest_difference = {}, {}, {}

    def epoch_function(train):
        counter, epoch = EpochCounter(), [0]
        dataset = train.fit_dataset(args.batch, counter).take(train.steps(args.batch))

        def run():
            epoch[0] += 1
            counter.variable.assign(epoch[0])
            for _ in dataset:
                pass

        return run

    with reproducible_steps():  # as training.train runs the pipeline
        for width, height, count in args.photos:
            photo = f"{width}x{height}"
            root, examples = write_photos(args.folder, width, height, count)
            cache = os.path.join(args.folder, f"cache_{photo}_{args.size}")
            made = {}
            for (pipeline, cls), (epoch, repeat) in (
                (c, r) for c in classes.items() for r in REPEATS.items()
            ):
                train = cls(root, examples * repeat, 2, image_size=args.size, seed=1)
                train.cache_images(cache)
                made[pipeline, epoch] = train
                functions[photo, pipeline, epoch] = epoch_function(train)
                counts[photo, pipeline, epoch] = train.steps(args.batch) * args.batch
            old, new = (
                [x.numpy() for x, _ in made[p, "epoch"].epoch_dataset(3, args.batch)]
                for p in ("old", "new")
            )
            largest_difference[photo] = float(
                max(np.abs(a - b).max() for a, b in zip(old, new, strict=True))
            )
            print(photo, "largest |new - old| of one epoch:", largest_difference[photo])
        names = list(functions)
        for name in names:
            functions[name]()  # traced, files in the page cache
        wall = {name: [] for name in names}
        cpu = {name: [] for name in names}
        order, load_average = np.random.default_rng(0), []
        for round_index in range(args.repeats):
            for i in order.permutation(len(names)):
                name = names[i]
                start, start_cpu = time.perf_counter(), time.process_time()
                functions[name]()
                wall[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
            load_average.append(list(os.getloadavg()))
            print(round_index, load_average[-1], flush=True)

    rows = []
    for width, height, _ in args.photos:
        photo = f"{width}x{height}"
        for epoch in REPEATS:
            rates = {}
            for pipeline in classes:
                name = photo, pipeline, epoch
                rates[pipeline] = [counts[name] / s for s in wall[name]]
                rows.append(
                    {
                        "photo": photo,
                        "pipeline": pipeline,
                        "epoch": epoch,
                        "images": counts[name],
                        "images_per_s": round(float(np.median(rates[pipeline])), 1),
                        "rounds": [round(r, 1) for r in rates[pipeline]],
                        "cpu_ms_per_image": round(
                            1000 * float(np.median(cpu[name])) / counts[name], 3
                        ),
                    }
                )
            found = paired_ratio(wall[photo, "old", epoch], wall[photo, "new", epoch])
            rows.append(
                {
                    "photo": photo,
                    "epoch": epoch,
                    "new_over_old": [round(v, 3) for v in found],
                }
            )
        for pipeline in classes:
            short, long = (np.median(wall[photo, pipeline, e]) for e in REPEATS)
            n_short, n_long = (counts[photo, pipeline, e] for e in REPEATS)
            per_image = (long - short) / (n_long - n_short)
            rows.append(
                {
                    "photo": photo,
                    "pipeline": pipeline,
                    "start_up_s_per_epoch": round(float(short - n_short * per_image), 3),
                    "images_per_s_without_start_up": round(1 / per_image, 1),
                }
            )
    document = {
        "experiment": "pipeline_speed",
        "issue": 40,
        "command": "python -m experiments.pipeline_speed "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "environment": environment(),
        "note": args.note,
        "rounds": args.repeats,
        "load_average_rounds": load_average,
        "largest_difference": largest_difference,
        "rows": rows,
    }
    for row in rows:
        print(json.dumps(row))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(document, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
