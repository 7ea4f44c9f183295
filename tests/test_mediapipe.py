"""MediaPipe Tasks' own `ImageClassifier` runs the `.tflite` files (float and int8) that
`autoshuffle-finetune` writes, as they are, and names the classes `autoshuffle-predict`
names (`prediction.Classifier.from_file`) on the same Fashion-MNIST images."""

import importlib.util
import io
import os
import pathlib
import shutil
import zipfile

import numpy as np
import pytest
from helpers import _write_fashion, tiny_v2
from PIL import Image

from experiments import fashion_mnist_folder
from keras_autoshuffle import prediction
from keras_autoshuffle.applications.preprocessing import ResizeCenterCrop
from keras_autoshuffle.data import DataMissingError
from keras_autoshuffle.export import metadata, open_runner
from keras_autoshuffle.finetuning import finetune, network

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mediapipe") is None, reason="needs mediapipe (the test extra)"
)

# T-shirt/top, Trouser, Sneaker: told apart after a few epochs of a tiny net (validation
# accuracy 0.93 on these 30 images).
CLASSES, TRAIN_PER_CLASS, VAL_PER_CLASS = (0, 1, 7), 16, 10
SIDE = 32


def tiny_network(width, **arguments):
    """A tiny ShuffleNet v2 in place of the `width` one (as tests/test_finetune.py's)."""
    return tiny_v2(width=width, channels=(8, 16, 32, 64, 64), **arguments)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Fashion-MNIST as PNG files (28 x 28, `experiments/fashion_mnist_folder.py`): Debian's
    dataset-fashion-mnist where installed, else tiny IDX files of noise (tests/helpers.py):
    (the folder, whether the images are real)."""
    root = tmp_path_factory.mktemp("fashion")
    write = dict(classes=CLASSES, train_per_class=TRAIN_PER_CLASS, val_per_class=VAL_PER_CLASS)
    try:
        fashion_mnist_folder.write_folder(root / "images", **write)
        return root / "images", True
    except DataMissingError:
        _write_fashion(root / "idx", num_train=10 * TRAIN_PER_CLASS, num_test=10 * VAL_PER_CLASS)
        fashion_mnist_folder.write_folder(root / "noise", **write, data_dir=root / "idx")
        return root / "noise", False


@pytest.fixture(scope="module")
def run(images, tmp_path_factory):
    """A from-scratch fine-tune (tiny network) writing the float and int8 `.tflite` files:
    (its folder, its report)."""
    output = tmp_path_factory.mktemp("run")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(network, "ShuffleNetV2", tiny_network)
        report = finetune(
            images[0],
            output,
            weights=None,
            epochs=8,
            learning_rate=0.05,
            width=0.5,
            image_size=SIDE,
            batch_size=4,
            verbose=0,
            export_formats=("litert",),
            int8=True,
            max_accuracy_drop=100,
        )
    return output, report


def _mediapipe_names(path, pictures):
    """MediaPipe Tasks' ImageClassifier on `pictures`, given the file alone: the top-1 class
    names, and each picture's {name: score}."""
    from mediapipe import Image as MediaPipeImage
    from mediapipe import ImageFormat
    from mediapipe.tasks.python import BaseOptions, vision

    options = vision.ImageClassifierOptions(base_options=BaseOptions(model_asset_path=str(path)))
    with vision.ImageClassifier.create_from_options(options) as classifier:
        results = [
            classifier.classify(MediaPipeImage(image_format=ImageFormat.SRGB, data=picture))
            .classifications[0]
            .categories
            for picture in pictures
        ]
    return [r[0].category_name for r in results], [
        {c.category_name: c.score for c in r} for r in results
    ]


# A top-1 decided by less than this (a score difference) is a near tie: the uint8 rounding of
# the crop MediaPipe is given moves scores by up to 9e-4 (float) and 3 output steps of 1/256
# (int8) on this net, and a net trained with other rounding (another CPU) by other amounts.
NEAR_TIE = 0.05


def _margins(probabilities):
    top_two = np.sort(probabilities, axis=-1)[:, -2:]
    return top_two[:, 1] - top_two[:, 0]


@pytest.mark.slow  # a fine-tune with its int8 export: ~2 minutes on 2 busy cores
def test_mediapipe_names_the_classes_predict_names(run, images):
    """MediaPipe computes what the file computes: on the same pixels (predict's resize of the
    shorter side and centre crop, as uint8 at the input size, where MediaPipe resizes
    nothing) its scores are the file's own (float: 1e-5; int8: one output step). On the PNG
    files, its top-1 names are predict's wherever predict's top-1 is not a near tie, for both
    files, and agree with the Keras model's as often as the report says (near ties excused).
    MediaPipe resizes a whole image (or a region) with its own resampling: on the files
    themselves it differs from predict on a few near ties of this barely trained net."""
    output, report = run
    paths = sorted((images[0] / "val").rglob("*.png"))
    pictures = [np.asarray(Image.open(p).convert("RGB")) for p in paths]
    resize = prediction.read_preprocessing(output / "preprocessing.json")["resize_size"]
    crop = ResizeCenterCrop(resize, SIDE)(np.stack(pictures).astype("float32"))
    crops = np.clip(np.round(np.asarray(crop)), 0, 255).astype("uint8")
    keras_classifier = prediction.Classifier.from_file(output / "model.keras")
    keras_probabilities = keras_classifier.predict(pictures)
    keras_names = np.array(keras_classifier.labels)[keras_probabilities.argmax(-1)]
    if images[1]:  # real images: a net that tells the classes apart
        assert len(set(keras_names)) == len(CLASSES), keras_names
    for name, atol in (("model.tflite", 1e-5), ("model_int8.tflite", 1 / 256 + 1e-6)):
        assert metadata.read_litert_metadata(output / name)["mean"] == [0.0]
        runner = open_runner(output / name)
        named, scores = _mediapipe_names(output / name, crops)
        named = np.array(named)
        mediapipe = np.array([[score[label] for label in runner.labels] for score in scores])
        expected = runner.run(crops.astype("float32") / 255)
        np.testing.assert_allclose(mediapipe, expected, atol=atol, err_msg=name)
        classifier = prediction.Classifier.from_file(output / name)
        probabilities = classifier.predict(pictures)
        clear = _margins(probabilities) > NEAR_TIE
        assert clear.mean() >= 0.5, (name, _margins(probabilities))
        names = np.array(classifier.labels)[probabilities.argmax(-1)]
        assert (named[clear] == names[clear]).all(), (name, named, names)
        key = "int8" if "int8" in name else "litert"
        near_ties = np.mean(_margins(keras_probabilities) <= NEAR_TIE)
        agreement = np.mean(named == keras_names)
        assert agreement >= report["files"][key]["top1_agreement"] - near_ties, (name, agreement)


@pytest.mark.slow
def test_a_file_whose_metadata_names_another_class_count_is_refused(run, tmp_path):
    """A `.tflite` whose label file names another count of classes than its outputs: a
    clear error naming the file and the field from predict (`export.runner`); the file is
    left as it was."""
    output, _ = run
    folder = tmp_path / "tampered"
    folder.mkdir()
    for name in ("labels.txt", "preprocessing.json", "model.tflite"):
        shutil.copy(output / name, folder / name)
    path = folder / "model.tflite"
    content = path.read_bytes()
    start = content.rfind(b"PK\x03\x04")  # the label file's zip, after the model
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as labels:
        labels.writestr(metadata.LABEL_FILE, "a\nb\n")
    tampered = content[:start] + archive.getvalue()
    pathlib.Path(path).write_bytes(tampered)
    message = r"model\.tflite: its metadata's field `labels` names 2 classes but the file has 3"
    with pytest.raises(ValueError, match=message):
        prediction.Classifier.from_file(path)
    assert path.read_bytes() == tampered and sorted(os.listdir(folder)) == sorted(
        ["labels.txt", "preprocessing.json", "model.tflite"]
    )
