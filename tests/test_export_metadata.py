"""LiteRT metadata (`export.metadata`): the class names and the input's normalisation read
back from float and int8 `.tflite` files, which compute what they did before; MediaPipe
Tasks' `ImageClassifier` runs them as is and names the Keras model's classes."""

import importlib.util
import os
import pathlib

import keras
import numpy as np
import pytest
from helpers import fit, needs_extra, tiny_v2

from keras_autoshuffle import export
from keras_autoshuffle.applications import IMAGENET_MEAN, IMAGENET_STD
from keras_autoshuffle.export import metadata

LABELS = ["zéro", "one", "two", "three"]
# The digits 0-3 of sklearn's scans, upsampled to the net's 16 x 16 and tinted, so that
# each channel differs and ImageNet's per-channel normalisation matters.
TINT = np.array([1.0, 0.7, 0.4])

needs_mediapipe = pytest.mark.skipif(
    importlib.util.find_spec("mediapipe") is None,
    reason="writing LiteRT metadata needs the mediapipe extra",
)


def _digits():
    """Real images of 4 classes: (uint8 RGB (n, 16, 16, 3), labels)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    keep = digits.target < len(LABELS)
    grey = np.kron(digits.images[keep] / 16.0, np.ones((2, 2)))[..., None]
    return np.round(255 * grey * TINT).astype("uint8"), digits.target[keep]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(a tiny ShuffleNet v2 taking RGB in [0, 1], trained for 4 epochs on 600 digits, so
    that it tells the images apart; its float file; held-out images; the file's outputs on
    them before any metadata). After 2 epochs, TensorFlow without oneDNN (a CPU without
    AVX-512, or TF_ENABLE_ONEDNN_OPTS=0) gave a net naming 3 of the 4 classes."""
    images, labels = _digits()
    keras.utils.set_random_seed(0)
    model = metadata.with_input_normalization(tiny_v2(classes=len(LABELS), weights=None))
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
    fit(model, images[:600] / 255, labels[:600], epochs=4, batch_size=64, verbose=0)
    held_out = images[600:640]
    folder = tmp_path_factory.mktemp("export")
    path = export.export_model(model, folder, held_out[:8] / 255, formats=("litert",))
    path = path["litert"]["path"]
    return model, path, held_out, export.open_runner(path).run(held_out / np.float32(255))


@needs_mediapipe
@pytest.mark.slow  # the module's fixture trains and exports (~45 s on 2 busy cores)
def test_float_file_carries_labels_and_normalization(exported):
    _, path, images, before = exported
    assert metadata.read_litert_metadata(path) is None
    metadata.describe_litert(path, LABELS)
    assert metadata.read_litert_metadata(path) == {"labels": LABELS, "mean": [0.0], "std": [255.0]}
    # The interpreter ignores the metadata: the file computes what it did.
    np.testing.assert_array_equal(export.open_runner(path).run(images / np.float32(255)), before)
    # Described again: replaced, not added.
    size = os.path.getsize(path)
    metadata.describe_litert(path, LABELS[::-1], mean=[127.5], std=[127.5])
    assert metadata.read_litert_metadata(path)["labels"] == LABELS[::-1]
    assert os.path.getsize(path) == size
    names = [m.name for m in _flatbuffer(path).metadata]
    assert names.count(b"TFLITE_METADATA") == 1, names


@needs_mediapipe
@pytest.mark.slow  # the module's fixture trains and exports (~45 s on 2 busy cores)
def test_labels_of_another_count_are_refused(exported):
    _, path, _, _ = exported
    content = open(path, "rb").read()
    with pytest.raises(ValueError, match=r"`labels` must name each of the 4 outputs.*3 labels"):
        metadata.describe_litert(path, LABELS[:3])
    with pytest.raises(ValueError, match="holds a line break"):
        metadata.describe_litert(path, ["a", "b\nc", "d", "e"])
    with pytest.raises(ValueError, match="equally many"):
        metadata.describe_litert(path, LABELS, mean=[0.0, 0.0], std=[255.0])
    assert open(path, "rb").read() == content  # nothing written


def _flatbuffer(path):
    from ai_edge_litert.tools import flatbuffer_utils

    return flatbuffer_utils.read_model_from_bytearray(bytearray(pathlib.Path(path).read_bytes()))


@pytest.fixture
def small_file(tmp_path):
    """A tiny two-class `.tflite` file (a dense layer), written in a second or two."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((4, 4, 3)), keras.layers.Flatten(), keras.layers.Dense(2)]
    )
    path = str(tmp_path / "small.tflite")
    model.export(path, format="litert", verbose=False)
    return path


@needs_mediapipe
def test_describing_keeps_a_file_holding_a_zip_end_marker_whole(small_file):
    # "PK\x05\x06" (a zip's end record) in the file's last 64 KB, as weights may hold it.
    images = np.random.default_rng(0).random((2, 4, 4, 3), dtype="float32")
    before = export.open_runner(small_file).run(images)
    marker = "PK\x05\x06" + "\x00" * 18
    metadata.describe_litert(small_file, ["a", "b"], description=marker)
    metadata.describe_litert(small_file, ["a", "b"], description=marker)
    assert metadata.read_litert_metadata(small_file)["labels"] == ["a", "b"]
    np.testing.assert_array_equal(export.open_runner(small_file).run(images), before)


@needs_mediapipe
def test_describing_a_file_again_keeps_one_metadata_buffer(small_file):
    metadata.describe_litert(small_file, ["a", "b"])
    size, buffers = os.path.getsize(small_file), len(_flatbuffer(small_file).buffers)
    for _ in range(3):
        metadata.describe_litert(small_file, ["a", "b"])
    assert os.path.getsize(small_file) == size
    assert len(_flatbuffer(small_file).buffers) == buffers


@needs_mediapipe
@pytest.mark.parametrize("label", ["cat\u2028dog", "cat\x85dog", "cat\u202edog", " "])
def test_labels_read_back_other_than_written_are_refused(small_file, label):
    with pytest.raises(ValueError, match="labels"):
        metadata.describe_litert(small_file, [label, "bird"])


@needs_mediapipe
def test_other_metadata_or_a_missing_label_file_is_a_clear_error(small_file):
    import flatbuffers
    from ai_edge_litert.tools import flatbuffer_utils
    from mediapipe.tasks.metadata import metadata_schema_py_generated as metadata_fb

    metadata.describe_litert(small_file, ["a", "b"])
    model = _flatbuffer(small_file)
    without_zip = bytes(flatbuffer_utils.convert_object_to_bytearray(model))
    pathlib.Path(small_file).write_bytes(without_zip)  # the label file's zip cut off
    with pytest.raises(ValueError, match=r"small\.tflite"):
        metadata.read_litert_metadata(small_file)
    root = metadata_fb.ModelMetadataT()  # another writer's: a subgraph described by name only
    subgraph = metadata_fb.SubGraphMetadataT()
    subgraph.name = "main"
    root.subgraphMetadata = [subgraph]
    builder = flatbuffers.Builder(0)
    builder.Finish(root.Pack(builder), b"M001")
    model.buffers[model.metadata[0].buffer].data = np.frombuffer(builder.Output(), np.uint8)
    pathlib.Path(small_file).write_bytes(bytes(flatbuffer_utils.convert_object_to_bytearray(model)))
    with pytest.raises(ValueError, match=r"small\.tflite"):
        metadata.read_litert_metadata(small_file)


@pytest.mark.parametrize(
    "mean, std",
    [(0.5, 0.2), ([0.5, 0.5], [0.2, 0.2]), ([float("nan")], [0.2]), ([0.5], [float("inf")])],
)
def test_input_normalization_refuses_bad_mean_or_std(mean, std):
    net = keras.Sequential([keras.Input((4, 4, 3)), keras.layers.Flatten(), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match=r"`mean` and `std` must.*Received: mean="):
        metadata.with_input_normalization(net, mean=mean, std=std)


def test_input_normalization_is_a_serializable_layer(tmp_path):
    net = tiny_v2(classes=len(LABELS), weights=None)
    model = metadata.with_input_normalization(net)
    images = _digits()[0][:4]
    normalized = (images / 255 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
    expected = net.predict(normalized.astype("float32"), verbose=0)
    np.testing.assert_allclose(model.predict(images / 255, verbose=0), expected, atol=1e-5)
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras", safe_mode=True)
    np.testing.assert_allclose(loaded.predict(images / 255, verbose=0), expected, atol=1e-5)
    with pytest.raises(ValueError, match=r"`std` must be.*Received: mean"):
        metadata.with_input_normalization(net, std=(0.2, 0.0, 0.2))


@needs_mediapipe
@pytest.mark.slow
def test_mediapipe_image_classifier_names_the_keras_models_classes(exported, tmp_path):
    """MediaPipe Tasks' own ImageClassifier, given the float and the int8 file alone and
    real images, names the class the Keras model predicts (int8: on most images)."""
    from mediapipe import Image, ImageFormat
    from mediapipe.tasks.python import BaseOptions, vision

    model, float_path, images, _ = exported
    expected = [LABELS[i] for i in np.argmax(model.predict(images / 255, verbose=0), -1)]
    assert len(set(expected)) == len(LABELS)  # images the net tells apart
    calibration = _digits()[0][:64] / 255
    int8_path = export.export_int8(model, tmp_path / "model_int8.tflite", calibration)
    named = {}
    for path in (float_path, int8_path):
        metadata.describe_litert(path, LABELS)
        options = vision.ImageClassifierOptions(
            base_options=BaseOptions(model_asset_path=str(path)), max_results=1
        )
        with vision.ImageClassifier.create_from_options(options) as classifier:
            named[path] = [
                classifier.classify(Image(image_format=ImageFormat.SRGB, data=image))
                .classifications[0]
                .categories[0]
                .category_name
                for image in images
            ]
    assert named[float_path] == expected
    agreement = np.mean(np.array(named[int8_path]) == np.array(expected))
    assert agreement >= 0.9, (named[int8_path], expected)


@needs_extra("onnx")
@needs_extra("openvino")
def test_onnx_and_openvino_files_carry_labels_and_normalization(tmp_path):
    """`metadata_props` and `rt_info`: read back, described again in place, refused for a
    wrong count with nothing written; the files compute what they did."""
    images = (_digits()[0][:4] / 255).astype("float32")
    net = tiny_v2(classes=len(LABELS), weights=None)
    written = export.export_model(net, tmp_path, images, formats=("onnx", "openvino"))
    onnx_path, openvino_path = written["onnx"]["path"], written["openvino"]["path"]
    before = [export.open_runner(path).run(images) for path in (onnx_path, openvino_path)]
    cases = (
        (metadata.describe_onnx, metadata.read_onnx_metadata, onnx_path),
        (metadata.describe_openvino, metadata.read_openvino_metadata, openvino_path),
    )
    for describe, read, path in cases:
        assert read(path) is None
        describe(path, LABELS, metadata.IMAGENET_PIXEL_MEAN, metadata.IMAGENET_PIXEL_STD)
        describe(path, LABELS)
        assert read(path) == {"labels": LABELS, "mean": [0.0], "std": [255.0]}
        with pytest.raises(ValueError, match=r"each of the 4 outputs.*Received: 5 labels"):
            describe(path, [*LABELS, "four"])
        assert read(path)["labels"] == LABELS
    after = [export.open_runner(path).run(images) for path in (onnx_path, openvino_path)]
    np.testing.assert_array_equal(after[0], before[0])
    np.testing.assert_array_equal(after[1], before[1])


def test_every_format_s_metadata_functions_are_on_the_api_page():
    # The reference page renders keras_autoshuffle.export's __all__.
    for fmt in ("litert", "onnx", "openvino"):
        for name in (f"describe_{fmt}", f"read_{fmt}_metadata"):
            assert name in export.__all__ and getattr(export, name) is getattr(metadata, name)


def test_int8_file_behind_the_normalization_keeps_the_inputs_levels(tmp_path):
    """The normalisation's int8 form resolves the [0, 1] input about as finely as the
    normalised range allows: through an identity convolution, within 2 output steps
    (measured 1.34). With `x - mean` first (Keras's `Normalization`) the difference took
    the output's scale, some 55 levels of [0, 1] per channel: 2.87 steps."""
    identity = keras.Sequential(
        [keras.Input((8, 8, 3)), keras.layers.Conv2D(3, 1, use_bias=False, name="identity")]
    )
    identity.get_layer("identity").set_weights([np.eye(3)[None, None]])
    model = metadata.with_input_normalization(identity)
    pixels = np.random.default_rng(0).integers(0, 256, (64, 8, 8, 3)) / np.float32(255)
    path = export.export_int8(model, str(tmp_path / "model_int8.tflite"), pixels[:32])
    expected = model.predict(pixels[32:], verbose=0)
    step = (expected.max() - expected.min()) / 255  # the output's quantization step
    assert np.abs(export.open_runner(path).run(pixels[32:]) - expected).max() <= 2 * step
