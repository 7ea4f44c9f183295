"""`finetune()` and keras-hub presets: a run writes its classifier as a preset (`preset/`),
and starts from a preset name or folder (`weights=`, `--weights`).

The run here starts from a preset of a tiny network (tests/test_finetune.py's
`tiny_network`, random weights: no training to make it) and writes model.keras alone, so
one short run checks both ways.
"""

import json
import os
import shutil

import keras
import keras_hub
import numpy as np
import pytest
from PIL import Image
from test_finetune import CLASSES, SIDE, TINY, tiny_network
from test_finetune import images as images  # noqa: F401 (fixtures)
from test_finetune import tiny_networks as tiny_networks  # noqa: F401
from test_hub import NAME, NEWER
from test_hub import cache as cache  # noqa: F401 (fixtures: the registry's x0.5 checkpoint)

from keras_autoshuffle import hub, prediction
from keras_autoshuffle.commands import finetune as finetune_command
from keras_autoshuffle.finetuning import finetune, network, run_folder
from keras_autoshuffle.hub import ShuffleNetImageClassifier

START_CLASSES = ["a", "b", "c", "d"]  # not the run's: the run needs a new head


def _save_preset(folder, width=0.5, seed=0):
    """A preset of a tiny network of `width` (random weights, seeded) with four classes."""
    keras.utils.set_random_seed(seed)
    model = tiny_network(width, input_shape=(SIDE, SIDE, 3), classes=len(START_CLASSES))
    classifier = hub.presets.classifier_from_model(model, width, START_CLASSES, SIDE)
    return hub.presets.save_classifier(classifier, folder)


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    return _save_preset(str(tmp_path_factory.mktemp("start") / "preset"))


@pytest.fixture(scope="module")
def tuned(images, start, tmp_path_factory):  # noqa: F811
    """A run from the `start` preset (tiny networks, model.keras only), both phases of an
    epoch: (folder, report)."""
    output = tmp_path_factory.mktemp("tuned")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(network, "ShuffleNetV2", tiny_network)
        report = finetune(
            images, output, weights=start, epochs=1, head_epochs=1, export_formats=(), **TINY
        )
    return output, report


def test_the_head_phase_trains_the_head_alone_then_the_whole_net_but_its_statistics(tuned, start):
    """The head phase leaves the pretrained base exactly the preset's; the whole-net phase
    trains the convolutions and leaves BatchNormalization's weights and statistics the
    preset's (frozen: a small folder's batches would overwrite ImageNet's)."""
    output, _ = tuned
    backbone = hub.ShuffleNetBackbone.from_preset(start)
    head = keras.saving.load_model(output / "train_head" / "model.keras", safe_mode=True)
    final = keras.saving.load_model(output / "model.keras", safe_mode=True)
    for layer in (layer for layer in backbone.layers if layer.weights):
        for a, b, c in zip(
            layer.weights,
            head.get_layer(layer.name).weights,
            final.get_layer(layer.name).weights,
            strict=True,
        ):
            np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
            if isinstance(layer, keras.layers.BatchNormalization):
                np.testing.assert_array_equal(a.numpy(), c.numpy(), err_msg=a.path)
    assert not np.array_equal(
        backbone.get_layer("stem_conv").kernel.numpy(), final.get_layer("stem_conv").kernel.numpy()
    ), "the whole-net phase trained the convolutions"


def _raw_validation_images(images):  # noqa: F811
    """The run's validation image files, decoded (RGB, their own sizes)."""
    paths = sorted((images / "val").rglob("*.*"))
    return [np.asarray(Image.open(p).convert("RGB"), "float32") for p in paths]


@pytest.mark.slow  # a short fine-tuning run (tiny networks, one epoch)
def test_a_run_from_a_preset_writes_a_preset_of_the_same_outputs(tuned, images):  # noqa: F811
    output, report = tuned
    assert report["settings"]["base_weights"].startswith("sha256:")
    assert report["preset"] == os.path.join(output, "preset")
    classifier = ShuffleNetImageClassifier.from_preset(str(output / "preset"))
    assert classifier.class_names == list(CLASSES)
    converter = classifier.preprocessor.image_converter
    assert tuple(converter.image_size) == (SIDE, SIDE)
    recorded = json.loads((output / "preprocessing.json").read_text())
    assert converter.resize_size == recorded["resize_size"]
    # The same inputs (the validation images through the preset's preprocessing) give the
    # preset's logits and model.keras's probabilities: softmax of one is the other.
    inputs = np.stack([classifier.preprocessor(image) for image in _raw_validation_images(images)])
    model = keras.saving.load_model(output / "model.keras", safe_mode=True)
    logits = keras.ops.convert_to_numpy(classifier(inputs))
    expected = model.predict(inputs, verbose=0)
    np.testing.assert_allclose(keras.ops.softmax(logits).numpy(), expected, atol=1e-6)
    assert (np.argmax(logits, -1) == np.argmax(expected, -1)).all()
    # keras-hub's own base class loads it too, to the same logits and names (in a fresh
    # process after `import keras_autoshuffle` alone: test_hub.py's round trip).
    generic = keras_hub.models.ImageClassifier.from_preset(str(output / "preset"))
    assert type(generic) is ShuffleNetImageClassifier and generic.class_names == list(CLASSES)
    np.testing.assert_array_equal(
        generic.predict(inputs, verbose=0), classifier.predict(inputs, verbose=0)
    )


@pytest.mark.usefixtures("tiny_networks")
def test_a_preset_folder_gives_the_run_its_backbone_and_a_new_head(start):
    model = network.build_classifier(0.5, len(CLASSES), SIDE, start)
    backbone = hub.ShuffleNetBackbone.from_preset(start)
    for layer in (layer for layer in backbone.layers if layer.weights):
        for mine, theirs in zip(model.get_layer(layer.name).weights, layer.weights, strict=True):
            np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    assert model.output_shape == (None, len(CLASSES))
    # A rerun from another preset is another run (its settings' `base_weights`).
    assert network.weights_source(start) == network.weights_source(start)
    assert network.weights_source(start).startswith("sha256:")


@pytest.mark.slow  # builds the x0.5 preset and ImageNet net from the test checkpoint: 30 s
def test_a_preset_name_gives_the_imagenet_backbone(cache):  # noqa: F811
    # `shufflenet_v2_x0_5_imagenet` (the test checkpoint in its place) is weights="imagenet".
    assert network.weights_source(NAME) == NAME
    from_name = network.build_classifier(0.5, 3, 64, NAME)
    from_imagenet = network.build_classifier(0.5, 3, 64, "imagenet")
    for mine, theirs in zip(from_name.weights[:-2], from_imagenet.weights[:-2], strict=True):
        assert mine.path == theirs.path
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


def _edit(name, change):
    def tamper(folder):
        path = os.path.join(folder, name)
        with open(path) as handle:
            config = json.load(handle)
        change(config)
        with open(path, "w") as handle:
            json.dump(config, handle)

    return tamper


def _other_width_weights(folder):
    other = _save_preset(os.path.join(os.path.dirname(folder), "wide"), width=1.0)
    weights = os.path.join(other, "model.weights.h5")
    shutil.copyfile(weights, os.path.join(folder, "model.weights.h5"))


BAD_PRESETS = {
    "a missing file": (
        lambda folder: os.remove(os.path.join(folder, "model.weights.h5")),
        r"model\.weights\.h5 is missing",
    ),
    "a class not ours": (
        _edit("config.json", lambda c: c.update(registered_name="keras_hub>ResNetBackbone")),
        r"config\.json: `registered_name` .*Received: registered_name='keras_hub>ResNetBackbone'",
    ),
    "weights of another width": (
        _other_width_weights,
        r"model\.weights\.h5 does not fit .*layer 'stage2_unit1_conv1'",
    ),
    "labels of another count": (
        _edit("task.json", lambda c: c["config"]["class_names"].pop()),
        r"task\.json: `class_names` has 3 names but `num_classes` is 4",
    ),
    "a newer version": (
        _edit("config.json", lambda c: c["config"].update(preset_version=NEWER)),
        rf"config\.json: `preset_version` {NEWER} .*Received: preset_version={NEWER}",
    ),
    "another width": (
        _edit("config.json", lambda c: c["config"].update(width=1.0)),
        r"config\.json: the preset is a 1\.0x ShuffleNet v2; .*Received: width=0\.5",
    ),
}


@pytest.mark.usefixtures("tiny_networks")
@pytest.mark.parametrize("case", sorted(BAD_PRESETS))
def test_a_bad_preset_is_one_line_naming_the_file_before_any_work(
    images,  # noqa: F811
    start,
    tmp_path,
    case,
):
    folder = str(tmp_path / "preset")
    shutil.copytree(start, folder)
    tamper, message = BAD_PRESETS[case]
    tamper(folder)
    with pytest.raises(ValueError, match=message) as raised:
        finetune(images, tmp_path / "out", weights=folder, **TINY)
    assert "\n" not in str(raised.value)
    assert not (tmp_path / "out").exists()  # nothing written


@pytest.mark.usefixtures("tiny_networks")
def test_the_command_takes_a_preset_and_refuses_a_bad_one_in_one_line(
    images,  # noqa: F811
    tmp_path,
    capsys,
):
    folder = tmp_path / "preset"
    folder.mkdir()  # an empty folder: not a preset
    argv = [str(images), "--output", str(tmp_path / "out"), "--weights", str(folder)]
    assert finetune_command.main(argv + ["--width", "0.5", "--image-size", str(SIDE)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "config.json is missing" in error, error
    assert not (tmp_path / "out").exists()


@pytest.mark.usefixtures("tiny_networks")
@pytest.mark.parametrize("name", ["preset", "model.keras"])
def test_weights_among_the_runs_own_files_are_refused_before_any_work(
    images,  # noqa: F811
    start,
    tmp_path,
    name,
):
    # Before: `--weights runs/x/preset --output runs/x --overwrite` removed the finished run
    # (its preset too) and then failed reading the weights it had removed.
    output = tmp_path / "run"
    output.mkdir()
    weights = output / name
    if name == "preset":
        shutil.copytree(start, weights)
    else:
        keras.saving.save_model(tiny_network(0.5, input_shape=(SIDE, SIDE, 3)), weights)
    (output / "report.json").write_text("{}")  # a finished run, to be replaced
    with pytest.raises(ValueError, match=rf"`weights` is one of the files .*\({name}\)"):
        finetune(images, output, weights=weights, overwrite=True, epochs=1, **TINY)
    assert sorted(os.listdir(output)) == sorted([name, "report.json"])  # nothing removed


def test_the_preset_is_a_file_of_the_run(tmp_path):
    # Removed with the run's other files (overwrite; a failed run without a finished epoch).
    (tmp_path / "preset").mkdir()
    (tmp_path / "preset" / "config.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("mine")
    run_folder.remove_failed_run(str(tmp_path))
    assert os.listdir(tmp_path) == ["notes.txt"]
    assert run_folder.PRESET_DIR in run_folder.RUN_FILES


@pytest.mark.parametrize("padding", ["torch", "same"])
def test_a_classifier_from_a_model_keeps_its_padding_and_outputs(padding):
    keras.utils.set_random_seed(1)
    model = tiny_network(0.5, input_shape=(SIDE, SIDE, 3), classes=3, padding=padding)
    classifier = hub.presets.classifier_from_model(model, 0.5, ["x", "y", "z"], SIDE)
    assert classifier.backbone.padding == padding
    inputs = np.random.default_rng(0).normal(size=(2, SIDE, SIDE, 3)).astype("float32")
    logits = keras.ops.softmax(classifier(inputs)).numpy()
    np.testing.assert_allclose(logits, model.predict(inputs, verbose=0), atol=1e-6)


def test_a_model_with_learned_shuffles_is_refused_as_a_classifier():
    model = tiny_network(0.5, input_shape=(SIDE, SIDE, 3), classes=3, shuffle="auto")
    with pytest.raises(ValueError, match=r"learned shuffles\?\)\. Received: layers \['stage"):
        hub.presets.classifier_from_model(model, 0.5, ["x", "y", "z"], SIDE)


@pytest.mark.slow  # uses the run of `tuned`
def test_predict_gives_the_runs_preset_the_top1_of_its_model_keras(tuned, images):  # noqa: F811
    output, _ = tuned
    pixels = [image.astype("uint8") for image in _raw_validation_images(images)]
    from_preset = prediction.Classifier.from_file(output / "preset").predict(pixels)
    from_keras = prediction.Classifier.from_file(output / "model.keras").predict(pixels)
    np.testing.assert_array_equal(from_preset.argmax(-1), from_keras.argmax(-1))
    np.testing.assert_allclose(from_preset, from_keras, atol=1e-5)
