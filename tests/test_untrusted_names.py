"""Names from users' files (issue 52): class folder names that break `labels.txt` or a
terminal are refused when the folder is scanned; what the commands print to a terminal is
escaped (`keras_autoshuffle_cli._terminal.printable`); `None` for an image folder or
predict's input is named.

The folders hold a few tiny PNGs written with Pillow; the classifier is a two-layer Keras
model saved as `autoshuffle-finetune` saves one, with its side files.
"""

import contextlib
import io
import json
import os
import unicodedata

import keras
import numpy as np
import pytest
from PIL import Image

from keras_autoshuffle import data, prediction
from keras_autoshuffle.commands import convert_weights, finetune, predict, train
from keras_autoshuffle_cli._terminal import printable

ESC_NAME = "a\x1b[2Jb"  # ESC [2J clears the screen
# Every character `str.splitlines` splits on: each would split a line of labels.txt.
LINE_BREAKS = [c for c in map(chr, range(0x3000)) if len(f"a{c}b".splitlines()) == 2]


def _class_folders(root, names, images=2):
    for seed, name in enumerate(names):
        (root / name).mkdir(parents=True)
        for i in range(images):
            pixels = np.random.default_rng(seed * 10 + i).integers(0, 256, (5, 6, 3), np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def test_line_breaks_are_every_character_splitlines_splits_on():
    assert "".join(LINE_BREAKS) == "\n\v\f\r\x1c\x1d\x1e\x85\u2028\u2029"


@pytest.mark.parametrize(
    "name, problem",
    [(f"a{c}b", "holds a line break") for c in LINE_BREAKS]
    + [
        (ESC_NAME, "holds a control character"),
        ("a\x7fb", "holds a control character"),
        ("a\x9bb", "holds a control character"),  # C1: a one-byte CSI
        ("abc\u202egpj.png", "text-direction control"),  # shows as "abcgnp.jpg"
        ("\ufeffa", "byte-order mark"),  # read_labels drops one at the file's start
        (" ", "is blank"),
        ("\u3000", "is blank"),
    ],
)
def test_a_class_name_that_breaks_labels_or_the_terminal_is_refused(tmp_path, name, problem):
    root = _class_folders(tmp_path / "images", [name, "dog"])
    with pytest.raises(data.ImageFolderError, match=problem) as caught:
        data.scan_image_folder(root)
    message = str(caught.value)
    assert message.endswith(f"Received: path={str(root / name)!r}")  # the folder, escaped
    assert message.isprintable(), message


def test_a_tampered_record_with_such_a_name_is_refused(tmp_path):
    root = _class_folders(tmp_path / "images", ["a", "b"])
    record = data.scan_image_folder(root).to_json()
    record["class_names"] = ["a", "b\nc"]
    with pytest.raises(data.ImageFolderError, match="`class_names`"):
        data.ImageFolderSplit.from_json(record, root)


def test_names_that_differ_only_in_unicode_form_are_refused(tmp_path):
    composed, decomposed = "caf\u00e9", "cafe\u0301"  # both print as "café"
    assert unicodedata.normalize("NFC", decomposed) == composed
    root = _class_folders(tmp_path / "images", [composed, decomposed])
    if len(os.listdir(root)) != 2:
        pytest.skip("this file system normalises names")
    with pytest.raises(data.ImageFolderError, match="differ only in Unicode form") as caught:
        data.scan_image_folder(root)
    assert "'caf\\xe9'" in str(caught.value) and "'cafe\\u0301'" in str(caught.value)
    # Normalisation and case together (CAFÉ decomposed, café composed) are one name too.
    (root / decomposed).rename(root / "CAFE\u0301")
    with pytest.raises(data.ImageFolderError, match="differ only"):
        data.scan_image_folder(root)


def test_names_of_any_script_and_emoji_are_kept(tmp_path):
    # Joiners stay: emoji sequences and scripts such as Persian need them.
    names = ["ca\u0301fe\u0301", "گربه\u200cها", "👨\u200d👩\u200d👧", "🐱 cat", "日本"]
    root = _class_folders(tmp_path / "images", names)
    assert data.scan_image_folder(root).class_names == tuple(sorted(names))


@pytest.mark.parametrize(
    "call",
    [
        lambda: data.scan_image_folder(None),
        lambda: data.image_folder(None),
        lambda: data.image_folder(None, record="split.json"),
        lambda: data.scan_image_folder(b"images"),
    ],
)
def test_an_image_folder_that_is_not_a_path_is_named(call):
    with pytest.raises(ValueError, match=r"`root` \(the image folder\) must be a path.*root="):
        call()


def test_finetune_names_its_images_argument(tmp_path):
    from keras_autoshuffle.finetuning import finetune

    with pytest.raises(ValueError, match=r"`images` must be .* Received: images=None"):
        finetune(None, tmp_path / "out", weights=None)
    assert not (tmp_path / "out").exists()


def test_predict_input_that_is_not_a_path_is_named(tmp_path):
    with pytest.raises(ValueError, match="Received: paths=None"):
        prediction.image_paths(None)
    with pytest.raises(ValueError, match="Received: path=None"):
        prediction.image_paths([None])
    with pytest.raises(ValueError, match="Received: path=None"):
        prediction.Classifier.from_file(None)
    classifier = prediction.Classifier(lambda batch: np.full((len(batch), 2), 0.5), ["a", "b"])
    with pytest.raises(ValueError, match="Received: paths=None"):
        prediction.predict_files(classifier, None)


# -- what the commands print ------------------------------------------------------------


def test_printable_escapes_what_repr_escapes_and_keeps_the_rest():
    assert printable("a\x1b[2J\x9b\x07b") == "a\\x1b[2J\\x9b\\x07b"
    assert printable("x\ny\u2028\u202ez\u200b") == "x\\ny\\u2028\\u202ez\\u200b"
    assert printable("café 日本 🐱 'q' \\") == "café 日本 🐱 'q' \\"


@pytest.fixture
def tampered_model(tmp_path):
    """A classifier whose labels.txt names classes with ESC sequences (the window title,
    red text), and an image."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3))
    pooled = keras.layers.GlobalAveragePooling2D()(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(pooled))
    folder = tmp_path / "run"
    folder.mkdir()
    model.save(folder / "model.keras")
    labels = ["\x1b]0;owned\x07cat", "\x1b[31mdog\x1b[0m"]
    (folder / "labels.txt").write_text("".join(f"{label}\n" for label in labels), "utf-8")
    settings = {"image_size": 16, "resize_size": None, "mean": [0.485, 0.456, 0.406]}
    settings.update(std=[0.229, 0.224, 0.225], exports_include_preprocessing=False)
    (folder / "preprocessing.json").write_text(json.dumps(settings))
    image = tmp_path / "photo\x1b[2J.png"
    Image.fromarray(np.full((20, 20, 3), 90, np.uint8)).save(image)
    return folder / "model.keras", image, labels


def _run(main, *argv):
    """`main(argv)`: (status or exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main([str(a) for a in argv])
        except SystemExit as exit:
            status = exit.code
    return status, out.getvalue(), err.getvalue()


def test_predict_prints_labels_and_paths_escaped(tampered_model):
    model, image, labels = tampered_model
    status, printed, _ = _run(predict.main, model, image, "--top", "2")
    assert status == 0 and "\x1b" not in printed and "\x07" not in printed
    assert printed.splitlines()[0] == str(image).replace("\x1b", "\\x1b")
    assert "\\x1b]0;owned\\x07cat" in printed and "\\x1b[31mdog\\x1b[0m" in printed
    status, printed, _ = _run(predict.main, model, image, "--json")
    assert status == 0 and [t["label"] for t in json.loads(printed)[0]["top"]] != []
    assert {t["label"] for t in json.loads(printed)[0]["top"]} == set(labels)  # JSON as is


def test_error_messages_print_paths_escaped(tampered_model, tmp_path):
    model, _, _ = tampered_model
    missing = tmp_path / "gone\x1b[2J.png"
    escaped = str(missing).replace("\x1b", "\\x1b")
    for main, argv in (
        (predict.main, (model, missing)),
        (convert_weights.main, (missing, tmp_path / "w.weights.h5")),
        (train.main, ("--output", tmp_path / "out", missing)),  # argparse's own error
        (train.main, ("--dataset", "cifar10", "--data-dir", missing, "--output", tmp_path)),
    ):
        status, printed, errors = _run(main, *argv)
        message = f"{status if isinstance(status, str) else ''}{printed}{errors}"
        assert status not in (0, None) and escaped in message, (main, message)
        assert "\x1b" not in message, (main, message)


def test_finetune_errors_print_file_names_escaped(tmp_path):
    # A run's recorded split lists a file that is gone: the refusal lists the file names.
    root = _class_folders(tmp_path / "images", ["a", "b"], images=3)
    os.rename(root / "a" / "0.png", root / "a" / "0\x1b[2J.png")
    output = tmp_path / "run"
    data.image_folder(root, record=output / "split.json")
    os.remove(root / "a" / "0\x1b[2J.png")
    status, _, errors = _run(finetune.main, root, "--output", output, "--weights", "none")
    assert status == 2 and "a/0\\x1b[2J.png (The file does not exist)" in errors, errors
    assert "\x1b" not in errors


def test_the_finetune_summary_prints_paths_escaped():
    from keras_autoshuffle.commands.finetune import summary

    report = {
        "validation": {"accuracy": 1.0, "examples": 2},
        "data": {"classes": ["a", "b"]},
        "files": {
            "litert": {"path": "runs/\x1b]0;x\x07/model.tflite", "size_bytes": 1e6, "accuracy": 1.0}
        },
    }
    text = summary(report)
    assert "\x1b" not in text and "\x07" not in text
    assert "runs/\\x1b]0;x\\x07/model.tflite" in text
