"""The weights registry (`applications.CHECKPOINTS`, `hub.list_presets()`): its names,
each entry's data against an independent source (torchvision's published metadata, the
built model, `count_macs`), and its errors. Loading by name goes through the
download seam of tests/test_pretrained_weights.py (`test_weights_by_name_*`)."""

import json
import os
import shutil

import numpy as np
import pytest

from keras_autoshuffle import applications
from keras_autoshuffle.applications import CHECKPOINTS

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
NAMES = [
    "shufflenet_v2_x0_5.imagenet",
    "shufflenet_v2_x1_0.imagenet",
    "shufflenet_v2_x1_5.imagenet",
    "shufflenet_v2_x2_0.imagenet",
]
# torchvision/models/shufflenetv2.py, `ShuffleNet_V2_X*_Weights.IMAGENET1K_V1`: url, meta
# num_params, acc@1, acc@5, _ops (GFLOPs), _file_size (MiB), transforms' resize_size.
TORCHVISION = {
    0.5: ("shufflenetv2_x0.5-f707e7126e.pth", 1366792, 60.552, 81.746, 0.04, 5.282, 256),
    1.0: ("shufflenetv2_x1-5666bf0f80.pth", 2278604, 69.362, 88.316, 0.145, 8.791, 256),
    1.5: ("shufflenetv2_x1_5-3c479a10.pth", 3503624, 72.996, 91.086, 0.296, 13.557, 232),
    2.0: ("shufflenetv2_x2_0-8be3c8ee.pth", 7393996, 76.230, 93.006, 0.583, 28.433, 232),
}


def test_one_registry_the_presets_and_names_are_views_of_it():
    from keras_autoshuffle import hub
    from keras_autoshuffle.applications.weights import registry

    assert registry.names() == NAMES
    presets = [name.replace(".", "_") for name in NAMES]
    assert list(hub.list_presets()) == presets
    for width, name, preset in zip(sorted(CHECKPOINTS), NAMES, presets, strict=True):
        entry = CHECKPOINTS[width]
        assert (entry.name, entry.preset, entry.width) == (name, preset, width)
        assert entry.builder == "ShuffleNetV2"
        assert registry.named(preset) is registry.named(name) is entry
        assert hub.list_presets()[preset]["metadata"]["weights"] == name
        assert registry.is_pretrained(preset) and registry.is_pretrained(name)
    for other in ("shufflenet_v2_x1_0", 1.0, None, np.array(["imagenet"])):
        assert registry.named(other) is None and not registry.is_pretrained(other)


@pytest.mark.parametrize("width", sorted(TORCHVISION))
def test_each_entry_is_torchvisions(width):
    file_name, params, acc1, acc5, gflops, mib, resize = TORCHVISION[width]
    entry = CHECKPOINTS[width]
    assert entry.url == "https://download.pytorch.org/models/" + file_name
    assert (entry.num_params, entry.acc1, entry.acc5) == (params, acc1, acc5)
    assert entry.metrics == {"ImageNet-1K": {"acc@1": acc1, "acc@5": acc5}}
    assert (entry.resize_size, entry.crop_size, entry.classes) == (resize, 224, 1000)
    # torchvision rounds its sizes to 3 decimals of MiB and its GFLOPs to 2-3 digits.
    assert round(entry.file_size / 2**20, 3) == mib
    assert round(entry.macs / 1e9, 3 if gflops >= 0.1 else 2) == gflops
    # The hex in the file name is the start of the SHA-256 (torch.hub's check_hash).
    assert entry.sha256.startswith(file_name.rsplit("-", 1)[1].removesuffix(".pth"))
    suffix = f"X{width:.1f}".replace(".", "_")  # X0_5
    assert entry.torchvision_name == f"ShuffleNet_V2_{suffix}_Weights.IMAGENET1K_V1"
    # Program-readable: every field and the URL, as JSON.
    data = json.loads(json.dumps(entry.to_dict()))
    assert data["name"] == entry.name and data["url"] == entry.url
    assert data["mean"] == list(entry.mean) and data["file_size"] == entry.file_size


def test_the_x1_0_file_size_and_hash_are_exact():
    # OpenVINO's model zoo (models/public/shufflenet-v2-x1.0/model.yml).
    entry = CHECKPOINTS[1.0]
    assert entry.file_size == 9_218_294 and len(entry.sha256) == 64


@pytest.mark.parametrize("width", sorted(CHECKPOINTS))
def test_parameters_and_multiply_adds_are_the_built_models(width):
    entry = CHECKPOINTS[width]
    model = applications.ShuffleNetV2(width, input_shape=(224, 224, 3))
    # torchvision counts parameters, not BatchNorm's moving statistics.
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    assert trainable == entry.num_params
    assert applications.count_macs(model) == entry.macs


@pytest.mark.parametrize("width", sorted(CHECKPOINTS))
def test_preprocessing_is_the_evaluation_transform(width):
    entry = CHECKPOINTS[width]
    ours = applications.imagenet_preprocessing(width)
    images = np.random.default_rng(0).uniform(0, 255, size=(2, 300, 260, 3)).astype("float32")
    same = applications.evaluation_preprocessing(entry.crop_size, entry.resize_size)
    np.testing.assert_array_equal(np.asarray(ours(images)), np.asarray(same(images)))


def test_class_names_are_decode_predictions_classes(tmp_path, monkeypatch):
    # The class index decode_predictions uses, placed in a fresh cache: no download.
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    (tmp_path / "models").mkdir()
    shutil.copyfile(
        os.path.join(FIXTURES, "imagenet_class_index.json"),
        tmp_path / "models" / "imagenet_class_index.json",
    )
    names = CHECKPOINTS[1.0].class_names()
    assert len(names) == 1000 and names[:2] == ["tench", "goldfish"]
    preds = np.eye(1000, dtype="float32")[[281]]
    assert applications.decode_predictions(preds, top=1)[0][0][1] == names[281] == "tabby"


def test_a_name_that_is_no_entry_is_refused_naming_the_entries():
    with pytest.raises(ValueError) as info:
        applications.ShuffleNetV2(weights="shufflenet_v2_x1_0")
    message = str(info.value)
    assert all(name in message for name in NAMES)
    assert message.endswith("Received: weights='shufflenet_v2_x1_0'")
