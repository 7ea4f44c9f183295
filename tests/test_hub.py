"""`keras_autoshuffle.hub`: the keras-hub classes and the presets of the weights registry.

The presets are built from the registry as `weights="imagenet"` is (test_pretrained_weights
.py): the registry's x0.5 entry is replaced by the fixture checkpoint (torchvision's x0.5
with 10 classes, legacy format) placed in a temporary Keras cache with ImageNet's class
index, so nothing is downloaded and torchvision's logits are known.
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap

import keras
import keras_hub
import numpy as np
import pytest

from keras_autoshuffle import applications
from keras_autoshuffle._files import sha256_of
from keras_autoshuffle.applications.weights import registry
from keras_autoshuffle.hub import (
    ShuffleNetBackbone,
    ShuffleNetImageClassifier,
    ShuffleNetImageClassifierPreprocessor,
    ShuffleNetImageConverter,
    list_presets,
    presets,
)
from keras_autoshuffle.hub.presets import PRESET_VERSION
from keras_autoshuffle.layers import RelaxedShuffle

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
CHECKPOINT = os.path.join(
    FIXTURES, "torch_checkpoints", "torchvision_shufflenet_v2_x0_5_legacy.pth"
)
PARITY = os.path.join(FIXTURES, "torchvision_shufflenet_v2_x0_5.npz")
NAME = "shufflenet_v2_x0_5_imagenet"
NEWER = PRESET_VERSION + 1  # a layout this version does not read
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _images(seed=0):
    """Two raw images of camera-like sizes (pixel values 0-255)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3)).astype("float32") for h, w in ((480, 640), (333, 500))]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A Keras cache holding the fixture checkpoint as the registry's x0.5 entry."""
    home = tmp_path_factory.mktemp("keras_home")
    models = home / "models"
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
        patch.setenv("KERAS_HOME", str(home))
        patch.setitem(registry.CHECKPOINTS, 0.5, entry)
        yield models


@pytest.fixture(scope="module")
def preset(cache):
    """The x0.5 preset, built from the registry."""
    return ShuffleNetImageClassifier.from_preset(NAME)


@pytest.fixture(scope="module")
def parity():
    with np.load(PARITY) as data:
        return {key: data[key] for key in data.files}


@pytest.mark.parametrize(
    "options, channels",
    [
        (dict(width=0.5), (24, 48, 96, 192, 1024)),
        (dict(width=0.5, family="v1", groups=3), (12, 120, 240, 480, 480)),
        (dict(width=0.5, shuffle="auto"), (24, 48, 96, 192, 1024)),
    ],
)
def test_backbone_pyramid_is_p2_to_p5_at_strides_4_to_32(options, channels):
    backbone = ShuffleNetBackbone(**options)
    assert backbone.name == "shuffle_net_backbone"  # keras-hub's: the class in snake case
    features = keras.Model(backbone.input, [backbone.output, backbone.pyramid_outputs])
    output, pyramid = features(np.zeros((1, 64, 96, 3), "float32"))
    assert sorted(pyramid) == ["P2", "P3", "P4", "P5"]
    for level, stride in zip(("P2", "P3", "P4", "P5"), (4, 8, 16, 32), strict=True):
        assert tuple(pyramid[level].shape[1:3]) == (64 // stride, 96 // stride)
    assert [pyramid[k].shape[-1] for k in ("P2", "P3", "P4", "P5")] + [output.shape[-1]] == list(
        channels
    )
    learned = any(isinstance(layer, RelaxedShuffle) for layer in backbone.layers)
    assert learned == (options.get("shuffle") == "auto")
    again = ShuffleNetBackbone.from_config(backbone.get_config())
    assert again.get_config() == backbone.get_config()


def test_converter_is_torchvisions_evaluation_transform():
    images = _images()
    for width in (1.0, 1.5):  # resize 256 and 232, crop 224
        entry = registry.CHECKPOINTS[width]
        reference = applications.imagenet_preprocessing(width)
        converter = ShuffleNetImageConverter((224, 224), resize_size=entry.resize_size)
        for image in images:
            ours = keras.ops.convert_to_numpy(converter(image[None]))
            expected = keras.ops.convert_to_numpy(reference(image[None]))
            assert ours.shape == (1, 224, 224, 3)
            np.testing.assert_allclose(ours, expected, rtol=0, atol=2e-6)
            single = keras.ops.convert_to_numpy(converter(image))
            np.testing.assert_array_equal(single, ours[0])
    # keras-hub's own converter cannot say it: crop_to_aspect_ratio keeps the whole
    # shorter side, torchvision 224 / 256 of it.
    base = keras_hub.layers.ImageConverter(
        (224, 224), scale=converter.scale, offset=converter.offset, antialias=True
    )
    difference = np.abs(keras.ops.convert_to_numpy(base(images[0][None])) - expected)
    assert difference.max() > 0.5
    gray = keras.ops.convert_to_numpy(converter(images[0][None, :, :, :1]))
    assert gray.shape == (1, 224, 224, 3)
    with pytest.raises(ValueError, match=r"Received: image_size=\(224, 160\)"):
        ShuffleNetImageConverter((224, 160))
    copy = ShuffleNetImageConverter.from_config(converter.get_config())
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(copy(images[1][None])), ours)


@pytest.mark.slow  # the registry's conversion, then three models: 20 s on 2 busy cores
def test_preset_logits_equal_the_builder_with_imagenet_preprocessing(cache, preset, parity):
    # Raw images: the preset's preprocessor against today's two spellings.
    images = _images()
    model = applications.ShuffleNetV2(
        0.5,
        weights="imagenet",
        classes=10,
        classifier_activation=None,
        stem="imagenet",
        input_shape=(None, None, 3),
    )
    preprocess = applications.imagenet_preprocessing(0.5)
    for image in images:
        expected = keras.ops.convert_to_numpy(model(preprocess(image[None])))
        ours = preset.predict(image[None], verbose=0)
        np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-4)
    # torchvision's own logits on its preprocessed inputs (the model without preprocessor).
    logits = keras.ops.convert_to_numpy(preset(parity["inputs_224"]))
    np.testing.assert_allclose(logits, parity["logits_224"], rtol=0, atol=1e-4)
    index = registry.imagenet_class_index("test")
    assert preset.class_names == [index[str(i)][1] for i in range(10)]
    assert preset.preprocessor.image_converter.resize_size == 256
    # Built once: the folder in the cache serves later calls, also without the checkpoint;
    # with `num_classes`, a new head on the pretrained backbone.
    assert os.path.isfile(cache / NAME / "task.weights.h5")
    os.rename(cache / os.path.basename(CHECKPOINT), cache / "moved.pth")
    try:
        tuned = ShuffleNetImageClassifier.from_preset(NAME, num_classes=5)
        backbone = ShuffleNetBackbone.from_preset(NAME)
    finally:
        os.rename(cache / "moved.pth", cache / os.path.basename(CHECKPOINT))
    assert tuned.num_classes == 5 and tuned.class_names is None
    assert tuned.predict(images[0][None], verbose=0).shape == (1, 5)
    for model in (tuned.backbone, backbone):
        for a, b in zip(model.weights, preset.backbone.weights, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    with pytest.raises(ValueError, match="each of the 3 outputs.*Received: 2 class_names"):
        ShuffleNetImageClassifier(preset.backbone, 3, class_names=["a", "b"])


def test_the_presets_are_the_registry(cache):
    presets = list_presets()
    assert sorted(presets) == [
        "shufflenet_v2_x0_5_imagenet",
        "shufflenet_v2_x1_0_imagenet",
        "shufflenet_v2_x1_5_imagenet",
        "shufflenet_v2_x2_0_imagenet",
    ]
    metadata = presets["shufflenet_v2_x1_0_imagenet"]["metadata"]
    entry = registry.CHECKPOINTS[1.0]
    assert metadata["params"] == entry.num_params == 2_278_604
    assert metadata["metrics"] == {"ImageNet-1K": {"acc@1": 69.362, "acc@5": 88.316}}
    assert metadata["license"] == "BSD-3-Clause"
    assert metadata["source"] == entry.url


@pytest.mark.slow  # two preset builds: 6 s on 2 busy cores
def test_two_builds_racing_into_one_cache_keep_one_whole_folder(cache, tmp_path, monkeypatch):
    # Two processes build a preset at once: the other finishes between this one's write
    # and its move. It removed this one's temporary (one fixed name) and the move failed.
    models = tmp_path / "models"
    models.mkdir()
    files = [name for name in os.listdir(cache) if os.path.isfile(cache / name)]
    for name in files:
        shutil.copyfile(cache / name, models / name)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    build = presets._classifier

    def build_and_race(entry):
        classifier = build(entry)
        save = classifier.save_to_preset

        def save_then_race(folder):
            save(folder)
            monkeypatch.setattr(presets, "_classifier", build)
            presets.build_preset(entry)  # the other process, start to end

        classifier.save_to_preset = save_then_race
        return classifier

    monkeypatch.setattr(presets, "_classifier", build_and_race)
    folder = presets.build_preset(registry.CHECKPOINTS[0.5])
    assert folder == str(models / NAME)
    presets.check_folder(folder)
    # One folder, no temporaries left beside it.
    assert [name for name in os.listdir(models) if name.startswith(NAME)] == [NAME]


# A fresh process: the hub hook is process state.
ROUND_TRIP = """
import importlib.util
import sys
import warnings
import numpy as np
import keras_autoshuffle
from keras_autoshuffle import _hub_hook
assert importlib.util.find_spec("keras_hub") is not None  # a probe, as libraries make
assert "keras_hub" not in sys.modules  # the package's import stays without keras-hub
import keras
import keras_hub
assert keras.saving.get_registered_object("keras_autoshuffle>ShuffleNetBackbone"), "no hub"
folder, images = sys.argv[1], np.load(sys.argv[2])
classifier = keras_hub.models.ImageClassifier.from_preset(folder)
backbone = keras_hub.models.Backbone.from_preset(folder)
assert type(classifier).__name__ == "ShuffleNetImageClassifier", type(classifier)
assert type(backbone).__name__ == "ShuffleNetBackbone", type(backbone)
classifier.save(sys.argv[3])
loaded = keras.saving.load_model(sys.argv[3], safe_mode=True)
np.savez(
    sys.argv[4],
    preset=classifier.predict(images, verbose=0),
    keras_file=loaded.predict(images, verbose=0),
    features=backbone.predict(classifier.preprocessor(images), verbose=0),
    names=np.array(classifier.class_names),
)
# keras-hub imported again (its submodules cached), keras_autoshuffle.hub failing this time
del sys.modules["keras_hub"]
sys.modules["keras_autoshuffle.hub"] = None
_hub_hook.install()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import keras_hub
assert keras_hub.models.ImageClassifier
print("WARNED:", *[str(w.message) for w in caught])
"""


@pytest.mark.slow  # a fresh Python process: 30 s on a busy 2-core machine
def test_a_saved_preset_loads_bit_identical_in_a_fresh_process_whose_hook_survives(
    preset, tmp_path
):
    # keras-hub's base classes find ours after `import keras_autoshuffle`, a `find_spec`
    # probe before `import keras_hub` included (it left the hook off); safe_mode=True
    # (keras-hub deserializes in safe mode) and a .keras file with safe_mode=True. Then a
    # failing keras_autoshuffle.hub must not break the user's `import keras_hub`, only warn.
    folder = tmp_path / "preset"
    preset.save_to_preset(str(folder))
    images = _images()[0][None]
    np.save(tmp_path / "images.npy", images)
    result = tmp_path / "result.npz"
    command = [sys.executable, "-c", textwrap.dedent(ROUND_TRIP), str(folder)]
    command += [str(tmp_path / "images.npy"), str(tmp_path / "model.keras"), str(result)]
    env = {**os.environ, "PYTHONPATH": ROOT}
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    with np.load(result) as saved:
        expected = preset.predict(images, verbose=0)
        np.testing.assert_array_equal(saved["preset"], expected)
        np.testing.assert_array_equal(saved["keras_file"], expected)
        features = preset.backbone.predict(preset.preprocessor(images), verbose=0)
        np.testing.assert_array_equal(saved["features"], features)
        assert list(saved["names"]) == preset.class_names
    assert "WARNED: keras_autoshuffle.hub could not be imported" in run.stdout
    assert "ModuleNotFoundError" in run.stdout


def _edit_json(name, edit):
    def tamper(folder):
        path = folder / name
        config = json.loads(path.read_text())
        edit(config)
        path.write_text(json.dumps(config))

    return tamper


def _other_width(config):
    backbone = config["config"]["backbone"]["config"] if "backbone" in config["config"] else None
    (backbone or config["config"])["width"] = 1.0


def _drop_a_name(config):
    config["config"]["class_names"] = config["config"]["class_names"][:-1]


BAD_FOLDERS = {
    "missing weights": (
        lambda folder: (folder / "model.weights.h5").unlink(),
        r"model\.weights\.h5 is missing",
    ),
    "missing task weights": (
        lambda folder: (folder / "task.weights.h5").unlink(),
        r"task\.weights\.h5 is missing",
    ),
    "a class not ours": (
        _edit_json("config.json", lambda c: c.update(registered_name="keras_hub>ResNetBackbone")),
        r"config\.json: `registered_name` .*Received: registered_name='keras_hub>ResNetBackbone'",
    ),
    "weights of another width": (
        lambda folder: [_edit_json(n, _other_width)(folder) for n in ("config.json", "task.json")],
        r"model\.weights\.h5 does not fit .* layer 'stage2_unit1_conv1' has shape \(1, 1, 24, 58\)"
        r"\. Received: \(1, 1, 24, 24\)$",
    ),
    "labels of another count": (
        _edit_json("task.json", _drop_a_name),
        r"task\.json: `class_names` has 9 names but `num_classes` is 10",
    ),
    "a newer version": (
        _edit_json("config.json", lambda c: c["config"].update(preset_version=NEWER)),
        rf"config\.json: `preset_version` {NEWER} .*newer version.*"
        rf"Received: preset_version={NEWER}",
    ),
    "no config object": (
        _edit_json("config.json", lambda c: c.pop("config")),
        r"config\.json: `config` must be an object .*Received: config=None$",
    ),
    "class names not a list": (
        _edit_json("task.json", lambda c: c["config"].update(class_names=5)),
        r"task\.json: `class_names` must be a list of strings\. Received: class_names=5$",
    ),
    "class names not strings": (
        _edit_json("task.json", lambda c: c["config"].update(class_names=list(range(10)))),
        r"task\.json: `class_names` must be a list of strings\. Received: class_names=\[0, 1",
    ),
    "not JSON": (
        lambda folder: (folder / "task.json").write_text("{"),
        r"task\.json is not a keras-hub preset config",
    ),
}


def _snapshot(folder):
    """{path: SHA-256} of every file under `folder`."""
    return {
        os.path.join(root, name): sha256_of(os.path.join(root, name))
        for root, _, names in os.walk(folder)
        for name in names
    }


@pytest.mark.parametrize("case", sorted(BAD_FOLDERS))
def test_a_bad_preset_folder_is_named_and_nothing_written(cache, preset, tmp_path, case):
    folder = tmp_path / "preset"
    shutil.copytree(cache / NAME, folder)
    tamper, message = BAD_FOLDERS[case]
    tamper(folder)
    before, cached = _snapshot(folder), _snapshot(cache)
    with pytest.raises(ValueError, match=message):
        ShuffleNetImageClassifier.from_preset(str(folder))
    assert _snapshot(folder) == before and _snapshot(cache) == cached
    assert sorted(os.listdir(tmp_path)) == ["preset"]


def test_a_preset_without_a_version_is_of_the_first_layout(cache, preset, tmp_path):
    # `ShuffleNetBackbone` defaults `preset_version` to 1; the folder check refused it as newer.
    folder = tmp_path / "preset"
    shutil.copytree(cache / NAME, folder)
    _edit_json("config.json", lambda c: c["config"].pop("preset_version"))(folder)
    backbone = ShuffleNetBackbone.from_preset(str(folder))
    assert backbone.get_config()["preset_version"] == PRESET_VERSION  # saved as this layout


def test_a_preset_that_is_neither_a_name_nor_a_folder(cache, tmp_path):
    with pytest.raises(ValueError, match=r"shufflenet_v2_x0_5_imagenet.*Received: preset='nope'"):
        ShuffleNetBackbone.from_preset("nope")
    with pytest.raises(ValueError, match=rf"Received: preset_version={NEWER}"):
        ShuffleNetBackbone(0.5, preset_version=NEWER)
    classes = [ShuffleNetImageClassifierPreprocessor, ShuffleNetImageConverter]
    assert all(c.backbone_cls is ShuffleNetBackbone for c in classes)


@pytest.mark.parametrize("name", ["cat\u2028dog", "cat\x1bdog", "\u202ecat"])
def test_class_names_read_back_other_than_written_are_refused(name):
    # One rule for class names (keras_autoshuffle._class_names), as image folders apply it.
    backbone = ShuffleNetBackbone(width=0.5, image_shape=(32, 32, 3))
    with pytest.raises(ValueError, match=r"`class_names`.*Received:"):
        ShuffleNetImageClassifier(backbone, 2, class_names=[name, "bird"])


def test_a_backbone_of_any_stem_and_size_round_trips_its_config():
    # A fine-tune from scratch on small images: the CIFAR stem (no pyramid: its strides
    # are not 4-32), a small net's channels and repeats, all in the config (a preset
    # rebuilds the same net).
    backbone = ShuffleNetBackbone(
        0.5, stem="cifar", channels=(8, 16, 32, 64, 64), repeats=(1, 2, 1)
    )
    assert backbone.pyramid_outputs == {}
    assert backbone(np.zeros((1, 32, 32, 3))).shape == (1, 4, 4, 64)  # stride 8
    assert "stage3_unit2_conv1" in {layer.name for layer in backbone.layers}
    again = ShuffleNetBackbone.from_config(backbone.get_config())
    assert again.get_config() == backbone.get_config() and again.count_params() == (
        backbone.count_params()
    )
    with pytest.raises(ValueError, match=r"Received: stem='auto'"):
        ShuffleNetBackbone(0.5, stem="auto")


class _OptimizerAtTrainBegin(keras.callbacks.Callback):
    """Whether the optimizer is built when training begins (before the step's trace)."""

    def on_train_begin(self, logs=None):
        self.built = self.model.optimizer.built


def test_fit_takes_raw_images_and_builds_the_optimizer_before_the_step_is_traced():
    """The page's `tuned.fit(images, labels)`: raw pixels of another size through the
    preprocessor, and the loss falls. The optimizer is built before the training step's
    first trace: TensorFlow's trainer otherwise builds it inside, which nearly doubled a first
    `fit`'s time (seen failing without `ShuffleNetImageClassifier.fit`)."""
    keras.utils.set_random_seed(0)
    converter = ShuffleNetImageConverter(image_size=(32, 32))
    classifier = ShuffleNetImageClassifier(
        ShuffleNetBackbone(width=0.5, channels=(8, 16, 32, 64, 64), repeats=(1, 1, 1)),
        3,
        preprocessor=ShuffleNetImageClassifierPreprocessor(converter),
    )
    classifier.compile(optimizer=keras.optimizers.Adam(1e-2))
    labels = np.arange(12) % 3
    images = np.random.default_rng(0).integers(0, 90, (12, 40, 48, 3)).astype("float32")
    for image, label in zip(images, labels, strict=True):
        image[..., label] += 160  # the colour says the class
    check = _OptimizerAtTrainBegin()
    history = classifier.fit(images, labels, batch_size=12, epochs=4, verbose=0, callbacks=[check])
    assert check.built
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
