"""The ImageNet preprocessing: torchvision's evaluation transform as Keras layers
(`imagenet_preprocessing`, `ResizeCenterCrop`), `preprocess_input`, `decode_predictions`.

torchvision is not installed here. The reference below computes its transform
independently in NumPy (float64): `Resize(size)` with antialiasing is the separable
triangle filter of PIL's `BILINEAR` resampling, whose weights torchvision's
`_upsample_bilinear2d_aa` reproduces (`_resample_weights`); the crop offsets are
`torchvision.transforms.functional.center_crop`'s `int(round((side - crop) / 2.0))`.
"""

import dataclasses
import json
import os
import re

import keras
import numpy as np
import pytest
from keras.applications import imagenet_utils

from keras_autoshuffle.applications import (
    CHECKPOINTS,
    ResizeCenterCrop,
    decode_predictions,
    imagenet_preprocessing,
    preprocess_input,
)
from keras_autoshuffle.applications.preprocessing import ToRGB

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])


def _resample_weights(in_size, out_size):
    """(out_size, in_size) weights of PIL's antialiased bilinear resampling."""
    scale = in_size / out_size
    support = max(scale, 1.0)  # the triangle widens by the downscaling factor
    weights = np.zeros((out_size, in_size))
    for i in range(out_size):
        center = (i + 0.5) * scale
        low = max(int(center - support + 0.5), 0)
        high = min(int(center + support + 0.5), in_size)
        x = np.arange(low, high)
        w = np.maximum(0.0, 1.0 - np.abs((x - center + 0.5) / support))
        weights[i, low:high] = w / w.sum()
    return weights


def _torchvision_eval(image, resize, crop):
    """torchvision's Resize(resize) + CenterCrop(crop) of one HWC image, then /255 and
    ImageNet's normalisation, in float64."""
    h, w = image.shape[:2]
    if w <= h:
        new_w, new_h = resize, int(resize * h / w)
    else:
        new_w, new_h = int(resize * w / h), resize
    out = np.einsum("ih,hwc->iwc", _resample_weights(h, new_h), image.astype(np.float64))
    out = np.einsum("jw,iwc->ijc", _resample_weights(w, new_w), out)
    top, left = int(round((new_h - crop) / 2.0)), int(round((new_w - crop) / 2.0))
    return (out[top : top + crop, left : left + crop] / 255.0 - MEAN) / STD


def _images(height, width, batch=2, seed=0):
    return np.random.default_rng(seed).uniform(0, 255, (batch, height, width, 3)).astype("float32")


# Landscape, portrait, square, smaller than the crop (upsampling), and long sides whose
# crop offset is a half, rounded to even as Python's round: 400 -> 341, (341 - 224) / 2 =
# 58.5 -> 58 (rounding halves up gives 59); 398 -> 339, 57.5 -> 58 (halving down, as
# keras.layers.CenterCrop, gives 57).
SIZES = [(375, 500), (500, 375), (256, 256), (100, 150), (300, 400), (300, 398)]


@pytest.mark.parametrize("height, width", SIZES)
def test_preprocessing_is_torchvisions_evaluation_transform(height, width):
    images = _images(height, width)
    out = keras.ops.convert_to_numpy(imagenet_preprocessing(1.0)(images))
    assert out.shape == (2, 224, 224, 3)
    for image, result in zip(images, out, strict=True):
        # float32 against float64: 0.005 of 255 at most, i.e. 1e-4 after the /std.
        np.testing.assert_allclose(result, _torchvision_eval(image, 256, 224), atol=2e-4)


def test_each_checkpoint_gets_its_own_sizes():
    images = _images(300, 398, batch=1)
    for width, entry in CHECKPOINTS.items():
        preprocess = imagenet_preprocessing(width)
        resize = preprocess.get_layer("resize_crop")
        assert (resize.resize_size, resize.crop_size) == (entry.resize_size, entry.crop_size)
        expected = _torchvision_eval(images[0], entry.resize_size, entry.crop_size)
        out = keras.ops.convert_to_numpy(preprocess(images))[0]
        np.testing.assert_allclose(out, expected, atol=2e-4)
    assert {e.resize_size for e in CHECKPOINTS.values()} == {256, 232}
    with pytest.raises(ValueError, match="Received: width=0.75"):
        imagenet_preprocessing(0.75)


def test_the_converter_and_the_old_spellings_are_one_transform():
    from keras_autoshuffle.applications import evaluation_preprocessing
    from keras_autoshuffle.hub import ShuffleNetImageConverter

    images = _images(300, 398, batch=1)
    converter = ShuffleNetImageConverter(image_size=(224, 224), resize_size=232)
    expected = keras.ops.convert_to_numpy(converter(images))
    for preprocess in (imagenet_preprocessing(1.5), evaluation_preprocessing(224, 232)):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(preprocess(images)), expected)


def test_imagenet_preprocessing_is_its_checkpoints_by_name_and_normalisation(monkeypatch):
    # Both widths' transforms were named "evaluation_preprocessing_224" (the names since
    # 0.1.0 are the checkpoint's): one model with the two was refused by Keras.
    inputs = keras.Input((None, None, 3))
    model = keras.Model(inputs, [imagenet_preprocessing(w)(inputs) for w in (1.0, 1.5)])
    names = ["shufflenet_v2_x1_0_preprocessing", "shufflenet_v2_x1_5_preprocessing"]
    assert [layer.name for layer in model.layers[1:]] == names
    # The entry's mean and std, as its preset's converter (`hub.presets._classifier`).
    entry = dataclasses.replace(CHECKPOINTS[1.0], mean=(0.5, 0.5, 0.5), std=(0.25, 0.5, 1.0))
    monkeypatch.setitem(CHECKPOINTS, 1.0, entry)
    normalize = imagenet_preprocessing(1.0).get_layer("normalize")
    scale, offset = (np.ravel(v) for v in (normalize.scale, normalize.offset))
    np.testing.assert_allclose(scale, 1 / (255 * np.array(entry.std)))
    np.testing.assert_allclose(offset, -np.array(entry.mean) / entry.std)


def test_preprocessing_ends_as_preprocess_input():
    images = _images(260, 300, batch=1)
    cropped = ResizeCenterCrop(256, 224)(images)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(imagenet_preprocessing(0.5)(images)),
        preprocess_input(keras.ops.convert_to_numpy(cropped)),
        rtol=0,
        atol=1e-5,
    )


def test_preprocessing_saves_and_loads_safely(tmp_path):
    preprocess = imagenet_preprocessing(2.0)
    assert not any(isinstance(layer, keras.layers.Lambda) for layer in preprocess.layers)
    images = _images(240, 320, batch=1)
    expected = keras.ops.convert_to_numpy(preprocess(images))
    path = str(tmp_path / "preprocess.keras")
    preprocess.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(loaded(images)), expected)
    assert loaded.get_layer("resize_crop").resize_size == 232


def test_channels_first_crops_the_same_pixels():
    images = _images(230, 341, batch=1)
    last = keras.ops.convert_to_numpy(ResizeCenterCrop(256, 224)(images))
    first = ResizeCenterCrop(256, 224, data_format="channels_first")(images.transpose(0, 3, 1, 2))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(first).transpose(0, 2, 3, 1), last)


@pytest.mark.tensorflow_only(reason="tf.data traces with unknown image sides")
def test_preprocessing_runs_in_tf_data_on_images_of_any_size():
    import tensorflow as tf

    images = [_images(h, w, batch=1, seed=h)[0] for h, w in SIZES[:4]]
    dataset = tf.data.Dataset.from_generator(
        lambda: iter(images), output_signature=tf.TensorSpec((None, None, 3), tf.float32)
    )
    preprocess = imagenet_preprocessing(1.0)
    # Traced once with unknown sides: ResizeCenterCrop's TensorFlow path.
    batches = dataset.batch(1).map(preprocess)
    assert tuple(batches.element_spec.shape) == (None, 224, 224, 3)
    for image, batch in zip(images, batches, strict=True):
        np.testing.assert_allclose(batch[0].numpy(), _torchvision_eval(image, 256, 224), atol=2e-4)


def test_resize_center_crop_refuses_bad_sizes():
    with pytest.raises(ValueError, match="Received: crop_size=300"):
        ResizeCenterCrop(256, 300)
    with pytest.raises(ValueError, match="Received: resize_size=0"):
        ResizeCenterCrop(0, 224)
    with pytest.raises(ValueError, match=r"Received: images.shape=\(5, 6, 3\)"):
        ResizeCenterCrop(4, 2)(np.zeros((5, 6, 3), "float32"))


def test_preprocess_input_is_keras_torch_mode_and_keeps_its_input():
    images = np.random.default_rng(1).uniform(0, 255, (2, 5, 6, 3)).astype("float32")
    before = images.copy()
    ours = preprocess_input(images)
    np.testing.assert_array_equal(images, before)  # Keras's divides a float array in place
    np.testing.assert_array_equal(
        ours, imagenet_utils.preprocess_input(images.copy(), mode="torch")
    )
    first = images.transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(
        preprocess_input(first, data_format="channels_first"),
        imagenet_utils.preprocess_input(first.copy(), data_format="channels_first", mode="torch"),
    )


@pytest.fixture
def class_index(tmp_path, monkeypatch):
    """Keras's imagenet_class_index.json where `decode_predictions` looks: no download."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    (tmp_path / "models").mkdir()
    with open(os.path.join(FIXTURES, "imagenet_class_index.json")) as handle:
        index = json.load(handle)
    (tmp_path / "models" / "imagenet_class_index.json").write_text(json.dumps(index))
    return index


def test_decode_predictions_gives_keras_results(class_index, monkeypatch):
    # Keras's decoder keeps the index in a private module global, read once: given here.
    from keras.src.applications import imagenet_utils as keras_source

    monkeypatch.setattr(keras_source, "CLASS_INDEX", class_index)
    preds = np.random.default_rng(3).random((3, 1000)).astype("float32")
    ours = decode_predictions(preds, top=4)
    keras_results = imagenet_utils.decode_predictions(preds, top=4)
    assert ours == [[tuple(entry) for entry in row] for row in keras_results]


def test_decode_predictions_refuses_non_finite_scores(class_index):
    preds = np.zeros((2, 1000), "float32")
    preds[1, 7] = np.nan
    with pytest.raises(ValueError, match=r"Received: preds\[1, 7\]=nan"):
        decode_predictions(preds)
    preds[1, 7] = -np.inf
    with pytest.raises(ValueError, match=r"Received: preds\[1, 7\]=-inf"):
        decode_predictions(preds)


def test_decode_predictions_takes_numpy_integer_top(class_index):
    preds = np.zeros((1, 1000), "float32")
    preds[0, :3] = [0.5, 0.3, 0.2]
    assert [c[1] for c in decode_predictions(preds, top=np.int64(2))[0]] == ["tench", "goldfish"]
    for bad in (np.int64(0), np.float64(2.0), np.bool_(True), True):
        with pytest.raises(ValueError, match="Received: top="):
            decode_predictions(preds, top=bad)


def _fresh(images, width=1.0, data_format=None):
    return keras.ops.convert_to_numpy(imagenet_preprocessing(width, data_format)(images))


def test_a_wrong_rank_call_is_refused_and_leaves_the_preprocessing_working():
    # Keras built a Sequential on its first call, for that call's shape, and kept that
    # shape when the call failed: one image without its batch axis broke every later call.
    images = _images(30, 40, batch=1)
    preprocess = imagenet_preprocessing(1.0)
    for bad in (images[0], images[None], images[0, :, :, 0]):
        shape = re.escape(str(bad.shape))
        with pytest.raises(ValueError, match=rf"expected ndim=4.*Full shape received: {shape}"):
            preprocess(bad)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(preprocess(images)), _fresh(images))
    # Later batches of other sizes, sides and channel counts work too.
    other = _images(50, 20, batch=3)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(preprocess(other)), _fresh(other))
    with pytest.raises(ValueError, match=r"Received: images.shape=\(30, 40, 3\)"):
        ResizeCenterCrop(256, 224).compute_output_shape((30, 40, 3))


@pytest.mark.parametrize("shape", [(1, 0, 5, 3), (2, 5, 0, 3), (1, 0, 0, 3)])
def test_empty_images_are_refused_naming_their_shape(shape):
    message = rf"at least 1 pixel on each side. Received: images.shape={re.escape(str(shape))}"
    with pytest.raises(ValueError, match=message):
        imagenet_preprocessing(1.0)(np.zeros(shape, "float32"))
    with pytest.raises(ValueError, match=message):
        ResizeCenterCrop(4, 2)(np.zeros(shape, "uint8"))


def test_gray_and_alpha_images_are_made_rgb_as_pils_convert():
    from PIL import Image

    rgba = np.random.default_rng(4).integers(0, 256, (1, 40, 30, 4), dtype=np.uint8)
    gray_alpha = rgba[..., [0, 3]]
    for array, mode in ((rgba, "RGBA"), (gray_alpha, "LA"), (rgba[..., :1], "L")):
        image = Image.fromarray(array[0] if mode != "L" else array[0, ..., 0], mode)
        rgb = np.asarray(image.convert("RGB"))[None]
        np.testing.assert_array_equal(_fresh(array), _fresh(rgb))
    # channels_first, and the layer alone (values and dtype kept).
    first = rgba.transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(
        _fresh(first, data_format="channels_first"),
        _fresh(rgba[..., :3].transpose(0, 3, 1, 2), data_format="channels_first"),
    )
    for channels in (0, 5):
        shape = (1, 8, 9, channels)
        with pytest.raises(
            ValueError, match=rf"1 \(gray\).*4 \(RGBA\).*images.shape={re.escape(str(shape))}"
        ):
            imagenet_preprocessing(1.0)(np.zeros(shape, "float32"))


def test_too_long_images_are_refused_before_anything_is_resized(monkeypatch):
    def resize(*args, **kwargs):
        raise AssertionError("resized")

    limit = r"longer side at most 100 times the shorter \(MAX_ASPECT_RATIO"
    with monkeypatch.context() as patched:
        patched.setattr(keras.ops.image, "resize", resize)
        # 1 x 100000 would be resized to 256 x 25,600,000 (78 GB in float32). (Gray is
        # made RGB first: the shape named has 3 channels.)
        for shape in [(1, 1, 100000, 3), (2, 300, 2, 3), (1, 1, 101, 1)]:
            images = np.zeros(shape, "float32")
            sides = re.escape(str(shape[:3])[:-1])
            with pytest.raises(ValueError, match=rf"{limit}.*images.shape={sides}, 3\)"):
                imagenet_preprocessing(1.0)(images)
    # At the limit: resized to 4 x 400, cropped to 2 x 2.
    assert ResizeCenterCrop(4, 2)(np.zeros((1, 1, 100, 3), "float32")).shape == (1, 2, 2, 3)


def test_the_layers_refuse_what_are_not_pixel_values():
    with pytest.raises(ValueError, match=r"pixel values.*Received: images.dtype=bool"):
        ResizeCenterCrop(4, 2)(np.ones((1, 5, 5, 3), bool))
    with pytest.raises(ValueError, match=r"pixel values.*Received: images.dtype=bool"):
        ToRGB()(np.ones((1, 5, 5, 3), bool))
    # Keras's input casts the model's inputs to float32, as any model's: True is 1.
    assert imagenet_preprocessing(1.0)(np.ones((1, 5, 5, 3), bool)).shape == (1, 224, 224, 3)


@pytest.mark.tensorflow_only(reason="tf.data traces with unknown image sides and channels")
def test_tf_data_refuses_empty_long_and_odd_images_when_run():
    import tensorflow as tf

    def mapped(image):  # sides unknown when traced; channels too, but for RGB
        channels = 3 if image.shape[-1] == 3 else None
        spec = tf.TensorSpec((None, None, None, channels), tf.float32)
        dataset = tf.data.Dataset.from_generator(lambda: iter([image]), output_signature=spec)
        return dataset.map(imagenet_preprocessing(1.0))

    for shape, message in [
        ((1, 2, 300, 3), r"at most 100 times the shorter.*images.shape=\] \[1 2 300 3\]"),
        ((1, 0, 40, 3), r"at least 1 pixel on each side. Received: images.shape=\] \[1 0 40 3\]"),
        ((1, 5, 6, 5), r"4 \(RGBA\) channels.*images.shape=\] \[1 5 6 5\]"),
    ]:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            next(iter(mapped(np.zeros(shape, "float32"))))
    rgba = _images(30, 40, batch=1)
    rgba = np.concatenate([rgba, rgba[..., :1]], axis=-1)
    out = next(iter(mapped(rgba)))  # channels unknown when traced, too
    np.testing.assert_allclose(out.numpy(), _fresh(rgba[..., :3]), atol=1e-5)
    with pytest.raises(ValueError, match=r"at least 1 pixel on each side"):
        ResizeCenterCrop(4, 2)(tf.zeros((1, 0, 4, 3)))  # eager: the sides are known


@pytest.mark.tensorflow_only(reason="TensorFlow tensors of strings")
def test_the_layers_refuse_strings():
    import tensorflow as tf

    with pytest.raises(ValueError, match=r"Received: images.dtype=string"):
        ResizeCenterCrop(4, 2)(tf.fill((1, 5, 5, 3), "a"))
