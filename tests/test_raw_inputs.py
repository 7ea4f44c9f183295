"""`finetuning.raw_inputs`: a classifier taking raw uint8 RGB images of any size, its
preprocessing (torchvision's antialiased resize, centre crop, normalisation) inside with
LiteRT builtin ops; checked against `applications.evaluation_preprocessing` (TensorFlow's
`ScaleAndTranslate` resize, an independent implementation) and its exported files
against the Keras model, at several image sizes."""

import keras
import numpy as np
import pytest
from helpers import needs_extra, tiny_v2

from keras_autoshuffle import export
from keras_autoshuffle.applications.preprocessing import evaluation_preprocessing
from keras_autoshuffle.finetuning.raw_inputs import (
    RAW_INPUT_FORMATS,
    RawImagePreprocessing,
    raw_input_model,
)

pytestmark = pytest.mark.tensorflow_only(reason="the layer is TensorFlow ops")

SIDE = 32  # resized to round(32 * 256 / 224) = 37, then cropped to 32
# The float32 rounding between the two implementations, after normalisation: measured at
# most 7.5e-5 (0.004 of a 255 level) on 100 x 150 to 4000 x 6000 photos at sides 32 and
# 224 (sums of up to 218 weighted pixels per axis, in another order than
# ScaleAndTranslate's); a wrong tap, weight or crop offset moves values by 1e-2 or more.
EXACT_TOLERANCE = 1e-4
# Interpreter vs Keras: the same float32 ops, differently fused.
FILE_TOLERANCE = 1e-5


def photo(height, width, seed):
    """A natural-looking uint8 RGB image: smooth colour gradients, sharp-edged discs and
    rectangles, fine stripes (the detail an antialiased resize averages away) and noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype("float32")
    y, x = y / height, x / width
    image = np.empty((height, width, 3), "float32")
    for channel in range(3):
        a, b, phase = rng.uniform(-1, 1, 3)
        image[..., channel] = 128 + 60 * np.sin(2 * np.pi * (3 * a * x + 2 * b * y) + phase)
    for _ in range(8):
        cy, cx, radius = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.05, 0.3)
        inside = (y - cy) ** 2 + (x - cx) ** 2 < radius**2
        if rng.random() < 0.5:
            inside = (abs(y - cy) < radius) & (abs(x - cx) < 0.7 * radius)
        image[inside] = 0.5 * image[inside] + 0.5 * rng.uniform(0, 255, 3)
    period = rng.uniform(3, 12)
    image += (20 * np.sin(2 * np.pi * x * width / period) * (y > 0.5))[..., None]
    image += rng.normal(0, 8, image.shape)
    return np.clip(np.round(image), 0, 255).astype("uint8")


def probe(classifier):
    """`classifier` that also returns its input, flattened, before its outputs: a tiny
    untrained net's probabilities barely move with the pixels, so every check below also
    sees each normalised crop value the classifier was given."""
    images = keras.Input((SIDE, SIDE, 3))
    outputs = [keras.layers.Flatten()(images), classifier(images)]
    return keras.Model(images, keras.layers.Concatenate()(outputs), name="probe")


@pytest.fixture(scope="module")
def classifier():
    return probe(tiny_v2(classes=3, input_shape=(SIDE, SIDE, 3)))


@pytest.fixture(scope="module")
def model(classifier):
    return raw_input_model(classifier, SIDE)


@pytest.mark.parametrize(
    "shape",
    [
        (37, 37),  # the resize is the identity
        (20, 27),  # smaller than the crop: upsampled
        (100, 150),
        (333, 481),  # tall, odd sides: the crop offsets round
        (1, 5),  # one row
        (900, 1600),  # downsampled 24 times: 51 taps per output
    ],
)
def test_matches_the_exact_transform(model, classifier, shape):
    images = np.stack([photo(*shape, seed=1), photo(*shape, seed=2)])
    exact = evaluation_preprocessing(SIDE)(images.astype("float32"))
    expected = keras.ops.convert_to_numpy(classifier(exact))
    outputs = keras.ops.convert_to_numpy(model(images))
    assert outputs.shape == (2, SIDE * SIDE * 3 + 3)
    np.testing.assert_allclose(outputs, expected, rtol=0, atol=EXACT_TOLERANCE)


def test_other_resize_size_and_statistics():
    # resize_size = crop: the crop is the whole shorter side, the filter's edges kept.
    layer = RawImagePreprocessing(40, 40, mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3))
    images = photo(90, 61, seed=3)[None]
    exact = evaluation_preprocessing(40, 40)(images.astype("float32"))
    # evaluation_preprocessing normalises with ImageNet's statistics: back to [0, 1].
    pixels = keras.ops.convert_to_numpy(exact) * [0.229, 0.224, 0.225] + [0.485, 0.456, 0.406]
    expected = (pixels - [0.5, 0.4, 0.3]) / [0.2, 0.25, 0.3]
    outputs = keras.ops.convert_to_numpy(layer(images))
    np.testing.assert_allclose(outputs, expected, rtol=0, atol=EXACT_TOLERANCE)


def test_litert_file_takes_any_size(model, tmp_path):
    path = export.export_litert(model, str(tmp_path / "model.tflite"))
    runner = export.open_runner(path)
    assert runner.input.dtype == "uint8"
    for height, width in [(48, 48), (150, 100), (1200, 1600)]:
        images = photo(height, width, seed=height)[None]
        outputs = runner.run(images)
        expected = keras.ops.convert_to_numpy(model(images))
        np.testing.assert_allclose(outputs, expected, rtol=0, atol=FILE_TOLERANCE)
    # Normalised floats are not pixels: refused, not wrapped into uint8.
    with pytest.raises(ValueError, match="raw pixels.*Received: inputs from"):
        runner.run(images.astype("float32") / 255 - 0.5)
    ops = operators(path)
    assert {"WHILE", "GATHER"} <= ops and "CUSTOM" not in ops, ops  # Flex ops are CUSTOM


def operators(path):
    """The names of the operators in every subgraph of a `.tflite` file (a WHILE loop's
    body is a subgraph of its own), from its flat buffer's operator codes."""
    from tensorflow.lite.python import schema_py_generated as schema

    with open(path, "rb") as f:
        codes = schema.ModelT.InitFromPackedBuf(f.read(), 0).operatorCodes
    names = {value: name for name, value in vars(schema.BuiltinOperator).items()}
    return {names[max(code.builtinCode, code.deprecatedBuiltinCode)] for code in codes}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["onnx", pytest.param("openvino", marks=needs_extra("openvino"))])
@needs_extra("onnx")
def test_onnx_and_openvino_files_take_any_size(model, tmp_path, fmt):
    assert fmt in RAW_INPUT_FORMATS
    if fmt == "onnx":
        run = export.open_runner(export.export_onnx(model, str(tmp_path / "model.onnx"))).run
    else:
        run = export.open_runner(export.export_openvino(model, str(tmp_path / "ov"))).run
    for height, width in [(48, 48), (150, 100), (1200, 1600)]:
        images = photo(height, width, seed=height)[None]
        expected = keras.ops.convert_to_numpy(model(images))
        np.testing.assert_allclose(run(images), expected, rtol=0, atol=FILE_TOLERANCE)


def test_saves_and_loads_with_safe_mode(model, tmp_path):
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert loaded.input.dtype == "uint8"
    images = photo(70, 90, seed=4)[None]
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded(images)), keras.ops.convert_to_numpy(model(images))
    )
    layer = loaded.get_layer("preprocessing")
    assert (layer.resize_size, layer.crop_size) == (37, SIDE)


def test_formats():
    assert set(RAW_INPUT_FORMATS) == set(export.FORMATS)


@pytest.mark.parametrize(
    "arguments, match",
    [
        ({"image_size": 8}, "image_size=8"),
        ({"image_size": 32.0}, "image_size=32.0"),
        ({"image_size": True}, "image_size=True"),
        ({"resize_size": 31}, "resize_size=31"),
        ({"resize_size": 65}, "resize_size=65"),
        ({"resize_size": 40.0}, "resize_size=40.0"),
        ({"image_size": 16}, r"classifier input shape=\(None, 32, 32, 3\)"),
    ],
)
def test_bad_arguments_are_named(classifier, arguments, match):
    with pytest.raises(ValueError, match=match):
        raw_input_model(classifier, **{"image_size": SIDE, **arguments})


def test_bad_classifiers_are_named():
    with pytest.raises(ValueError, match="classifier of type str"):
        raw_input_model("model.keras", SIDE)
    channels_first = keras.Sequential([keras.Input((3, SIDE, SIDE)), keras.layers.Flatten()])
    with pytest.raises(ValueError, match=r"classifier input shape=\(None, 3, 32, 32\)"):
        raw_input_model(channels_first, SIDE)


@pytest.mark.parametrize(
    "arguments, match",
    [
        ({"crop_size": 40}, "crop_size=40"),
        ({"resize_size": 0}, "resize_size=0"),
        ({"mean": (0.5, 0.5)}, r"mean=\(0.5, 0.5\)"),
        ({"std": (0.2, 0.0, 0.2)}, r"std=\(0.2, 0.0, 0.2\)"),
        ({"std": "abc"}, "std='abc'"),
    ],
)
def test_bad_layer_arguments_are_named(arguments, match):
    with pytest.raises(ValueError, match=match):
        RawImagePreprocessing(**{"resize_size": 37, "crop_size": 32, **arguments})


@pytest.mark.parametrize(
    "images, match",
    [
        (np.zeros((1, 10, 10, 4), "uint8"), r"images.shape=\(1, 10, 10, 4\)"),
        (np.zeros((10, 10, 3), "uint8"), r"images.shape=\(10, 10, 3\)"),
        (np.zeros((1, 0, 10, 3), "uint8"), r"images.shape=\(1, 0, 10, 3\)"),
        (np.zeros((1, 10, 10, 3), bool), "images.dtype=bool"),
    ],
)
def test_bad_images_are_named(images, match):
    with pytest.raises(ValueError, match=match):
        RawImagePreprocessing(37, 32)(images)
