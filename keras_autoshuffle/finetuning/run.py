"""`finetune()`: a pretrained ShuffleNet v2 fine-tuned on a folder of labelled images,
exported for phones and servers, and reported.

The recipe (keras.io's transfer-learning guide, with timm's label smoothing):

1. the head phase: the new classifier alone, the base frozen (BatchNormalization in
   inference mode), `head_epochs` epochs at ten times the learning rate;
2. the whole-net phase: every layer but BatchNormalization, `epochs` epochs at
   `learning_rate`.

Both are SGD with momentum 0.9, the rate decaying linearly to 0 over the phase, with
label smoothing and, for folders whose classes differ in size, class weights. Each phase is
a `training.train()` run in a folder of its own, with its guarantees: a kill at any instant
loses no finished epoch and a rerun resumes it; a rerun with other settings is refused by
name.

What `output_dir` holds, in the order it is written:

    split.json, labels.txt, preprocessing.json    the images used, the classes, the inputs
    train_head/, train_all/                       the phases' runs (history.csv, logs/)
    model.keras, model.tflite, model.onnx, openvino/ (and with int8: model_int8.tflite,
        model_int8.onnx, openvino_int8/)
    preset/                                       the keras-hub preset: model, labels,
                                                  preprocessing (`from_preset`)
    confusion_matrix.png, report.md, report.json  report.json last: the run is finished
"""

import datetime
import functools
import hashlib
import json
import os

import keras
import numpy as np

from keras_autoshuffle import _atomic, _validation
from keras_autoshuffle import export as export_lib
from keras_autoshuffle._keras_internals import one_pass
from keras_autoshuffle.applications import IMAGENET_MEAN, IMAGENET_STD, evaluation_sizes
from keras_autoshuffle.data.image_folder import image_folder
from keras_autoshuffle.data.images import read_image
from keras_autoshuffle.export import int8_runtimes, metadata
from keras_autoshuffle.finetuning import arguments, evaluation, network, run_folder
from keras_autoshuffle.finetuning.phases import train_phases
from keras_autoshuffle.finetuning.raw_inputs import raw_input_model
from keras_autoshuffle.finetuning.report import classification_metrics, cpu_name, write_report
from keras_autoshuffle.finetuning.run_folder import (
    ALL_DIR,
    CACHE_DIR,
    LABELS_FILE,
    PREPROCESSING_FILE,
    PRESET_DIR,
    SPLIT_FILE,
)
from keras_autoshuffle.training import exports as training_exports
from keras_autoshuffle.training.fault_tolerance import locked_folder


def finetune(
    images: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    width: float = 1.0,
    weights: str | os.PathLike | None = "imagenet",
    image_size: int = 224,
    epochs: int = 10,
    head_epochs: int | None = None,
    batch_size: int = 32,
    learning_rate: float | None = None,
    label_smoothing: float = 0.1,
    class_weights: str | None = "balanced",
    val_fraction: float = 0.2,
    split_seed: int = 0,
    flip: bool = True,
    seed: int = 0,
    export_formats: tuple[str, ...] | None = None,
    int8: bool = False,
    max_accuracy_drop: float = export_lib.MAX_ACCURACY_DROP,
    int8_weight_bits: int = int8_runtimes.DEFAULT_WEIGHT_BITS,
    include_preprocessing: bool = False,
    cache_images: bool = True,
    skip_damaged: bool = False,
    overwrite: bool = False,
    verbose: int = 1,
) -> dict:
    """Fine-tunes ShuffleNet v2 on a folder of labelled images; exports and reports it.
    The options are those of `autoshuffle-finetune` (the fine-tuning guide).

    Args:
        images: one subfolder per class (`root/<class>/*.jpg`, split by `val_fraction`),
            or `root/train/<class>` and `root/val/<class>`. JPEG, PNG, BMP, GIF.
        output_dir: the run's folder (see the module's docstring for what it holds).
        width: 0.5, 1.0, 1.5 or 2.0.
        weights: "imagenet", a preset name (`hub.list_presets()`) or folder (e.g. an
            earlier run's `preset/`), a `.keras` ShuffleNet v2 of `width` (a new head for
            this run's classes), or None (random weights, no head phase).
        image_size: the network's input side; images are resized and cropped to it.
        epochs: epochs of the whole-net phase.
        head_epochs: epochs of the head phase (default 3 with pretrained weights, else 0).
        batch_size: images per step, at most the training images.
        learning_rate: the whole-net phase's initial rate (default 0.01 with pretrained
            weights, 0.1 without); the head phase's is ten times it.
        label_smoothing: in [0, 1).
        class_weights: "balanced" (scikit-learn's rule: `images / (classes * its
            images)`) or None.
        val_fraction: the share of each class held out for validation (no `train/` and
            `val/`); recorded in `split.json`, so a rerun uses the same images.
        split_seed: the validation split's seed.
        flip: random horizontal flips in training (False for text, digits, ...).
        seed: the initial head's, the data order's and the augmentation's seed.
        export_formats: of "litert", "onnx", "openvino" (default: LiteRT, and ONNX and
            OpenVINO where their extras are installed), folded and each checked against
            Keras; `model.keras` is always written.
        int8: also full-integer files of the exports, calibrated on training images; one
            whose validation accuracy drops more than `max_accuracy_drop` is refused and
            its numbers reported.
        max_accuracy_drop: with `int8`, the most accuracy drop allowed, in percentage
            points in [0, 100].
        int8_weight_bits: with `int8`, the ONNX and OpenVINO int8 weights' bits: 7 (right
            on every x86 CPU) or 8 (for CPUs with VNNI only).
        include_preprocessing: the exported files take raw uint8 RGB pixels of any size
            and resize, crop and normalise inside (`raw_input_model`). Not with `int8`.
        cache_images: decode the training images once into `image_cache/`
            (`data.image_cache`; removed when the run finishes) instead of every epoch.
        skip_damaged: skip (and count in the report) damaged images instead of stopping.
        overwrite: replace a finished run in `output_dir`.
        verbose: 0 silent, 1 progress bars, 2 one line per epoch.

    Returns:
        The report, also written to `report.json` and `report.md`: the data, the
            settings, validation accuracy overall and per class with the confusion
            matrix, and each exported file's accuracy, size and latency.

    Raises:
        ValueError: a bad argument, image folder, `weights` file or preset (naming the
            file and field), before any image is decoded (a `batch_size` larger than the
            training images right after the scan).
        RunDirectoryError: `weights` is one of the files the run writes; `output_dir`
            holds a finished run (without `overwrite`) or a run with other settings, is
            locked by another living run, cannot be written, or is inside the image
            folder or holds it.
        OSError: the ImageNet weights cannot be downloaded, or the disk is full. A failed
            run removes its image cache and, where no epoch was finished, every file it
            wrote.
    """
    pretrained = weights is not None
    options = arguments.check_arguments(
        width=width,
        image_size=image_size,
        epochs=epochs,
        head_epochs=head_epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        label_smoothing=label_smoothing,
        class_weights=class_weights,
        flip=flip,
        int8=int8,
        include_preprocessing=include_preprocessing,
        cache_images=cache_images,
        verbose=verbose,
        seed=seed,
        pretrained=pretrained,
    )
    options["int8_bound"] = _validation.percentage_points(max_accuracy_drop, "max_accuracy_drop")
    options["int8_weight_bits"] = int8_runtimes.check_weight_bits(
        int8_weight_bits, "int8_weight_bits"
    )
    source = network.weights_source(weights)
    include_preprocessing = options["include_preprocessing"]
    formats = arguments.check_formats(export_formats, options["int8"], include_preprocessing)
    options["left_out"] = arguments.left_out(export_formats)
    output_dir = arguments.check_output(output_dir, images)
    arguments.check_weights_outside(weights, output_dir)
    # Downloaded (or refused) before any folder is made or image scanned.
    network.check_weights(weights, options["width"], options["image_size"])
    given = dict(
        val_fraction=val_fraction,
        split_seed=split_seed,
        skip_damaged=skip_damaged,
        overwrite=overwrite,
    )
    with locked_folder(output_dir):
        try:
            return _fine_tune(images, output_dir, weights, source, options, formats, given)
        except BaseException as error:
            run_folder.remove_failed_run(output_dir)
            full = run_folder.full_disk(error, output_dir, formats)
            if full is not None:
                raise full from None
            raise


def _fine_tune(images, output_dir, weights, source, options, formats, given):
    """`finetune()` once its arguments are checked and its folder locked."""
    val_fraction, split_seed = given["val_fraction"], given["split_seed"]
    seed, verbose = options["seed"], options["verbose"]
    include_preprocessing = options["include_preprocessing"]
    replace = run_folder.finished(output_dir, given["overwrite"])
    record = os.path.join(output_dir, SPLIT_FILE)
    train_data, val_data, split = image_folder(
        images,
        image_size=options["image_size"],
        val_fraction=val_fraction,
        split_seed=split_seed,
        seed=seed,
        flip=options["flip"],
        skip_damaged=given["skip_damaged"],
        record=None if replace else record,  # a finished run's split is not reused
    )
    train_data.check_batch_size(options["batch_size"])  # before the cache is built
    training_exports.check_calibration_images(train_data.num_examples, options["int8"])
    if replace:  # only now: a bad folder leaves the finished run as it was
        run_folder.clear_run(output_dir)
        split.save(record)
    _write_inputs(output_dir, split.class_names, options["image_size"], include_preprocessing)
    weighting = _class_weight(options["class_weights"], split.train_labels, len(split.class_names))
    settings = dict(
        model="v2",
        width=options["width"],
        base_weights=source,
        image_size=options["image_size"],
        flip=options["flip"],
        images=_digest(split.to_json()),
        image_cache=options["cache_images"],
    )
    finished = run_folder.finished_phases(output_dir, options["head_epochs"])
    if options["cache_images"] and not finished:
        train_data.cache_images(os.path.join(output_dir, CACHE_DIR))
    phase = dict(
        train_data=train_data,
        val_data=val_data,
        seed=seed,
        verbose=verbose,
        label_smoothing=options["label_smoothing"],
        class_weight=weighting,
    )
    build = dict(width=options["width"], classes=len(split.class_names), size=options["image_size"])
    train_phases(output_dir, weights, options, settings, build, phase)
    _atomic.remove(os.path.join(output_dir, CACHE_DIR))  # training's only: gone before exports
    model = keras.saving.load_model(
        os.path.join(output_dir, ALL_DIR, "model.keras"), compile=False, safe_mode=True
    )
    report = {
        "data": _data_record(images, split, train_data, val_data),
        "settings": _settings_record(settings, weights, options, split),
    }
    validation = one_pass(val_data.eval_dataset(options["batch_size"]))
    probabilities = model.predict(**validation, verbose=0)
    report["validation"] = classification_metrics(val_data.labels, probabilities, split.class_names)
    if include_preprocessing:
        report.update(_export_raw_input(model, output_dir, val_data, formats, probabilities))
    else:
        exported = (model, output_dir, train_data, val_data, formats, probabilities)
        int8 = options["int8"], options["int8_bound"], options["int8_weight_bits"]
        report.update(_export(*exported, int8, split.class_names))
    report["preset"] = _write_preset(model, output_dir, split.class_names, options)
    if options["left_out"]:  # by default, what this install cannot write
        report["not_exported"] = options["left_out"]
    report["cpu"] = cpu_name()  # the latencies' machine
    report["written"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    write_report(output_dir, report)
    return report


def _write_preset(model, output_dir, class_names, options):
    """The fine-tuned net as a keras-hub preset in `output_dir/preset/` (written
    atomically): a `ShuffleNetImageClassifier` with the run's class names and
    preprocessing (`preprocessing.json`'s sizes), for `from_preset`. Returns its path."""
    from keras_autoshuffle import hub

    sizes = evaluation_sizes(options["image_size"])
    classifier = hub.presets.classifier_from_model(model, options["width"], class_names, *sizes)
    return hub.presets.save_classifier(classifier, os.path.join(output_dir, PRESET_DIR))


def _settings_record(settings, weights, options, split):
    """The report's "settings": the phases' settings and every other argument of the run."""
    names = ("epochs", "head_epochs", "batch_size", "learning_rate", "label_smoothing")
    return {
        **settings,
        "weights": weights if weights is None else os.fspath(weights),
        **{name: options[name] for name in names},
        "class_weights": options["class_weights"],
        "val_fraction": split.val_fraction,
        "split_seed": split.split_seed,
        "seed": options["seed"],
        "include_preprocessing": options["include_preprocessing"],
        **({"int8_weight_bits": options["int8_weight_bits"]} if options["int8"] else {}),
    }


def _data_record(images, split, train_data, val_data):
    """The report's "data": the images, the classes, the split and what was skipped."""
    return {
        "images": os.path.abspath(os.fspath(images)),
        "classes": list(split.class_names),
        "train_examples": train_data.num_examples,
        "val_examples": val_data.num_examples,
        "source": split.source,
        "skipped": [list(entry) for entry in split.skipped],
        "ignored_files": split.ignored,
    }


def _write_inputs(output_dir, class_names, image_size, include_preprocessing):
    """labels.txt (a class name per line, in output order) and preprocessing.json (what the
    exported files' inputs are; a described `.tflite` file's own metadata says its
    normalisation), for `autoshuffle-predict` and apps."""
    names = "".join(f"{name}\n" for name in class_names)
    _atomic.write_atomically(
        os.path.join(output_dir, LABELS_FILE),
        lambda path: open(path, "w", encoding="utf-8").write(names),
    )
    _atomic.write_json(
        os.path.join(output_dir, PREPROCESSING_FILE),
        {
            "image_size": image_size,
            "resize_size": evaluation_sizes(image_size)[1],
            "mean": list(IMAGENET_MEAN),
            "std": list(IMAGENET_STD),
            "exports_include_preprocessing": include_preprocessing,
        },
    )


def _class_weight(rule, labels, classes):
    """None, or scikit-learn's balanced weights: `n / (classes * count)` per class."""
    if rule is None:
        return None
    counts = np.bincount(labels, minlength=classes)
    return tuple(float(len(labels) / (classes * count)) for count in counts)


def _digest(record):
    text = json.dumps(record, sort_keys=True, ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _export(model, output_dir, train_data, val_data, formats, probabilities, int8s, class_names):
    """`model.keras` and the folded exports with their checks (`training.exports`; with
    `int8s` ((wanted, bound, weight bits)) the int8 files within the bound's points of
    accuracy drop, ONNX's and OpenVINO's weights in those bits), the files' metadata
    (`_describe_files`), then each file's accuracy on the
    validation images, agreement with Keras, size, latency."""
    int8, int8_bound, int8_weight_bits = int8s
    sample = training_exports.check_savable(model, val_data, formats)
    int8_arrays = training_exports.int8_data(train_data, val_data) if formats and int8 else None
    # Described (the mediapipe extra), the LiteRT files take RGB in [0, 1] (MediaPipe's).
    unit_rgb = "litert" in formats and export_lib.is_installed("mediapipe")
    others = tuple(f for f in formats if not (unit_rgb and f == "litert"))
    if others:
        written = training_exports.export_run(
            model, output_dir, sample, others, int8_arrays, int8_bound, int8_weight_bits
        )
    else:  # model.keras alone
        path = os.path.join(output_dir, export_lib.FILENAMES["keras"])
        export_lib.save_keras(model, path)
        written = {"keras": {"path": path}}
    if unit_rgb:
        written.update(_export_unit_rgb_litert(model, output_dir, sample, int8_arrays, int8_bound))
    _describe_files(written, class_names)
    entries = {}
    # Each int8 file's check ("int8": LiteRT's, "onnx_int8", "openvino_int8").
    checks = {key: written.pop(key) for key in export_lib.INT8_FILES if key in written}
    files = {name: entry["path"] for name, entry in written.items() if name != "keras"}
    files.update({key: entry["path"] for key, entry in checks.items() if entry.get("path")})
    entries["files"] = evaluation.measure_files(
        files, val_data, probabilities, model.input_shape[1:]
    )
    entries["files"]["keras"] = _keras_entry(written["keras"]["path"], probabilities, val_data)
    entries.update(checks)  # with `accuracy_drop` in points, as `max_accuracy_drop` is
    return entries


def _export_unit_rgb_litert(model, output_dir, sample, int8_arrays, int8_bound):
    """`model.tflite` (and with `int8_arrays`, `model_int8.tflite` within `int8_bound`) of
    the folded net behind ImageNet's normalisation (`metadata.with_input_normalization`):
    files taking RGB in [0, 1], checked against the hardened net behind the same layer.
    Written in a folder of their own, then moved beside the others: `export_model` keeps
    no file of other inputs in its folder."""
    int8 = None
    if int8_arrays is not None:
        calibration, (images, labels) = int8_arrays
        int8 = (_unit_rgb(calibration), (_unit_rgb(images), labels))
    folder = os.path.join(output_dir, run_folder.LITERT_STAGING)
    _atomic.remove(folder)  # what a killed run left
    try:
        files = training_exports.export_run(
            model,
            folder,
            _unit_rgb(sample),
            ("litert",),
            int8,
            int8_bound,
            wrap=metadata.with_input_normalization,
        )
        for entry in files.values():
            if entry.get("path"):
                moved = os.path.join(output_dir, os.path.basename(entry["path"]))
                os.replace(entry["path"], moved)
                entry["path"] = moved
    finally:
        _atomic.remove(folder)
    return files


def _unit_rgb(images):
    """ImageNet-normalised images (the validation pipeline's) as RGB in [0, 1]."""
    return np.asarray(images) * np.float32(IMAGENET_STD) + np.float32(IMAGENET_MEAN)


def _describe_files(written, class_names):
    """The class names and the input's normalisation in the exported files: LiteRT
    metadata (where the mediapipe extra is installed; the files take RGB in [0, 1]: mean 0,
    std 255 on pixels, as MediaPipe Tasks runs them), ONNX `metadata_props` and OpenVINO
    `rt_info` (ImageNet's per-channel normalisation, on pixels) (`export.metadata`)."""
    describe = {"onnx": metadata.describe_onnx, "openvino": metadata.describe_openvino}
    pixels = {"mean": metadata.IMAGENET_PIXEL_MEAN, "std": metadata.IMAGENET_PIXEL_STD}
    if export_lib.is_installed("mediapipe"):
        describe["litert"] = metadata.describe_litert
    for key, entry in written.items():
        fmt = export_lib.INT8_FILES[key][0] if key in export_lib.INT8_FILES else key
        if fmt in describe and entry.get("path"):
            describe[fmt](entry["path"], class_names, **({} if fmt == "litert" else pixels))


def _keras_entry(path, probabilities, val_data):
    """model.keras's entry: its accuracy is the run's validation accuracy."""
    return {
        "path": path,
        "size_bytes": os.path.getsize(path),
        "accuracy": float(np.mean(np.argmax(probabilities, -1) == val_data.labels)),
        "top1_agreement": 1.0,
    }


def _export_raw_input(model, output_dir, val_data, formats, probabilities):
    """The folded network with its preprocessing inside (`raw_input_model`) in `formats`,
    each checked against the unfolded one's on a validation image as it is; `model.keras`
    (normalised inputs); then each file run on the validation image files."""
    size = model.input_shape[1]
    image = read_image(val_data.path(0))
    wrap = functools.partial(raw_input_model, image_size=size)
    training_exports.export_run(model, output_dir, image[None], formats, wrap=wrap)
    # After the raw files: `export_model` keeps no earlier file of other inputs beside them.
    keras_path = os.path.join(output_dir, export_lib.FILENAMES["keras"])
    export_lib.save_keras(model, keras_path)
    files = {fmt: os.path.join(output_dir, export_lib.FILENAMES[fmt]) for fmt in formats}
    measured = evaluation.measure_raw_files(files, val_data, probabilities, image.shape)
    measured["keras"] = _keras_entry(keras_path, probabilities, val_data)
    return {"files": measured}
