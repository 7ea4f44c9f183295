"""The backbone for other tasks (issue 51 item 6): the builders' `features_only` pyramid,
keras-hub's `RetinaNetObjectDetector` and `DeepLabV3ImageSegmenter` on a ShuffleNet
(`hub.tasks`), trained a few steps on Fashion-MNIST items placed on a canvas, and the
backbone's folded pyramid (`folding.fold_pyramid`) exported to LiteRT.

The ImageNet weights come from the fixture checkpoint (torchvision's x0.5 features, a
10-class head) registered as the registry's x0.5 entry in a temporary Keras cache, as in
tests/test_hub.py: nothing is downloaded.
"""

import dataclasses
import os
import shutil
import time

import keras
import numpy as np
import pytest
from helpers import TINY_REPEATS, TINY_V2_CHANNELS, _randomize_batch_norm, tiny_v1, tiny_v2

from keras_autoshuffle import applications
from keras_autoshuffle._files import sha256_of
from keras_autoshuffle.applications.weights import registry
from keras_autoshuffle.data import load_fashion_mnist
from keras_autoshuffle.data.sources import DataMissingError
from keras_autoshuffle.export import export_litert, litert_interpreter
from keras_autoshuffle.folding import count_gathers, fold_pyramid
from keras_autoshuffle.hub import ShuffleNetBackbone
from keras_autoshuffle.hub.tasks import deeplab_segmenter, retinanet_detector

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
CHECKPOINT = os.path.join(
    FIXTURES, "torch_checkpoints", "torchvision_shufflenet_v2_x0_5_legacy.pth"
)
PRESET = "shufflenet_v2_x0_5_imagenet"
STRIDES = {"P2": 4, "P3": 8, "P4": 16, "P5": 32}
SIDE, ITEM = 64, 28  # the canvas and a Fashion-MNIST item


# ---------------------------------------------------------------- features_only


def _layer_names(outputs):
    return {level: tensor._keras_history.operation.name for level, tensor in outputs.items()}


@pytest.mark.parametrize("build", [tiny_v2, tiny_v1], ids=["v2", "v1"])
def test_features_only_returns_the_pyramid_of_the_backbone(build):
    """A dict P2-P5 at strides 4-32: the outputs of the layers `ShuffleNetBackbone` uses."""
    options = dict(include_top=False, stem="imagenet", input_shape=(64, 64, 3))
    features = build(features_only=True, **options)
    assert list(features.output) == list(STRIDES)
    for level, tensor in features.output.items():
        assert tuple(tensor.shape[1:3]) == (64 // STRIDES[level],) * 2
    full = build(**options)
    expected = applications.common.pyramid_outputs(full)
    assert _layer_names(features.output) == _layer_names(expected)


def test_features_only_loads_weights_as_the_full_net(tmp_path):
    """`weights=` loads into the pyramid model as into the full net: equal P2-P5."""
    options = dict(include_top=False, stem="imagenet", input_shape=(32, 32, 3))
    full = tiny_v2(**options)
    _randomize_batch_norm(full, np.random.default_rng(0))
    path = str(tmp_path / "net.weights.h5")
    full.save_weights(path)
    features = tiny_v2(features_only=True, weights=path, **options)
    images = np.random.default_rng(1).normal(size=(2, 32, 32, 3)).astype("float32")
    expected = keras.Model(full.inputs, applications.common.pyramid_outputs(full))
    expected = expected.predict(images, verbose=0)
    got = features.predict(images, verbose=0)
    for level in STRIDES:
        np.testing.assert_array_equal(got[level], expected[level])


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(include_top=True), "Received: include_top=True"),
        (dict(pooling="avg"), "Received: pooling='avg'"),
        (dict(classes=10), "Received: classes=10"),
        (dict(features_only="yes"), "Received: features_only='yes'"),
        (dict(stem="cifar"), "Received: stem='cifar'"),
    ],
)
def test_features_only_refuses_what_it_cannot_return(options, message):
    arguments = dict(include_top=False, features_only=True, stem="imagenet")
    arguments.update(options)
    with pytest.raises(ValueError, match=message):
        tiny_v2(input_shape=(32, 32, 3), **arguments)


@pytest.fixture(scope="module")
def backbone():
    """A randomly initialised x0.5 ShuffleNetBackbone (any input size)."""
    return ShuffleNetBackbone(0.5)


def test_the_public_builders_take_features_only(backbone):
    """`ShuffleNetV2(..., features_only=True)` is the pyramid of `ShuffleNetBackbone`."""
    features = applications.ShuffleNetV2(0.5, include_top=False, features_only=True)
    channels = {level: t.shape[-1] for level, t in features.output.items()}
    assert channels == {"P2": 24, "P3": 48, "P4": 96, "P5": 192}
    assert _layer_names(features.output) == _layer_names(backbone.pyramid_outputs)
    with pytest.raises(ValueError, match="Received: include_top=True"):
        applications.ShuffleNetV1(features_only=True)


# ---------------------------------------------------------------- the tasks' arguments


@pytest.mark.parametrize(
    "build, options, message",
    [
        (retinanet_detector, dict(num_classes=0), "Received: num_classes=0"),
        (retinanet_detector, dict(min_level=6), "Received: min_level=6"),
        (retinanet_detector, dict(max_level=4), "Received: max_level=4"),
        (retinanet_detector, dict(image_size=(16, 16)), r"Received: image_size=\(16, 16\)"),
        (retinanet_detector, dict(image_size=(32.9, 40)), r"Received: image_size=\(32.9, 40\)"),
        (deeplab_segmenter, dict(image_size=(64, 64, 3)), r"Received: image_size=\(64, 64, 3\)"),
        (deeplab_segmenter, dict(spatial_pyramid_pooling_key="P6"), "=\\'P6\\'"),
        (deeplab_segmenter, dict(low_level_feature_key="P5"), "low_level_feature_key='P5'"),
    ],
)
def test_the_tasks_refuse_bad_arguments_by_name(backbone, build, options, message):
    arguments = {"num_classes": 3, **options}
    with pytest.raises(ValueError, match=message):
        build(backbone, **arguments)


@pytest.mark.parametrize("pooled, joined", [("P5", "P3"), ("P4", "P3"), ("P5", None)])
def test_the_segmenter_joins_any_finer_level(backbone, pooled, joined):
    # Before: the ASPP's output was always upsampled to P2's stride, so a decoder on P3 (as
    # the docstring allows) failed in Keras's Concatenate.
    segmenter = deeplab_segmenter(
        backbone, 3, spatial_pyramid_pooling_key=pooled, low_level_feature_key=joined
    )
    assert tuple(segmenter.backbone.output.shape) == (None, None, None, 256)
    logits = segmenter(np.zeros((1, 64, 96, 3), "float32"))
    assert tuple(logits.shape) == (1, 64, 96, 3)


def test_the_tasks_refuse_a_backbone_that_is_not_a_shufflenet():
    with pytest.raises(TypeError, match="Received: backbone=3"):
        retinanet_detector(3, num_classes=3)


@pytest.mark.slow
def test_the_tasks_save_and_load_with_safe_mode(tmp_path):
    """Both tasks round-trip through `.keras` files with `safe_mode=True` (no Lambda),
    their outputs equal."""
    images = np.random.default_rng(0).uniform(0, 255, (1, 64, 64, 3)).astype("float32")
    for name, build in (("detector", retinanet_detector), ("segmenter", deeplab_segmenter)):
        options = {"pre_logits_num_conv_layers": 1} if name == "detector" else {}
        task = build(ShuffleNetBackbone(0.5), num_classes=3, **options)
        path = tmp_path / f"{name}.keras"
        task.save(path)
        loaded = keras.saving.load_model(path, safe_mode=True)
        assert type(loaded) is type(task)
        expected = task(task.preprocessor(images))
        got = loaded(loaded.preprocessor(images))
        for a, b in zip(keras.tree.flatten(expected), keras.tree.flatten(got), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


# ---------------------------------------------------------------- training on real images


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A Keras cache holding the fixture checkpoint as the registry's x0.5 entry."""
    models = tmp_path_factory.mktemp("keras_home") / "models"
    models.mkdir()
    shutil.copyfile(CHECKPOINT, models / os.path.basename(CHECKPOINT))
    shutil.copyfile(
        os.path.join(FIXTURES, "imagenet_class_index.json"), models / "imagenet_class_index.json"
    )
    entry = dataclasses.replace(
        registry.CHECKPOINTS[0.5],
        file_name=os.path.basename(CHECKPOINT),
        sha256=sha256_of(CHECKPOINT),
        classes=10,
        file_size=os.path.getsize(CHECKPOINT),
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KERAS_HOME", str(models.parent))
        patch.setitem(registry.CHECKPOINTS, 0.5, entry)
        yield models


@pytest.fixture(scope="module")
def scenes():
    """8 canvases of SIDE x SIDE pixels, each holding two Fashion-MNIST test items side by
    side (no overlap), with their boxes (yxyx, tight around the garment), labels 0-9 and
    masks (0 background, label + 1 on the garment's pixels)."""
    try:
        (_, _), (items, labels) = load_fashion_mnist()
    except DataMissingError as error:
        pytest.skip(f"Fashion-MNIST is not installed: {error}")
    rng = np.random.default_rng(0)
    count, per_scene = 8, 2
    cell = SIDE // per_scene
    images = np.zeros((count, SIDE, SIDE, 3), "float32")
    masks = np.zeros((count, SIDE, SIDE, 1), "int32")
    boxes = np.zeros((count, per_scene, 4), "float32")
    classes = np.zeros((count, per_scene), "float32")
    for n in range(count):
        for k, index in enumerate(rng.choice(len(items), per_scene, replace=False)):
            top = rng.integers(0, SIDE - ITEM + 1)
            left = k * cell + rng.integers(0, cell - ITEM + 1)
            item, garment = items[index], items[index] > 16
            images[n, top : top + ITEM, left : left + ITEM] = item[..., None]
            masks[n, top : top + ITEM, left : left + ITEM, 0] = garment * (labels[index] + 1)
            rows, cols = np.nonzero(garment)
            boxes[n, k] = (top + rows.min(), left + cols.min(), top + rows.max() + 1,
                           left + cols.max() + 1)  # fmt: skip
            classes[n, k] = labels[index]
    return images, boxes, classes, masks


def _losses(task, x, y, steps):
    """The loss of each training step on all the scenes (one batch), and the seconds it
    took; the first is the loss before any update. Eagerly: tracing the training step
    took longer than these few steps (93 s against 5 s a step on two busy cores)."""
    start = time.perf_counter()
    history = task.fit(x, y, batch_size=len(x), epochs=steps, shuffle=False, verbose=0)
    return history.history["loss"], time.perf_counter() - start


@pytest.mark.slow
def test_the_detector_trains_on_fashion_items(cache, scenes):
    images, boxes, classes, _ = scenes
    detector = retinanet_detector(PRESET, num_classes=10, pre_logits_num_conv_layers=1)
    detector.compile(optimizer=keras.optimizers.Adam(1e-3), run_eagerly=True)
    # 2 steps: the loss fell to 0.31 of the first after one update (333 -> 103 -> 28 -> 11
    # in 4 steps on the 2-core EPYC), far under the bound.
    losses, seconds = _losses(detector, images, {"boxes": boxes, "labels": classes}, steps=2)
    print(f"detector losses {np.round(losses, 3).tolist()} in {seconds:.1f} s")
    assert np.all(np.isfinite(losses))
    assert losses[-1] < 0.8 * losses[0], losses
    found = detector.predict(images[:2], verbose=0)
    assert found["boxes"].shape[-1] == 4


@pytest.mark.slow
def test_the_segmenter_trains_on_fashion_items(cache, scenes):
    images, _, _, masks = scenes
    segmenter = deeplab_segmenter(PRESET, num_classes=11)
    segmenter.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        run_eagerly=True,
    )
    # 3 steps: 2.70 -> 2.21 -> 1.90 -> 1.58 in 4 on the 2-core EPYC; after two updates it
    # is 0.70 of the first, under the bound of 0.8 (after one, 0.82 is not).
    losses, seconds = _losses(segmenter, images, masks, steps=3)
    print(f"segmenter losses {np.round(losses, 3).tolist()} in {seconds:.1f} s")
    assert np.all(np.isfinite(losses))
    assert losses[-1] < 0.8 * losses[0], losses
    assert segmenter.predict(images[:1], verbose=0).shape == (1, SIDE, SIDE, 11)


# ---------------------------------------------------------------- folding and LiteRT


@pytest.mark.slow
def test_the_detectors_backbone_folds_and_exports_to_litert(tmp_path):
    """The folded pyramid of a detector's ShuffleNet equals its pyramid (no shuffle left
    but one gather per level) and its LiteRT file gives the same P2-P5. A tiny backbone
    (every stage, a stage of several units): the x0.5 net's conversion cost ~20 CPU-s more
    and checks nothing more."""
    encoder = ShuffleNetBackbone(
        0.5, image_shape=(SIDE, SIDE, 3), channels=TINY_V2_CHANNELS, repeats=TINY_REPEATS
    )
    _randomize_batch_norm(encoder, np.random.default_rng(0))
    detector = retinanet_detector(encoder, num_classes=3, pre_logits_num_conv_layers=1)
    backbone = detector.backbone.image_encoder
    folded = fold_pyramid(backbone)
    assert count_gathers(folded) == 3
    images = np.random.default_rng(1).normal(size=(2, SIDE, SIDE, 3)).astype("float32")
    expected = keras.Model(backbone.inputs, backbone.pyramid_outputs)(images)
    expected = {level: np.asarray(x) for level, x in expected.items()}
    got = folded(images)
    for level in STRIDES:
        np.testing.assert_allclose(np.asarray(got[level]), expected[level], atol=1e-5)
    path = export_litert(folded, tmp_path / "pyramid.tflite")
    interpreter = litert_interpreter(path, shape=images[:1].shape)
    detail = interpreter.get_input_details()[0]
    interpreter.set_tensor(detail["index"], images[:1])
    interpreter.invoke()
    outputs = {
        tuple(o["shape"][1:]): interpreter.get_tensor(o["index"])
        for o in interpreter.get_output_details()
    }
    for level in STRIDES:
        np.testing.assert_allclose(
            outputs[expected[level].shape[1:]], expected[level][:1], atol=1e-4
        )
