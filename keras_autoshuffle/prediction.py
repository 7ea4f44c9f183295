"""Classifying images with a trained classifier of any exported format: `Classifier`
(`from_file`: an exported file, a `.keras` file or a keras-hub preset folder, each read as
untrusted; `imagenet`: torchvision's pretrained ShuffleNetV2), and `predict_files` on
image files and folders, whose results `autoshuffle-predict` prints.

    classifier = Classifier.from_file("runs/pets/model.tflite")
    for result in predict_files(classifier, ["photos/"], k=3):
        print(result["path"], result["top"][0]["label"])
"""

import os
from collections.abc import Callable, Sequence

import keras
import numpy as np

from keras_autoshuffle import _validation, applications
from keras_autoshuffle._resize_crop import MAX_ASPECT_RATIO, check_sides
from keras_autoshuffle.applications.weights.registry import CHECKPOINTS, imagenet_class_index
from keras_autoshuffle.data.images import (
    IMAGE_EXTENSIONS,
    ImageFileError,
    has_image_extension,
    read_image,
)
from keras_autoshuffle.export.onnx_runtimes import OPENVINO_XML
from keras_autoshuffle.export.runner import open_runner
from keras_autoshuffle.side_files import (  # noqa: F401 (read_*: this module's API, as before)
    LABELS_FILE,
    PREPROCESSING_FILE,
    _check_labels,
    class_names,
    preprocessing,
    read_labels,
    read_preprocessing,
)

# The files of a keras-hub preset folder that tell it from an OpenVINO IR folder.
PRESET_FILES = ("config.json", "metadata.json")
# Images per model call where the format takes batches (memory: 32 x 224 x 224 x 3 floats).
BATCH_SIZE = 32
# How far outside [0, 1] an output may be and still be a probability (float rounding).
_PROBABILITY_SLACK = 1e-4


class Classifier:
    """An image classifier: a model of any format, its class names and its preprocessing.

    Made with `Classifier.from_file` (an exported model and its side files) or
    `Classifier.imagenet` (torchvision's pretrained ShuffleNetV2); the constructor wraps
    any function from a batch of model inputs to probabilities.

    Args:
        run: a function from a float32 batch of model inputs (n, ...) to the class
            probabilities, an array (n, len(labels)).
        labels: the class names, in output order: non-blank strings.
        preprocess: a function from a uint8 RGB batch of one image (1, h, w, 3) to the
            model's input for it (1, ...), e.g. a Keras model such as
            `evaluation_preprocessing(224)`; None when `run` takes raw pixels (float32 in
            [0, 255], one image of any size at a time).
        batch_size: the most images per `run` call (1 when `preprocess` is None).
        source: what the model is, for error messages (its path).

    Attributes:
        labels: the class names, a tuple.
        source: the model's path or name.
    """

    def __init__(
        self,
        run: Callable[[np.ndarray], np.ndarray],
        labels: Sequence[str],
        preprocess: Callable[[np.ndarray], object] | None = None,
        batch_size: int = BATCH_SIZE,
        source: str = "the model",
    ) -> None:
        if not callable(run):
            raise ValueError(f"`run` must be a function. Received: run={run!r}")
        if preprocess is not None and not callable(preprocess):
            raise ValueError(
                f"`preprocess` must be a function or None. Received: preprocess={preprocess!r}"
            )
        self.labels = _check_labels(labels, "labels")
        self.source = str(source)
        self._run = run
        self._preprocess = preprocess
        batch_size = _validation.positive_int(batch_size, "batch_size")
        self._batch_size = batch_size if preprocess is not None else 1

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "Classifier":
        """Loads an exported classifier, a `.keras` file or a keras-hub preset folder.

        An exported file is run by `export.runner.open_runner`: `.keras` (loaded with
        `safe_mode=True`), `.tflite` (LiteRT, float or int8), `.onnx` (ONNX Runtime) or
        `.xml` (OpenVINO; a folder holding `model.xml` too, e.g. `openvino/`). A file's own
        metadata suffices: its class names, when no `labels.txt` is beside it; its input's
        normalisation (`(pixel - mean) / std` on the resized, centre-cropped RGB pixels)
        and, without `preprocessing.json`, the image size from its input shape. The side
        files of older runs (`labels.txt`, `preprocessing.json`, in the model's folder; for
        OpenVINO the IR folder if it holds `labels.txt`, else its parent) are read where
        present: a file without metadata takes ImageNet's normalisation, and raw pixels
        where `preprocessing.json` says `"exports_include_preprocessing": true`.

        A keras-hub preset folder (`config.json` and `metadata.json`, as `save_to_preset`
        writes) is checked as `hub.presets.check_folder` checks it (a missing file, a
        class not this package's, a newer layout, class names of another count: refused
        naming the file and the field), then loaded with
        `keras_hub.models.ImageClassifier.from_preset`: its
        preprocessor resizes, crops and normalises, its `class_names` name the outputs.

        Args:
            path: the model file, an OpenVINO IR folder, or a preset folder.

        Returns:
            The Classifier.

        Raises:
            FileNotFoundError: `path` does not exist; a file without class names in its
                metadata and no `labels.txt`.
            ValueError: an unknown suffix; a side file that does not hold what it should;
                a side file and the file's metadata that disagree (naming the field); a
                model that cannot be loaded (its runtime not installed: the message names
                the extra), does not take RGB images of the size `preprocessing.json`
                names, or has another class count than its labels. A model that loads but
                fails when run raises ValueError naming it from `predict`.
        """
        path = _check_path(path, "path")
        if _is_preset(path):
            return _from_preset(cls, path)
        if os.path.isdir(path) and not os.path.isfile(os.path.join(path, OPENVINO_XML)):
            raise ValueError(
                f"{path} is a folder without {OPENVINO_XML} (an OpenVINO IR) nor "
                f"{' and '.join(PRESET_FILES)} (a keras-hub preset); give one of them or a "
                f"model file (.keras, .tflite, .onnx, .xml). Received: path={path!r}"
            )
        runner = open_runner(path)
        folder = os.path.dirname(os.path.abspath(runner.path))
        if runner.format == "openvino" and not os.path.lexists(os.path.join(folder, LABELS_FILE)):
            folder = os.path.dirname(folder)  # autoshuffle-finetune's openvino/ subfolder
        labels_path = os.path.join(folder, LABELS_FILE)
        labels = class_names(runner, labels_path)
        preprocess = preprocessing(runner, os.path.join(folder, PREPROCESSING_FILE))
        if len(runner.output_shape) != 1:
            raise ValueError(
                f"{runner.path} outputs shape (batch, *{runner.output_shape}), not class "
                f"probabilities (batch, classes). Received: path={path!r}"
            )
        if runner.output_shape[0] not in (None, len(labels)):  # None: checked on each run
            named = labels_path if os.path.lexists(labels_path) else "its metadata"
            raise ValueError(
                f"{runner.path} has {runner.output_shape[0]} outputs but {named} names "
                f"{len(labels)} classes: they must be one name per output. "
                f"Received: path={path!r}"
            )
        return cls(runner.run, labels, preprocess, source=runner.path)  # batches: `__init__`'s

    @classmethod
    def imagenet(cls, width: float = 1.0) -> "Classifier":
        """torchvision's ImageNet ShuffleNetV2 at `width`, with its preprocessing
        (`applications.imagenet_preprocessing(width)`) and ImageNet's 1000 class names.

        The weights and the class index are downloaded once into Keras's cache (see
        `applications.ShuffleNetV2(weights="imagenet")` for the offline recipe).

        Args:
            width: a key of `applications.CHECKPOINTS` (0.5, 1.0, 1.5, 2.0).

        Returns:
            The Classifier.

        Raises:
            ValueError: an unknown width.
            OSError: the weights or class index cannot be downloaded.
        """
        width = _validation.choice(width, tuple(CHECKPOINTS), "width")
        entry = CHECKPOINTS[width]
        index = imagenet_class_index(f"width={width!r}")
        labels = [index[str(i)][1] for i in range(len(index))]
        if entry.classes != len(labels):
            raise ValueError(
                f"The ImageNet checkpoint for width {width:g} has {entry.classes} classes but "
                f"the class index names {len(labels)}. Received: width={width!r}"
            )
        model = applications.ShuffleNetV2(
            width,
            weights="imagenet",
            stem="imagenet",
            input_shape=(entry.crop_size, entry.crop_size, 3),
            classes=entry.classes,
        )

        def run(batch):
            return keras.ops.convert_to_numpy(model(batch, training=False))

        return cls(run, labels, applications.imagenet_preprocessing(width), source=model.name)

    def predict(self, images: Sequence[np.ndarray]) -> np.ndarray:
        """The class probabilities of each image.

        Args:
            images: RGB images, each a uint8 array of shape (height, width, 3) of any size
                (as `keras_autoshuffle.data.images.read_image` returns).

        Returns:
            A float32 array of shape (len(images), len(labels)).

        Raises:
            ValueError: an image that is not a uint8 RGB array (naming its index), a
                model whose outputs are not probabilities (not finite, outside [0, 1],
                or of another shape), or a model file that fails when run (naming it).
        """
        if isinstance(images, np.ndarray) and images.ndim != 4:
            raise ValueError(
                "`images` must be a sequence of (height, width, 3) images; wrap a single "
                f"image in a list. Received: images.shape={images.shape}"
            )
        images = [_check_image(image, i) for i, image in enumerate(images)]
        outputs = [np.zeros((0, len(self.labels)), "float32")]
        for start in range(0, len(images), self._batch_size):
            chunk = images[start : start + self._batch_size]
            batch = np.concatenate([self._input(image) for image in chunk])
            outputs.append(self._outputs(batch, start))
        return np.concatenate(outputs)

    def top_k(self, images: Sequence[np.ndarray], k: int = 5) -> list[list[tuple[str, float]]]:
        """The `k` most probable classes of each image, best first.

        Args:
            images: RGB images, as for `predict`.
            k: how many classes per image, a positive integer; more than the class count
                gives every class.

        Returns:
            For each image, a list of `(label, probability)`, by decreasing probability
                (ties in output order).

        Raises:
            ValueError: a `k` that is not a positive integer, or as `predict`.
        """
        k = _validation.positive_int(k, "k")
        probabilities = self.predict(images)
        return [
            [(self.labels[i], float(row[i])) for i in np.argsort(-row, kind="stable")[:k]]
            for row in probabilities
        ]

    def _input(self, image):
        """The model's input for one checked image: a batch of one."""
        if self._preprocess is None:
            return image[None].astype("float32")
        return np.asarray(keras.ops.convert_to_numpy(self._preprocess(image[None])), "float32")

    def _outputs(self, batch, start):
        """`run` on `batch` (images `start`...), checked to be probabilities."""
        outputs = np.asarray(self._run(batch))
        expected = (len(batch), len(self.labels))
        if outputs.shape != expected:
            raise ValueError(
                f"{self.source} gave outputs of shape {outputs.shape} for {len(batch)} images; "
                f"{len(self.labels)} labels need {expected}. Received: outputs.shape="
                f"{outputs.shape}"
            )
        bad = ~np.isfinite(outputs) | (outputs < -_PROBABILITY_SLACK)
        bad |= outputs > 1 + _PROBABILITY_SLACK
        if bad.any():
            row, column = np.argwhere(bad)[0]
            raise ValueError(
                f"{self.source} does not output probabilities: image {start + row} got "
                f"{outputs[row, column]} for {self.labels[column]!r} (a model without softmax, "
                "or a diverged one?). A classifier must end in a softmax. Received: "
                f"output={outputs[row, column]}"
            )
        return np.clip(outputs, 0.0, 1.0).astype("float32")


def image_paths(paths: Sequence[str | os.PathLike]) -> list[str]:
    """The image files `paths` names: each file as given, each folder's images (its
    files with a suffix in `IMAGE_EXTENSIONS`, any case, sorted by name; not recursive).

    Args:
        paths: image files and folders.

    Returns:
        The paths of the files, as strings, in order.

    Raises:
        FileNotFoundError: a path does not exist.
        ValueError: `paths` is empty, not a sequence of paths, or names a folder without
            images.
    """
    if isinstance(paths, (str, bytes, os.PathLike)) or not isinstance(paths, Sequence):
        raise ValueError(
            f"`paths` must be a list of image files and folders. Received: paths={paths!r}"
        )
    if not paths:
        raise ValueError("`paths` must name at least one image or folder. Received: paths=[]")
    found = []
    for path in paths:
        path = _check_path(path, "path")
        if not os.path.isdir(path):
            found.append(path)
            continue
        with os.scandir(path) as entries:
            names = sorted(
                entry.name
                for entry in entries
                if entry.is_file() and has_image_extension(entry.name)
            )
        if not names:
            raise ValueError(
                f"The folder {path} holds no images (files ending in "
                f"{', '.join(sorted(IMAGE_EXTENSIONS))}; subfolders are not read). "
                f"Received: path={path!r}"
            )
        found += [os.path.join(path, name) for name in names]
    return found


def predict_files(
    classifier: Classifier,
    paths: Sequence[str | os.PathLike],
    k: int = 5,
    skip_damaged: bool = False,
) -> list[dict]:
    """Classifies image files, and the images of folders (`image_paths`).

    Images are read (`read_image`) and classified `BATCH_SIZE` at a time: any number of
    files fits in memory.

    Args:
        classifier: the Classifier.
        paths: image files and folders.
        k: how many classes per image (more than the class count gives every class).
        skip_damaged: report an unreadable image in its result (`"error"`) and go on,
            instead of raising.

    Returns:
        One dict per image, in order: `{"path": str, "top": [{"label": str,
            "probability": float}, ...]}` (k entries, best first), or with `skip_damaged`
            for an unreadable image `{"path": str, "error": str}`.

    Raises:
        FileNotFoundError: a path does not exist.
        ImageFileError: an image cannot be read (naming it), without `skip_damaged`.
        ValueError: as `image_paths` and `Classifier.top_k`.
    """
    if not isinstance(classifier, Classifier):
        raise ValueError(
            "`classifier` must be a Classifier (Classifier.from_file or .imagenet). "
            f"Received: classifier of type {type(classifier).__name__}"
        )
    if not isinstance(skip_damaged, bool):
        raise ValueError(f"`skip_damaged` must be True or False. Received: {skip_damaged=}")
    k = _validation.positive_int(k, "k")
    files = image_paths(paths)
    results = []
    for start in range(0, len(files), BATCH_SIZE):
        chunk = [{"path": path} for path in files[start : start + BATCH_SIZE]]
        images, read = [], []
        for entry in chunk:
            try:
                images.append(_read(entry["path"]))
                read.append(entry)
            except ImageFileError as error:
                if not skip_damaged:
                    raise
                entry["error"] = _validation.one_line(error)
        for entry, top in zip(read, classifier.top_k(images, k), strict=True):
            entry["top"] = [{"label": label, "probability": p} for label, p in top]
        results += chunk
    return results


def _check_image(image, index):
    """`image` if it is a uint8 RGB image of at least one pixel per side, its longer side at
    most `MAX_ASPECT_RATIO` times the shorter (what the resize takes); ValueError naming it."""
    shape = getattr(image, "shape", None)
    if (
        not isinstance(image, np.ndarray)
        or image.dtype != np.uint8
        or image.ndim != 3
        or shape[-1] != 3
        or 0 in shape
    ):
        dtype = getattr(image, "dtype", type(image).__name__)
        raise ValueError(
            f"`images[{index}]` must be an RGB image, a uint8 array of shape (height, width, 3) "
            f"(read_image gives one). Received: images[{index}] of shape {shape}, dtype {dtype}"
        )
    check_sides(shape[0], shape[1], shape, f"images[{index}]")
    return image


def _read(path):
    """The pixels of the image file `path` (`read_image`); ImageFileError naming it also for
    a shape `_check_image` refuses."""
    image = read_image(path)
    height, width = image.shape[:2]
    if max(height, width) > MAX_ASPECT_RATIO * min(height, width):
        raise ImageFileError(
            f"The image is {width} x {height} pixels: its longer side is more than "
            f"{MAX_ASPECT_RATIO} times the shorter, more than the resize to the model's input "
            f"takes. Crop it. Received: path={path!r}"
        )
    return image


def _check_path(path, name):
    """`path` as a str if it is a str or os.PathLike path that exists; else an error naming
    `name`."""
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if not isinstance(text, str):  # bytes paths too: the results hold str paths
        raise ValueError(
            f"`{name}` must be a path, a str or os.PathLike. Received: {name}={path!r}"
        )
    path = text
    if not os.path.lexists(path):
        raise FileNotFoundError(f"{path} does not exist. Received: {name}={path!r}")
    return path


def _is_preset(path: str) -> bool:
    """Whether `path` is a keras-hub preset folder (its `config.json` and
    `metadata.json`)."""
    return all(os.path.isfile(os.path.join(path, name)) for name in PRESET_FILES)


def _from_preset(cls, folder):
    """The Classifier of the keras-hub preset `folder`: its preprocessor, its class names,
    a softmax on its outputs where it gives logits."""
    import keras_hub

    from keras_autoshuffle.hub import presets  # registers the classes keras-hub finds

    if not os.path.isfile(os.path.join(folder, "task.json")):
        raise ValueError(
            f"{folder} is a backbone preset (no task.json): it has no classifier to predict "
            "with. Fine-tune it first (autoshuffle-finetune --weights FOLDER). "
            f"Received: path={folder!r}"
        )
    try:  # checked whole first: keras-hub's own loader reads a newer or foreign preset
        model = presets.load_checked(
            folder, keras_hub.models.ImageClassifier.from_preset, True, True
        )
    except (ValueError, OSError, KeyError, TypeError) as error:
        raise ValueError(
            f"{folder} cannot be loaded as a keras-hub preset ({type(error).__name__}: "
            f"{_validation.one_line(error)[:300]}). Received: path={folder!r}"
        ) from None
    labels = getattr(model, "class_names", None)
    if not labels:
        raise ValueError(
            f"{folder}: the preset's classifier has no `class_names` to name its outputs. "
            f"Save it with class_names. Received: class_names={labels!r}"
        )
    logits = keras.activations.serialize(model.output_dense.activation) != "softmax"

    def run(batch):
        outputs = model(batch, training=False)
        return keras.ops.convert_to_numpy(keras.ops.softmax(outputs) if logits else outputs)

    return cls(run, labels, model.preprocessor, BATCH_SIZE, folder)
