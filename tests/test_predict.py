"""`prediction` and `autoshuffle-predict`: a tiny exported classifier in every format gives
the probabilities its Keras model computes on the preprocessed images; each refused input
is named.

The tiny net (3 classes) has unknown input sides, so one export serves both ways of
reading the files: normalised 16 x 16 inputs (`exports_include_preprocessing: false`) and,
in a copy of the folder saying `true`, raw pixels of any size (the files then stand for
exports holding their own preprocessing).
"""

import contextlib
import dataclasses
import io
import json
import os
import shutil
import sys
import zipfile

import keras
import numpy as np
import pytest
from helpers import _randomize_batch_norm, edit_keras_file, needs_extra, tiny_v2
from PIL import Image

from keras_autoshuffle import applications, prediction
from keras_autoshuffle.applications.weights import registry
from keras_autoshuffle.applications.weights.pretrained import mark_padding
from keras_autoshuffle.commands import predict as command
from keras_autoshuffle.data.images import ImageFileError
from keras_autoshuffle.export import FILENAMES, export_litert, export_model, unsupported_formats

LABELS = ("cat", "dog", "bird")
# A file's probabilities against Keras's: the bound every exported file is checked to
# (`export_model`'s default atol; probabilities are at most 1, so its rtol adds 1e-4 more).
# Tighter bounds depend on the CPU's kernels: LiteRT differed by 1.02e-5 on an AMD EPYC
# without AVX-512 where 1e-5 had held elsewhere.
FILE_ATOL = 1e-4
SETTINGS = {
    "image_size": 16,
    "resize_size": 20,  # not the default (18): the file's value is the one used
    "mean": [0.485, 0.456, 0.406],
    "std": [0.229, 0.224, 0.225],
    "exports_include_preprocessing": False,
}
FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
# Each format as `Classifier.from_file` is pointed at it.
MODELS = [
    "model.keras",
    "model.tflite",
    pytest.param("model.onnx", marks=needs_extra("onnx")),
    pytest.param("openvino", marks=needs_extra("openvino")),
    pytest.param("openvino/model.xml", marks=needs_extra("openvino")),
]


def write_side_files(folder, labels=LABELS, **settings):
    (folder / "labels.txt").write_text("".join(f"{label}\n" for label in labels), "utf-8")
    (folder / "preprocessing.json").write_text(json.dumps({**SETTINGS, **settings}))


def random_classifier(input_shape, activation="softmax", images=()):
    """The tiny net, 3 classes, random weights; with `images`, a head that gives each of
    them (preprocessed as the side files say) a class of its own."""
    keras.utils.set_random_seed(0)
    model = tiny_v2(
        classes=3,
        repeats=(1, 1, 1),
        stem="cifar",
        input_shape=input_shape,
        classifier_activation=activation,
    )
    rng = np.random.default_rng(0)
    _randomize_batch_norm(model, rng)
    head = model.layers[-1]
    kernel, bias = rng.normal(0, 1, head.kernel.shape), np.full(3, -5.0)
    if images:  # logits 0.5 apart or more: every format must rank the classes alike
        features = keras.Model(model.inputs, model.layers[-2].output)
        pooled = outputs(features, images, applications.evaluation_preprocessing(16, 20))
        logits = 4 * np.eye(3)[: len(images)] + [0.0, 0.5, 1.0]
        kernel = np.linalg.lstsq(pooled, logits, rcond=None)[0]
        bias = np.zeros(3)
    head.set_weights([kernel, bias])
    return model


def _formats():
    """The formats the export can write here (ONNX and OpenVINO need their extras)."""
    candidates = ("keras", "litert", "onnx", "openvino")
    return tuple(name for name in candidates if not unsupported_formats((name,)))


@pytest.fixture(scope="module")
def exported(tmp_path_factory, photos):
    """`(folder, raw folder, model)`: the export with side files, and a copy whose
    preprocessing.json says the exports take raw pixels."""
    model = random_classifier((None, None, 3), images=list(photos[1].values()))
    folder = tmp_path_factory.mktemp("export")
    sample = np.random.default_rng(1).normal(size=(2, 16, 16, 3)).astype("float32")
    export_model(model, str(folder), sample, formats=_formats())
    write_side_files(folder)
    raw = tmp_path_factory.mktemp("raw_export")
    shutil.copytree(folder, raw, dirs_exist_ok=True)
    write_side_files(raw, exports_include_preprocessing=True)
    return folder, raw, model


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """A folder of images of several sizes and formats written with Pillow (plus a text
    file and a subfolder the folder's listing skips); `(folder, {name: pixels})`."""
    folder = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(2)
    pixels = {}
    # Mostly one colour each, so that the random net tells them apart.
    for name, (height, width), colour in (
        ("b.png", (23, 31), (230, 20, 20)),
        ("a.PNG", (40, 17), (20, 230, 20)),
        ("c.bmp", (16, 16), (20, 20, 230)),
    ):
        noise = rng.integers(-20, 20, (height, width, 3))
        image = np.clip(np.add(colour, noise), 0, 255).astype(np.uint8)
        Image.fromarray(image).save(folder / name)
        pixels[name] = image
    (folder / "notes.txt").write_text("not an image")
    (folder / "inner").mkdir()
    Image.fromarray(pixels["c.bmp"]).save(folder / "inner" / "d.png")
    return folder, pixels


def outputs(model, images, preprocess=None):
    """The independent computation: each image through `preprocess` (torchvision's
    evaluation transform as Keras layers) if given, then the Keras model."""
    batches = [image[None] if preprocess is None else preprocess(image[None]) for image in images]
    return np.concatenate([keras.ops.convert_to_numpy(model(b, training=False)) for b in batches])


@pytest.mark.parametrize("name", ["model.keras", "model.tflite"])
def test_the_runner_feeds_a_large_batch_in_chunks(exported, monkeypatch, name):
    """A batch of more than `runner.CHUNK` inputs reaches the runtime CHUNK at a time
    (bounded memory: the int8 check runs a whole test set), with the whole's outputs."""
    from keras_autoshuffle.export import runner as runner_module

    folder, _, model = exported
    monkeypatch.setattr(runner_module, "CHUNK", 2)
    runner = runner_module.open_runner(folder / name)
    seen = []

    def spy(batch):
        seen.append(len(batch))
        return runner._run(batch)

    batch = np.random.default_rng(0).normal(size=(5, 16, 16, 3)).astype("float32")
    result = dataclasses.replace(runner, _run=spy).run(batch)
    np.testing.assert_allclose(result, outputs(model, batch), atol=FILE_ATOL, rtol=0)
    assert seen == [2, 2, 1]


def keras_probabilities(model, images):
    """The probabilities for the side files' settings (16 x 16, resized to 20 first)."""
    return outputs(model, images, applications.evaluation_preprocessing(16, 20))


@pytest.mark.parametrize("name", MODELS)
def test_every_format_gives_the_keras_models_probabilities(exported, photos, name):
    folder, _, model = exported
    images = list(photos[1].values())
    classifier = prediction.Classifier.from_file(folder / name)
    assert classifier.labels == LABELS
    expected = keras_probabilities(model, images)
    assert sorted(expected.argmax(axis=1)) == [0, 1, 2]  # the images are told apart
    np.testing.assert_allclose(classifier.predict(images), expected, atol=FILE_ATOL, rtol=0)
    top = classifier.top_k(images, k=2)
    for row, probabilities in zip(top, expected, strict=True):
        best = np.argsort(-probabilities)[:2]
        assert [label for label, _ in row] == [LABELS[i] for i in best]
        np.testing.assert_allclose([p for _, p in row], probabilities[best], atol=FILE_ATOL)
    assert len(classifier.top_k(images[:1], k=10)[0]) == 3  # every class, no more


@pytest.mark.parametrize("name", MODELS)
def test_exports_holding_their_preprocessing_take_raw_pixels(exported, photos, name):
    _, raw, model = exported
    images = list(photos[1].values())
    classifier = prediction.Classifier.from_file(raw / name)
    if name == "model.keras":  # the .keras file always takes the normalised images
        expected = keras_probabilities(model, images)
    else:
        expected = outputs(model, [image.astype("float32") for image in images])
    np.testing.assert_allclose(classifier.predict(images), expected, atol=FILE_ATOL, rtol=0)


def test_files_and_folders(exported, photos):
    folder, _, model = exported
    photo_folder, pixels = photos
    classifier = prediction.Classifier.from_file(folder / "model.keras")
    single = photo_folder / "inner" / "d.png"
    results = prediction.predict_files(classifier, [photo_folder, single], k=2)
    # The folder's images sorted by name, any case of suffix; no text file, no subfolder.
    names = ["a.PNG", "b.png", "c.bmp"]
    assert [r["path"] for r in results] == [str(photo_folder / n) for n in names] + [str(single)]
    expected = keras_probabilities(model, [pixels[n] for n in names] + [pixels["c.bmp"]])
    for result, probabilities in zip(results, expected, strict=True):
        best = np.argsort(-probabilities)[:2]
        assert [t["label"] for t in result["top"]] == [LABELS[i] for i in best]
        got = [t["probability"] for t in result["top"]]
        np.testing.assert_allclose(got, probabilities[best], atol=FILE_ATOL)


def run_command(*argv):
    """`autoshuffle-predict argv` in this process: (exit status, stdout)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = command.main([str(a) for a in argv])
    return status, printed.getvalue()


def test_the_command_prints_json_and_text(exported, photos):
    folder, _, _ = exported
    photo_folder, _ = photos
    model = folder / "model.tflite"
    classifier = prediction.Classifier.from_file(model)
    expected = prediction.predict_files(classifier, [photo_folder], k=2)
    status, printed = run_command(model, photo_folder, "--json", "--top", "2")
    assert status == 0
    results = json.loads(printed)
    assert [r["path"] for r in results] == [r["path"] for r in expected]
    for got, want in zip(results, expected, strict=True):
        assert [t["label"] for t in got["top"]] == [t["label"] for t in want["top"]]
        assert [t["probability"] for t in got["top"]] == pytest.approx(
            [t["probability"] for t in want["top"]], abs=1e-6
        )
    status, printed = run_command(model, photo_folder / "b.png")
    lines = printed.splitlines()
    best = expected[1]["top"][0]  # b.png
    assert status == 0 and lines[0] == str(photo_folder / "b.png") and len(lines) == 4
    assert lines[1] == f"  {best['probability']:.2f}  {best['label']}"


def refused(*argv):
    """The message `autoshuffle-predict argv` ends with: one line, exit status 1
    (SystemExit with a message)."""
    with pytest.raises(SystemExit) as exit:
        run_command(*argv)
    message = exit.value.code
    assert isinstance(message, str) and "\n" not in message, message
    return message


def test_the_command_refuses_bad_input_in_one_line(exported, photos, tmp_path):
    folder, _, _ = exported
    model, photo_folder = folder / "model.keras", photos[0]
    missing = tmp_path / "missing.png"
    assert str(missing) in refused(model, missing)
    assert str(photo_folder / "notes.txt") in refused(model, photo_folder / "notes.txt")
    assert str(tmp_path / "model.keras") in refused(tmp_path / "model.keras", photo_folder)
    (tmp_path / "empty").mkdir()
    assert "holds no images" in refused(model, tmp_path / "empty")
    # Command-line errors: argparse's usage message, exit status 2.
    for argv in ((model,), (model, photo_folder, "--top", "0")):
        with pytest.raises(SystemExit) as exit, contextlib.redirect_stderr(io.StringIO()):
            run_command(*argv)
        assert exit.value.code == 2


def test_a_damaged_image_is_named_or_skipped(exported, photos, tmp_path):
    folder, _, _ = exported
    classifier = prediction.Classifier.from_file(folder / "model.keras")
    images = tmp_path / "images"
    shutil.copytree(photos[0], images)
    damaged = images / "broken.jpg"
    damaged.write_bytes(b"\xff\xd8 not a JPEG")
    long = images / "long.png"  # a readable image too long for the resize
    Image.fromarray(np.zeros((2, 300, 3), np.uint8)).save(long)
    with pytest.raises(ImageFileError, match=f"Received: path={str(damaged)!r}"):
        prediction.predict_files(classifier, [images])
    with pytest.raises(ImageFileError, match=f"300 x 2 pixels.*Received: path={str(long)!r}"):
        prediction.predict_files(classifier, [long])
    results = prediction.predict_files(classifier, [images], k=1, skip_damaged=True)
    names = ["a.PNG", "b.png", "broken.jpg", "c.bmp", "long.png"]
    assert [os.path.basename(r["path"]) for r in results] == names
    for result in results:
        if result["path"] in (str(damaged), str(long)):
            assert result["path"] in result["error"] and "top" not in result
        else:
            assert len(result["top"]) == 1 and "error" not in result
    status, printed = run_command(folder / "model.keras", images, "--skip-damaged")
    assert status == 1 and printed.count("  error: ") == 2 and printed.count("\n  0.") >= 9


def copy_export(folder, target, names=("model.keras",)):
    target.mkdir()
    for name in (*names, "labels.txt", "preprocessing.json"):
        shutil.copy(folder / name, target / name)
    return target


def test_side_files_that_do_not_fit_are_named(exported, tmp_path):
    folder, _, _ = exported
    copy = copy_export(folder, tmp_path / "copy")
    model = copy / "model.keras"
    labels, settings = copy / "labels.txt", copy / "preprocessing.json"
    labels.unlink()
    with pytest.raises(FileNotFoundError, match=f"{labels} is missing.*class names"):
        prediction.Classifier.from_file(model)
    write_side_files(copy, labels=("cat", "dog", "bird", "fish"))
    with pytest.raises(ValueError, match=r"has 3 outputs but .*labels.txt names 4 classes"):
        prediction.Classifier.from_file(model)
    for text, problem in (
        ("cat\n\nbird\n", "class name 2 is blank"),
        ("cat\ndog\ncat\n", "'cat' is on lines 1 and 3"),
        ("", "is empty"),
    ):
        labels.write_text(text)
        with pytest.raises(ValueError, match=problem):
            prediction.Classifier.from_file(model)
    labels.write_bytes(b"cat\ndog\n\xff\n")
    with pytest.raises(ValueError, match="not UTF-8"):
        prediction.Classifier.from_file(model)
    write_side_files(copy)
    assert prediction.read_labels(labels) == list(LABELS)
    for text, problem in (
        ("{", "is not JSON"),
        ("[" * 60_000, "is not JSON"),  # nested past the parser's recursion limit
        ("[16]", "Received: a JSON list"),
        (json.dumps({"image_size": 16}), "missing keys.*'resize_size'"),
        (json.dumps({**SETTINGS, "crop": 1}), r"unknown keys \['crop'\]"),
        (json.dumps({**SETTINGS, "image_size": 16.0}), "Received: image_size=16.0"),
        (json.dumps({**SETTINGS, "image_size": 8}), "preprocessing.json: `image_size`"),
        (json.dumps({**SETTINGS, "std": [1, 1, 1]}), r"Received: std=\[1, 1, 1\]"),
        (json.dumps({**SETTINGS, "exports_include_preprocessing": 1}), "true or false"),
    ):
        settings.write_text(text)
        with pytest.raises(ValueError, match=problem):
            prediction.Classifier.from_file(model)
    settings.unlink()
    settings.mkdir()
    with pytest.raises(ValueError, match="not a regular file"):
        prediction.Classifier.from_file(model)


def test_side_file_numbers_past_int64_are_refused_by_name(tmp_path):
    """A mean past NumPy's int64 (np.isfinite raises TypeError on it) is a named ValueError,
    not a traceback; one past the float range is not a finite number."""
    settings = tmp_path / "preprocessing.json"
    for big in (10**20, 10**400):
        settings.write_text(json.dumps({**SETTINGS, "mean": [big, 0.456, 0.406]}))
        with pytest.raises(ValueError, match=r"mean must be ImageNet's.*Received: mean=\["):
            prediction.read_preprocessing(settings)


def test_model_files_that_do_not_fit_are_named(exported, tmp_path):
    folder, _, _ = exported
    copy = copy_export(folder, tmp_path / "copy")
    for name, problem in (
        ("model.h5", "the suffix must be one of .keras, .tflite, .onnx, .xml"),
        ("model.tflite", "cannot be loaded as a model of format 'litert'"),
        ("model.onnx", "cannot be loaded as a model of format 'onnx'"),
    ):
        (copy / name).write_bytes(b"not a model")
        with pytest.raises(ValueError, match=problem):
            prediction.Classifier.from_file(copy / name)
    with pytest.raises(FileNotFoundError, match="Received: path="):
        prediction.Classifier.from_file(copy / "model.missing.keras")
    with pytest.raises(ValueError, match="a folder without model.xml"):
        prediction.Classifier.from_file(copy)


def test_a_keras_file_that_is_no_zip_archive_is_named(exported, tmp_path):
    # Issue 52: Keras said "File not found" of a file that exists.
    model = copy_export(exported[0], tmp_path / "copy") / "model.keras"
    model.write_bytes(b"not a zip archive")
    with pytest.raises(ValueError, match="not a Keras model file: .* zip archive") as info:
        prediction.Classifier.from_file(model)
    assert str(model) in str(info.value) and "not found" not in str(info.value)


@pytest.mark.parametrize(
    "name, modules, extra",
    [
        ("model.tflite", ("ai_edge_litert", "ai_edge_litert.interpreter"), "litert"),
        pytest.param("model.onnx", ("onnxruntime",), "onnx", marks=needs_extra("onnx")),
        pytest.param("openvino", ("openvino",), "openvino", marks=needs_extra("openvino")),
    ],
)
def test_a_missing_runtime_names_the_extra_that_installs_it(
    exported, monkeypatch, name, modules, extra
):
    # Issue 52: "No module named 'ai_edge_litert'. Export it again." A module set to None in
    # sys.modules fails to import for real (ImportError), as in an install without it.
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ValueError, match="is not installed") as info:
        prediction.Classifier.from_file(exported[0] / name)
    message = str(info.value)
    assert f'pip install "keras-autoshuffle[{extra}]"' in message, message
    assert "Export it again" not in message


def test_a_keras_file_of_an_unknown_class_is_refused_in_a_short_line(exported, tmp_path):
    # The probe of issue 52: Keras's error quoted the whole model config (1,900 characters).
    model = copy_export(exported[0], tmp_path / "copy") / "model.keras"
    with zipfile.ZipFile(model) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    config = json.loads(files["config.json"])
    config["config"]["layers"][-1].update(class_name="Evil", module="evil", registered_name="E")
    with zipfile.ZipFile(model, "w") as archive:
        for name, content in files.items():
            archive.writestr(name, json.dumps(config) if name == "config.json" else content)
    with pytest.raises(ValueError, match="cannot be loaded as a model of format 'keras'") as info:
        prediction.Classifier.from_file(model)
    assert str(model) in str(info.value) and len(str(info.value)) < 600, str(info.value)


@needs_extra("onnx")
def test_onnx_runtimes_warnings_stay_off_the_screen(exported, tmp_path, capfd):
    # The probe of issue 52: an unused initializer (here declaring 10**12 values and holding
    # none) loads, but ONNX Runtime printed a coloured warning about it.
    import onnx

    model = copy_export(exported[0], tmp_path / "copy", names=("model.onnx",)) / "model.onnx"
    proto = onnx.load(model)
    unused = proto.graph.initializer.add()
    unused.name, unused.data_type = "unused", onnx.TensorProto.FLOAT
    unused.dims.extend([10**6, 10**6])
    onnx.save(proto, model)
    capfd.readouterr()
    classifier = prediction.Classifier.from_file(model)
    assert classifier.predict([np.zeros((16, 16, 3), "uint8")]).shape == (1, 3)
    assert "unused" not in capfd.readouterr().err


@needs_extra("onnx")
def test_a_model_that_fails_when_run_is_named_in_one_line(exported, photos, tmp_path):
    # Issue 52: a crafted ONNX file that loads but cannot run (its Gather takes channel 5 of
    # 3) ended autoshuffle-predict in a traceback.
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["image"], ["mean"], axes=[1, 2], keepdims=0),
            helper.make_node("Gather", ["mean", "channels"], ["picked"], axis=1),
            helper.make_node("Softmax", ["picked"], ["probabilities"]),
        ],
        "crafted",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 16, 16, 3])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor("channels", TensorProto.INT64, [3], [0, 1, 5])],
    )
    crafted = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    crafted.ir_version = 8
    model = copy_export(exported[0], tmp_path / "copy", names=()) / "model.onnx"
    onnx.save(crafted, model)
    message = refused(model, photos[0] / "b.png")
    assert message.startswith(f"autoshuffle-predict: error: {model} failed when run by ONNX")
    assert "out of" in message and "bounds" in message, message  # ONNX Runtime's reason


def test_a_model_of_another_size_or_without_softmax_is_refused(exported, photos, tmp_path):
    folder, _, _ = exported
    model = copy_export(folder, tmp_path / "copy") / "model.keras"
    with zipfile.ZipFile(model) as archive:
        layers = json.loads(archive.read("config.json"))["config"]["layers"]
    (name,) = [layer["config"]["name"] for layer in layers if layer["class_name"] == "InputLayer"]
    edit_keras_file(model, name, lambda config: config.update(batch_shape=[None, 16, 16, 3]))
    edit_keras_file(model, "predictions", lambda config: config.update(activation="linear"))
    write_side_files(model.parent, image_size=24, resize_size=24)
    with pytest.raises(ValueError, match=r"takes 16x16 images but .* image_size 24"):
        prediction.Classifier.from_file(model)
    write_side_files(model.parent)
    classifier = prediction.Classifier.from_file(model)
    with pytest.raises(ValueError, match="does not output probabilities"):
        classifier.predict(list(photos[1].values()))


@needs_extra("onnx")
def test_raw_pixel_settings_refuse_a_file_of_fixed_size(exported, tmp_path):
    folder, _, _ = exported
    copy = copy_export(folder, tmp_path / "copy", names=())
    fixed = random_classifier((16, 16, 3))
    export_model(fixed, str(copy), np.zeros((1, 16, 16, 3), "float32"), formats=("onnx",))
    write_side_files(copy, exports_include_preprocessing=True)
    with pytest.raises(ValueError, match=r"take raw pixels of any size .* takes \(16, 16\)"):
        prediction.Classifier.from_file(copy / FILENAMES["onnx"])


def test_arguments_are_checked(exported, photos):
    folder, _, _ = exported
    classifier = prediction.Classifier.from_file(folder / "model.keras")
    image = photos[1]["c.bmp"]
    for images, shown in (
        ([image.astype("float32")], r"shape \(16, 16, 3\), dtype float32"),
        ([image[..., 0]], r"shape \(16, 16\)"),
        ([image[:, :0]], r"shape \(16, 0, 3\)"),
    ):
        with pytest.raises(ValueError, match=rf"images\[0\].*Received: images\[0\] of {shown}"):
            classifier.predict(images)
    with pytest.raises(ValueError, match=r"images\[1\]` must have a longer side at most 100"):
        classifier.predict([image, np.zeros((1, 101, 3), np.uint8)])
    with pytest.raises(ValueError, match="wrap a single image in a list"):
        classifier.predict(image)
    assert classifier.predict([]).shape == (0, 3)
    for k in (0, 1.5, True):
        with pytest.raises(ValueError, match=f"Received: k={k!r}"):
            classifier.top_k([image], k=k)
    with pytest.raises(ValueError, match="Received: paths="):
        prediction.predict_files(classifier, str(photos[0]))
    with pytest.raises(ValueError, match="Received: paths=\\[\\]"):
        prediction.predict_files(classifier, [])
    with pytest.raises(ValueError, match="must be a path, a str or os.PathLike. Received: path=3"):
        prediction.predict_files(classifier, [3])
    with pytest.raises(ValueError, match="Received: path=b'model.keras'"):
        prediction.Classifier.from_file(b"model.keras")


def test_the_pretrained_imagenet_classifier(tmp_path, monkeypatch, photos):
    # The converted weights and the class index where the cache keeps them: no download
    # (there is no network here). Random weights stand for torchvision's.
    home = tmp_path / "keras_home"
    monkeypatch.setenv("KERAS_HOME", str(home))
    cache = home / "models"
    cache.mkdir(parents=True)
    index = os.path.join(FIXTURES, registry.CLASS_INDEX_FILE)
    shutil.copy(index, cache)
    keras.utils.set_random_seed(0)
    net = applications.ShuffleNetV2(0.5, stem="imagenet", input_shape=(224, 224, 3))
    head = net.layers[-1]
    head.set_weights([np.random.default_rng(0).normal(0, 0.2, head.kernel.shape), head.bias])
    weights = str(cache / f"{applications.CHECKPOINTS[0.5].stem}.weights.h5")
    net.save_weights(weights)
    mark_padding(weights, "torch")
    paths = [photos[0] / "b.png", photos[0] / "a.PNG"]
    status, printed = run_command("--imagenet", "0.5", "--json", "--top", "3", *paths)
    preprocess = applications.imagenet_preprocessing(0.5)
    expected = outputs(net, [photos[1][path.name] for path in paths], preprocess)
    with open(index) as handle:
        names = {int(i): name for i, (_, name) in json.load(handle).items()}
    for result, probabilities in zip(json.loads(printed), expected, strict=True):
        best = np.argsort(-probabilities)[:3]
        assert [t["label"] for t in result["top"]] == [names[i] for i in best]
        got = [t["probability"] for t in result["top"]]
        np.testing.assert_allclose(got, probabilities[best], atol=1e-6, rtol=0)
    assert status == 0
    assert "Received: width=0.75" in refused("--imagenet", "0.75", paths[0])


# --- files that describe themselves, old run folders, preset folders ---------------------


@pytest.mark.parametrize(
    "name", ["model.keras", "model.tflite", pytest.param("model.onnx", marks=needs_extra("onnx"))]
)
def test_an_old_run_folder_still_predicts(name):
    # Files without metadata beside labels.txt and preprocessing.json, written at 43628d2
    # (tests/fixtures/old_run/make_old_run.py), with the probabilities that code gave.
    folder = os.path.join(FIXTURES, "old_run")
    with open(os.path.join(folder, "expected.json")) as handle:
        expected = json.load(handle)[name]
    classifier = prediction.Classifier.from_file(os.path.join(folder, name))
    assert classifier.labels == LABELS
    results = prediction.predict_files(classifier, [os.path.join(folder, "images")], k=3)
    got = [
        [dict((t["label"], t["probability"]) for t in r["top"])[n] for n in LABELS] for r in results
    ]
    np.testing.assert_allclose(got, expected, atol=FILE_ATOL, rtol=0)


def small_classifier():
    """A conv net of 16 x 16 images, 3 classes (LiteRT converts it in a second, the tiny
    ShuffleNet in ten): its outputs differ with the normalisation of its inputs."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(8, 3, strides=2, activation="relu")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(3, activation="softmax", kernel_initializer="he_normal")(x)
    return keras.Model(inputs, outputs)


@pytest.fixture(scope="module")
def described(tmp_path_factory):
    """`(root, model)`: `model`'s `.tflite` files with LiteRT metadata and no side files:
    `imagenet/` takes the normalised image (described with ImageNet's per-channel pixel
    mean and std, today's files), `mediapipe/` RGB in [0, 1] with the normalisation inside
    (described mean 0, std 255, as MediaPipe Model Maker's files)."""
    from keras_autoshuffle.export import metadata

    model = small_classifier()
    root = tmp_path_factory.mktemp("described")
    for name, net, mean, std in (
        ("imagenet", model, metadata.IMAGENET_PIXEL_MEAN, metadata.IMAGENET_PIXEL_STD),
        ("mediapipe", metadata.with_input_normalization(model), (0.0,), (255.0,)),
    ):
        (root / name).mkdir()
        path = export_litert(net, str(root / name / "model.tflite"))
        metadata.describe_litert(path, LABELS, mean, std)
    return root, model


@pytest.mark.parametrize("kind", ["imagenet", "mediapipe"])
def test_a_described_file_needs_no_side_file(described, photos, kind):
    from keras_autoshuffle.export.runner import open_runner

    root, model = described
    runner = open_runner(root / kind / "model.tflite")
    assert runner.labels == LABELS and runner.input.shape == (16, 16, 3)
    pixels = np.array([[[0.0, 127.5, 255.0]]])
    if kind == "mediapipe":  # the runner feeds pixel / 255
        assert runner.input.mean == (0.0,) and runner.input.std == (255.0,)
        np.testing.assert_allclose(runner.input.normalize(pixels), pixels / 255)
    else:  # the normalised image
        np.testing.assert_allclose(
            runner.input.normalize(pixels)[0, 0],
            ([0, 0.5, 1] - np.array(applications.IMAGENET_MEAN)) / applications.IMAGENET_STD,
            rtol=1e-6,
        )
    classifier = prediction.Classifier.from_file(root / kind / "model.tflite")
    assert classifier.labels == LABELS
    images = list(photos[1].values())
    # The image size from the file's input (16), torchvision's resize for it (18).
    expected = outputs(model, images, applications.evaluation_preprocessing(16))
    np.testing.assert_allclose(classifier.predict(images), expected, atol=FILE_ATOL, rtol=0)


@pytest.mark.parametrize("kind", ["imagenet", "mediapipe"])
def test_the_finetune_evaluation_feeds_each_file_its_normalisation(described, photos, kind):
    # `measure_files` has the validation pipeline's ImageNet-normalised images: a file with
    # the normalisation inside (mean 0, std 255) takes them back as pixel / 255.
    from keras_autoshuffle.export.runner import open_runner
    from keras_autoshuffle.finetuning.evaluation import _file_inputs

    root, model = described
    preprocess = applications.evaluation_preprocessing(16)
    normalised = np.concatenate([preprocess(image[None]) for image in photos[1].values()])
    runner = open_runner(root / kind / "model.tflite")
    expected = keras.ops.convert_to_numpy(model(normalised))
    np.testing.assert_allclose(
        runner.run(_file_inputs(runner, normalised)), expected, atol=FILE_ATOL
    )


def test_metadata_without_the_mediapipe_extra_names_it(described, exported, monkeypatch):
    # A described .tflite cannot be read right without the reader of its metadata; a file
    # without metadata still runs (LiteRT alone).
    for module in [m for m in sys.modules if m.split(".")[0] == "mediapipe"] + ["mediapipe"]:
        monkeypatch.setitem(sys.modules, module, None)  # as in an install without it
    with pytest.raises(ValueError, match=r'pip install "keras-autoshuffle\[mediapipe\]"'):
        prediction.Classifier.from_file(described[0] / "mediapipe" / "model.tflite")
    assert prediction.Classifier.from_file(exported[0] / "model.tflite").labels == LABELS


def test_side_files_that_disagree_with_the_metadata_are_named(described, tmp_path):
    model = tmp_path / "model.tflite"
    shutil.copy(described[0] / "mediapipe" / "model.tflite", model)
    write_side_files(tmp_path, labels=("cat", "dog", "fish"))
    with pytest.raises(ValueError, match=r"field `labels` .* class 2.*'fish' and 'bird'"):
        prediction.Classifier.from_file(model)
    write_side_files(tmp_path, labels=("cat", "dog", "bird", "fish"))
    with pytest.raises(ValueError, match=r"labels.txt names 4 classes but the metadata field"):
        prediction.Classifier.from_file(model)
    (tmp_path / "labels.txt").unlink()
    (tmp_path / "preprocessing.json").unlink()
    assert prediction.Classifier.from_file(model).labels == LABELS


@needs_extra("onnx")
def test_metadata_naming_another_class_count_is_refused(exported, tmp_path):
    import onnx

    model = copy_export(exported[0], tmp_path / "copy", names=("model.onnx",)) / "model.onnx"
    proto = onnx.load(model)
    props = {"labels": '["cat", "dog"]', "image_mean": "[0.0]", "image_std": "[255.0]"}
    onnx.helper.set_model_props(proto, props)
    onnx.save(proto, model)
    with pytest.raises(ValueError, match="field `labels` names 2 classes but the file has 3"):
        prediction.Classifier.from_file(model)


NAMES = json.dumps(list(LABELS))


@needs_extra("onnx")
@pytest.mark.parametrize(
    "props, field",
    [
        ({"labels": '"abc"', "image_mean": "[0.0]", "image_std": "[255.0]"}, "`labels`"),
        # One rule for class names: an escape sequence (it would clear the terminal).
        (
            {"labels": '["cat", "dog\\u001b[2J", "bird"]', "image_mean": "[0]", "image_std": "[1]"},
            r"`labels`.*control character",
        ),
        ({"labels": NAMES, "image_mean": "[0.0]", "image_std": "[0.0]"}, "std"),
        (
            {"labels": NAMES, "image_mean": "[0, 1]", "image_std": "[1, 1]"},
            "std",
        ),
        ({"labels": NAMES, "image_mean": '"ab"', "image_std": "[1]"}, "std"),
    ],
)
def test_tampered_metadata_values_are_refused_by_field(exported, tmp_path, props, field):
    # Before: labels "abc" named the classes 'a', 'b', 'c'; std 0 gave NaN ("does not output
    # probabilities"); two means a NumPy broadcast error naming no file.
    import onnx

    model = copy_export(exported[0], tmp_path / "copy", names=("model.onnx",)) / "model.onnx"
    (model.parent / "labels.txt").unlink()  # the file's metadata alone names the classes
    proto = onnx.load(model)
    onnx.helper.set_model_props(proto, props)
    onnx.save(proto, model)
    with pytest.raises(ValueError, match=rf"model\.onnx: its metadata's field.*{field}"):
        prediction.Classifier.from_file(model)


def test_a_label_file_in_metadata_is_read_up_to_a_bound(described, tmp_path):
    # A deflated label file of 16 MiB+ in a few kB: refused, not decompressed whole.
    from keras_autoshuffle.export import metadata

    data = (described[0] / "mediapipe" / "model.tflite").read_bytes()
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as labels:
        names = "cat\ndog\nbird\n" + "x" * metadata.MAX_LABEL_FILE_BYTES
        labels.writestr(metadata.LABEL_FILE, names)
    model = tmp_path / "model.tflite"
    model.write_bytes(data[: data.rfind(b"PK\x03\x04")] + archive.getvalue())
    with pytest.raises(ValueError, match=r"model\.tflite .*label file is larger than"):
        prediction.Classifier.from_file(model)


@needs_extra("openvino")
def test_an_openvino_folder_with_other_entries_predicts(exported, tmp_path):
    # Before: the runner summed the sizes of the IR folder's entries, so a dangling link
    # (or an unreadable file) beside model.xml failed prediction with a bare FileNotFoundError.
    from keras_autoshuffle.export.runner import open_runner

    copy = tmp_path / "openvino"
    shutil.copytree(exported[0] / "openvino", copy)
    (copy / "notes").symlink_to(tmp_path / "missing")
    runner = open_runner(copy)
    xml, weights = copy / "model.xml", copy / "model.bin"
    assert runner.size_bytes == xml.stat().st_size + weights.stat().st_size


@pytest.fixture(scope="module")
def hub_preset(tmp_path_factory):
    """`(folder, model)`: a keras-hub preset of a 0.5x classifier of 32 x 32 images."""
    from keras_autoshuffle import hub

    keras.utils.set_random_seed(0)
    backbone = hub.ShuffleNetBackbone(width=0.5, image_shape=(32, 32, 3))
    preprocessor = hub.ShuffleNetImageClassifierPreprocessor(hub.ShuffleNetImageConverter((32, 32)))
    model = hub.ShuffleNetImageClassifier(
        backbone, 3, preprocessor=preprocessor, class_names=list(LABELS)
    )
    folder = tmp_path_factory.mktemp("hub") / "preset"
    model.save_to_preset(str(folder))
    return folder, model


@pytest.mark.slow  # 15 s: building and loading a 0.5x backbone
def test_a_keras_hub_preset_folder(photos, hub_preset):
    folder, model = hub_preset
    classifier = prediction.Classifier.from_file(folder)
    assert classifier.labels == LABELS
    images = list(photos[1].values())
    # keras-hub's own path: its preprocessor, then the classifier's logits.
    logits = np.concatenate([model(model.preprocessor(image[None])) for image in images])
    expected = keras.ops.convert_to_numpy(keras.ops.softmax(logits))
    np.testing.assert_allclose(classifier.predict(images), expected, atol=FILE_ATOL, rtol=0)


@pytest.mark.slow  # 15 s: building a 0.5x backbone (shared with the test above)
def test_a_tampered_preset_folder_is_refused_by_name(hub_preset, tmp_path):
    # keras-hub's own loader would read a newer layout, or a config of any size, as it is.
    from keras_autoshuffle.hub import presets

    newer = tmp_path / "newer"
    shutil.copytree(hub_preset[0], newer)
    config = json.loads((newer / "config.json").read_text())
    config["config"]["preset_version"] = presets.PRESET_VERSION + 1
    (newer / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config\.json: `preset_version` .*newer version"):
        prediction.Classifier.from_file(newer)
    huge = tmp_path / "huge"
    shutil.copytree(hub_preset[0], huge)
    text = (huge / "task.json").read_text()
    (huge / "task.json").write_text(text + " " * presets.MAX_CONFIG_BYTES)
    with pytest.raises(ValueError, match=r"task\.json is not a keras-hub preset config .*larger"):
        prediction.Classifier.from_file(huge)


def test_a_backbone_preset_is_named_as_one_in_one_line(photos, tmp_path):
    # A backbone's save_to_preset writes these three files and no task.json; the refusal
    # reads only that layout, before anything is loaded.
    folder = tmp_path / "backbone"
    folder.mkdir()
    config = {"class_name": "ShuffleNetBackbone", "config": {"width": 0.5}}
    config["registered_name"] = "keras_autoshuffle>ShuffleNetBackbone"
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "metadata.json").write_text(json.dumps({"tasks": ["ImageClassifier"]}))
    (folder / "model.weights.h5").write_bytes(b"")
    message = refused(folder, photos[0])
    assert f"{folder} is a backbone preset" in message and "no classifier" in message
    with pytest.raises(ValueError, match="is a backbone preset .* no classifier"):
        prediction.Classifier.from_file(folder)
