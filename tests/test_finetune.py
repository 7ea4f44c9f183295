"""`finetune()` and `autoshuffle-finetune` end to end on a folder of real image files.

One run with every export is shared by the tests of what it writes; the resume test kills
a run of the command with SIGKILL mid-training (a real kill, in a child process) and checks
the rerun ends with the weights of an uninterrupted run.
"""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest
from helpers import needs_extra, tiny_v2
from PIL import Image
from test_pretrained_weights import cache as cache  # noqa: F401 (fixtures: the weights server)
from test_pretrained_weights import register
from test_pretrained_weights import server as server  # noqa: F401

from keras_autoshuffle import export, prediction
from keras_autoshuffle.applications import IMAGENET_MEAN, IMAGENET_STD
from keras_autoshuffle.commands import finetune as finetune_command
from keras_autoshuffle.export import metadata as litert_metadata
from keras_autoshuffle.finetuning import finetune, network, run_folder
from keras_autoshuffle.finetuning import run as run_module
from keras_autoshuffle.training.fault_tolerance import RunDirectoryError

# Whole trainings and exports: started first under xdist (conftest.py orders files by it).
pytestmark = pytest.mark.slow

CLASSES = ("cat", "chien", "émeu")
SIDE = 32
TINY = dict(width=0.5, image_size=SIDE, batch_size=4, verbose=0)
# The shared run's training settings (the killed run's too): enough epochs to learn the
# colours (validation accuracy 1.0 with seeds 0, 1 and 2; at 2 epochs it stayed at chance,
# 0.33, as it does at 8 epochs with learning_rate=1e-9).
RUN_ARGUMENTS = dict(weights=None, epochs=8, learning_rate=0.05, **TINY)


def write_folder(root, per_class=8, val_per_class=4, seed=0):
    """train/ and val/ with one folder per class: noisy images whose colour says the class
    (red, green, blue), as PNG, JPEG and BMP files of different sizes."""
    rng = np.random.default_rng(seed)
    for split, count in (("train", per_class), ("val", val_per_class)):
        for label, name in enumerate(CLASSES):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                side = int(rng.integers(30, 60))
                pixels = rng.integers(0, 90, size=(side, side + 3, 3))
                pixels[..., label] += 160
                suffix = (".png", ".jpg", ".bmp")[i % 3]
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{i}{suffix}")
    return root


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return write_folder(tmp_path_factory.mktemp("images"))


def tiny_network(width, **arguments):
    """A tiny ShuffleNet v2 (tests/helpers.py) in place of the `width` one: its stages'
    channels scale with `width` (a file of another width differs in shape, as a real one
    does). A run's time is mostly tracing its layers; the ImageNet test keeps the real 0.5x."""
    scale = round(width / 0.5)
    return tiny_v2(width=width, channels=(8, 16 * scale, 32 * scale, 64 * scale, 64), **arguments)


@pytest.fixture
def tiny_networks(monkeypatch):
    monkeypatch.setattr(network, "ShuffleNetV2", tiny_network)


@pytest.fixture(scope="module")
def run(images, tmp_path_factory):
    """A from-scratch run (tiny networks) with every export and int8 (ONNX's and
    OpenVINO's weights in 8 bits): (its folder, its report)."""
    output = tmp_path_factory.mktemp("run")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(network, "ShuffleNetV2", tiny_network)
        report = finetune(
            images,
            output,
            export_formats=("litert", "onnx", "openvino"),
            int8=True,
            int8_weight_bits=8,
            **RUN_ARGUMENTS,
        )
    return output, report


@needs_extra("onnx")
@needs_extra("openvino")
def test_a_run_writes_the_model_its_labels_exports_and_report(run):
    output, report = run
    names = set(os.listdir(output))
    expected = {"model.keras", "labels.txt", "preprocessing.json", "split.json", "report.json"}
    expected |= {"report.md", "confusion_matrix.png", "model.tflite", "model_int8.tflite"}
    expected |= {"model.onnx", "openvino", "train_all", "preset"}
    assert expected <= names, names
    assert "image_cache" not in names  # training's only, removed before the exports
    assert (output / "labels.txt").read_text(encoding="utf-8").splitlines() == list(CLASSES)
    assert json.loads((output / "report.json").read_text()) == json.loads(json.dumps(report))
    assert report["data"]["train_examples"] == 24 and report["data"]["val_examples"] == 12
    matrix = np.array(report["validation"]["confusion_matrix"])
    assert matrix.sum() == 12 and matrix.shape == (3, 3)
    # The report's accuracy is the Keras model's, recomputed here from the confusion matrix.
    assert report["validation"]["accuracy"] == pytest.approx(np.trace(matrix) / 12)
    # It learned: well above chance (1/3) on the held-out images.
    assert report["validation"]["accuracy"] >= 0.8, matrix
    model = keras.saving.load_model(output / "model.keras", safe_mode=True)
    assert model.output_shape == (None, 3) and model.input_shape == (None, SIDE, SIDE, 3)


@needs_extra("onnx")
@needs_extra("openvino")
def test_every_float_export_agrees_with_keras_on_the_validation_images(run):
    _, report = run
    for fmt in ("litert", "onnx", "openvino"):
        entry = report["files"][fmt]
        assert entry["examples"] == 12 and entry["size_bytes"] > 0
        assert entry["top1_agreement"] == 1.0, (fmt, entry)
        assert entry["accuracy"] == pytest.approx(report["validation"]["accuracy"])
        assert entry["latency"]["median_ms"] > 0
    int8 = report["files"]["int8"]
    assert int8["size_bytes"] < report["files"]["litert"]["size_bytes"]
    # Each int8 file's check, against the float model on the validation images: kept, or
    # refused with its numbers and no file.
    for key in ("int8", "onnx_int8", "openvino_int8"):
        check = report[key]
        assert 0 <= check["top1_agreement"] <= 1 and check["test_examples"] == 12
        assert bool(check.get("refused")) == (key not in report["files"]), key
        if key in report["files"]:
            assert report["files"][key]["top1_agreement"] == pytest.approx(check["top1_agreement"])
    assert report["settings"]["int8_weight_bits"] == 8  # the run's, passed to the writers


@needs_extra("onnx")
@needs_extra("openvino")
def test_every_file_of_a_run_gives_the_same_top1_through_predict(run, images):
    """`prediction.Classifier` on each file the run wrote, on the validation image files
    themselves: one top-1 per image, whatever the format."""
    output, _ = run
    paths = sorted(str(p) for p in (images / "val").rglob("*.*"))
    pictures = [np.asarray(Image.open(p).convert("RGB")) for p in paths]
    files = ["model.keras", "model.tflite", "model.onnx", "openvino"]
    top1 = {
        name: np.argmax(prediction.Classifier.from_file(output / name).predict(pictures), -1)
        for name in files
    }
    for name in files[1:]:
        np.testing.assert_array_equal(top1[name], top1["model.keras"], err_msg=name)


@needs_extra("onnx")
@needs_extra("openvino")
def test_the_runs_exported_files_carry_their_class_names(run):
    """Each exported file, float and int8, names its classes and its input's normalisation
    on pixel values: LiteRT metadata (mean 0, std 255: the `.tflite` files take RGB in
    [0, 1], as MediaPipe Tasks runs them), ONNX `metadata_props` and OpenVINO `rt_info`
    (ImageNet's, per channel)."""
    output, report = run
    read = {
        "litert": litert_metadata.read_litert_metadata,
        "onnx": litert_metadata.read_onnx_metadata,
        "openvino": litert_metadata.read_openvino_metadata,
    }
    if importlib.util.find_spec("mediapipe") is None:  # LiteRT metadata needs the extra
        del read["litert"]
    files = report["files"]
    assert {"litert", "onnx", "openvino"} <= set(files)
    for key in files:
        fmt = export.INT8_FILES[key][0] if key in export.INT8_FILES else key
        if fmt not in read:
            continue
        described = read[fmt](files[key]["path"])
        assert described["labels"] == list(CLASSES), key
        if fmt == "litert":
            assert (described["mean"], described["std"]) == ([0.0], [255.0]), key
            continue
        assert described["mean"] == pytest.approx([255 * m for m in IMAGENET_MEAN])
        assert described["std"] == pytest.approx([255 * s for s in IMAGENET_STD])


def test_the_split_and_preprocessing_records_describe_the_inputs(run, images):
    output, _ = run
    preprocessing = json.loads((output / "preprocessing.json").read_text())
    assert preprocessing["image_size"] == SIDE
    assert preprocessing["resize_size"] == round(SIDE * 256 / 224)
    split = json.loads((output / "split.json").read_text())
    assert split["source"] == "folders"


def test_a_finished_run_is_refused_without_overwrite(run, images):
    output, _ = run
    with pytest.raises(RunDirectoryError, match="finished fine-tuning"):
        finetune(images, output, **RUN_ARGUMENTS)


def test_overwrite_checks_the_images_first_then_removes_the_runs_files_only(tmp_path):
    """With overwrite, a bad image folder leaves the finished run as it was; clearing it
    removes every file a run writes (a stale one would sit beside the new run's), and
    nothing else."""
    output = tmp_path / "out"
    (output / "train_all").mkdir(parents=True)
    for name in ("report.json", "model.tflite", "labels.txt", "split.json", "notes.txt"):
        (output / name).write_text("{}")
    before = sorted(os.listdir(output))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="empty"):
        finetune(empty, output, overwrite=True, **RUN_ARGUMENTS)
    assert sorted(os.listdir(output)) == before
    run_folder.clear_run(str(output))
    assert sorted(os.listdir(output)) == ["notes.txt"]


def test_bad_arguments_are_refused_by_name_before_any_work(images, tmp_path):
    cases = [
        (dict(width=0.7), "width=0.7"),
        (dict(weights=None, head_epochs=2), "head_epochs=2"),
        (dict(weights="imagenet", label_smoothing=1.0), "label_smoothing=1.0"),
        (dict(weights="imagenet", class_weights="inverse"), "class_weights='inverse'"),
        (dict(weights=str(tmp_path / "missing.keras")), "missing.keras"),
        (dict(weights=str(tmp_path / "model.h5")), "model.h5"),
        (dict(weights="imagenet", export_formats=("tflite",)), "tflite"),
        (dict(weights="imagenet", export_formats=(), int8=True), "int8=True"),
        (dict(weights="imagenet", int8=True, include_preprocessing=True), "int8=True"),
        (dict(weights="imagenet", export_formats=(), include_preprocessing=True), "export_f"),
        (dict(weights="imagenet", include_preprocessing=1), "include_preprocessing=1"),
    ]
    for overrides, named in cases:
        options = {**dict(width=0.5, image_size=SIDE, verbose=0), **overrides}
        with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
            finetune(images, tmp_path / "out", **options)
        assert not (tmp_path / "out").exists(), overrides


@pytest.mark.usefixtures("tiny_networks")
def test_a_weights_file_of_another_width_is_refused_naming_it(run, images, tmp_path):
    output, _ = run
    with pytest.raises(ValueError, match="width 1.0.*Received: width=1.0"):
        finetune(images, tmp_path / "out", weights=str(output / "model.keras"), width=1.0)


@pytest.mark.usefixtures("cache")
def test_imagenet_weights_that_cannot_be_downloaded_fail_before_any_folder(
    images, tmp_path, server, monkeypatch
):
    """The download (`network.check_weights`) comes before the run's folder is made and
    any image is read (a failed run removes its folder: the images tell). A download that
    succeeds is test_pretrained_weights.py's; the phases on pretrained weights are
    test_finetune_presets.py's (a preset's start, the same `build_classifier`)."""
    register(monkeypatch)
    server.stop()  # the port is closed: connection refused

    def read_images(*args, **kwargs):
        raise AssertionError("the images were read before the weights were downloaded")

    monkeypatch.setattr(run_module, "image_folder", read_images)
    with pytest.raises(OSError, match="autoshuffle-convert-weights"):
        finetune(images, tmp_path / "out", weights="imagenet", export_formats=(), **TINY)
    assert not (tmp_path / "out").exists()


@pytest.mark.usefixtures("tiny_networks")
def test_raw_input_exports_hold_their_preprocessing(run, images, tmp_path):
    """`include_preprocessing` on the shared run's trained net: a rerun of its finished
    phase goes straight to the exports (LiteRT alone: the ONNX and OpenVINO files of
    `raw_input_model` are test_raw_inputs.py's)."""
    output = tmp_path / "out"
    output.mkdir()
    copy_trained(run[0], output)
    options = dict(RUN_ARGUMENTS, export_formats=("litert",), include_preprocessing=True)
    check_raw_input_exports(output, finetune(images, output, **options), images)


def check_raw_input_exports(output, report, images):
    """With `include_preprocessing`: preprocessing.json says so; the exported files
    take uint8 pixels of any size, and on the validation files as decoded give the
    probabilities `model.keras` gives after `evaluation_preprocessing` (prediction's two
    paths: the exact transform outside the file, the builtin-op one inside)."""
    assert json.loads((output / "preprocessing.json").read_text())["exports_include_preprocessing"]
    formats = [fmt for fmt in report["files"] if fmt != "keras"]
    assert formats and set(formats) <= {"litert", "onnx", "openvino"}, formats
    for fmt in formats:
        entry = report["files"][fmt]
        assert entry["top1_agreement"] == 1.0 and entry["examples"] == 12, (fmt, entry)
        assert entry["latency_input_shape"][0] == 1 and entry["latency"]["median_ms"] > 0
    interpreter = export.litert_interpreter(str(output / "model.tflite"))
    detail = interpreter.get_input_details()[0]
    assert detail["dtype"] == np.uint8 and list(detail["shape_signature"])[1:] == [-1, -1, 3]
    paths = sorted(str(p) for p in (images / "val").rglob("*.*"))
    pictures = [np.asarray(Image.open(p).convert("RGB")) for p in paths]
    assert len({picture.shape for picture in pictures}) > 1  # sizes differ
    expected = prediction.Classifier.from_file(output / "model.keras").predict(pictures)
    for name in (export.FILENAMES[fmt] for fmt in formats):
        outputs = prediction.Classifier.from_file(output / name).predict(pictures)
        np.testing.assert_allclose(outputs, expected, rtol=0, atol=1e-4, err_msg=name)
    assert "raw RGB pixels" in (output / "report.md").read_text(encoding="utf-8")


# The child: the command, killed (SIGKILL) right after the whole-net phase logged its
# second epoch, before that epoch's backup (the first one's is done); the package holds no
# test hook: the child wraps the history logger. Its arguments: the shared run's settings.
CHILD = r"""
import os, signal, sys
sys.path[:0] = [os.environ["TESTS_DIR"]]
from keras_autoshuffle.commands import finetune
from keras_autoshuffle.finetuning import network
from keras_autoshuffle.training import fault_tolerance
from test_finetune import tiny_network

network.ShuffleNetV2 = tiny_network  # the shared run's network

log = fault_tolerance.HistoryLog.on_epoch_end


def log_then_die(self, epoch, logs=None):
    log(self, epoch, logs)
    if "train_all" in self.path and epoch == 1:
        os.kill(os.getpid(), signal.SIGKILL)


fault_tolerance.HistoryLog.on_epoch_end = log_then_die
sys.exit(finetune.main(sys.argv[1:]))
"""


@pytest.mark.usefixtures("tiny_networks")
def test_a_killed_run_resumes_to_the_uninterrupted_weights(run, images, tmp_path):
    """SIGKILL in the whole-net phase of the shared run's settings; the rerun finishes it
    with the weights of the shared run (never killed); a rerun with another setting is
    refused by name."""
    killed = tmp_path / "killed"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    command = [sys.executable, str(script), str(images), "--output", str(killed)]
    command += ["--weights", "none", "--epochs", str(RUN_ARGUMENTS["epochs"])]
    command += ["--learning-rate", "0.05"]
    command += ["--width", "0.5", "--image-size", str(SIDE), "--batch-size", "4"]
    command += ["--export-formats", "none", "--verbose", "0"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TESTS_DIR": os.path.dirname(__file__)}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    assert not (killed / "report.json").exists()
    # A kill leaves the cache (the rerun reuses it) and the lock file (no longer held).
    assert (killed / "image_cache").is_dir() and (killed / "run.lock").is_file()
    with pytest.raises(RunDirectoryError, match="label_smoothing=0.2"):
        finetune(images, killed, **{**RUN_ARGUMENTS, "label_smoothing": 0.2}, export_formats=())
    finetune(images, killed, **RUN_ARGUMENTS, export_formats=())
    history = (killed / "train_all" / "history.csv").read_text().splitlines()
    epochs = RUN_ARGUMENTS["epochs"]
    assert [row.split(",")[0] for row in history[1:]] == [str(e) for e in range(epochs)]
    assert not (killed / "image_cache").exists() and not (killed / "run.lock").exists()
    resumed = keras.saving.load_model(killed / "model.keras", safe_mode=True).get_weights()
    whole = keras.saving.load_model(run[0] / "model.keras", safe_mode=True).get_weights()
    assert all(np.array_equal(x, y) for x, y in zip(resumed, whole, strict=True))


def copy_trained(run_folder, output):
    """A run killed after its training (the split and the finished phase of the shared
    run): a rerun with its arguments goes straight to the exports."""
    shutil.copyfile(run_folder / "split.json", output / "split.json")
    shutil.copytree(run_folder / "train_all", output / "train_all")


def run_argv(images, output, *formats):
    """The command line of the shared run's settings."""
    argv = [str(images), "--output", str(output), "--weights", "none", "--width", "0.5"]
    argv += ["--epochs", str(RUN_ARGUMENTS["epochs"]), "--learning-rate", "0.05"]
    argv += ["--image-size", str(SIDE), "--batch-size", "4", "--verbose", "0"]
    return argv + (["--export-formats", *formats] if formats else [])


@needs_extra("onnx")
@needs_extra("openvino")
@pytest.mark.usefixtures("tiny_networks")
def test_a_full_disk_during_the_exports_is_one_line_and_keeps_the_training(
    run, images, tmp_path, capsys
):
    """On a tmpfs with room for model.keras but not OpenVINO's files (whose writer says
    only "basic_ios::clear: iostream error"): one line that says the disk is full, status
    2, the finished phase kept for the rerun. OpenVINO alone: LiteRT and ONNX files
    written before it would add their conversions' time and nothing to the check."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", disk]).returncode:
        pytest.skip("no tmpfs mount here (root only)")
    try:
        copy_trained(run[0], disk)
        room = os.path.getsize(run[0] / "model.keras")
        (disk / "filler").write_bytes(bytes(shutil.disk_usage(disk).free - room - 40_000))
        argv = run_argv(images, disk, "openvino")
        assert finetune_command.main(argv) == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and f"The disk of {disk} is full (" in error, error
        assert (disk / "train_all" / "report.json").exists() and (disk / "split.json").exists()
        assert not (disk / "report.json").exists()
    finally:
        # Lazily: the failed export's runtimes may still hold a file open there.
        subprocess.run(["umount", "--lazy", disk], check=True)


@pytest.mark.usefixtures("tiny_networks")
def test_without_the_litert_extra_the_summary_and_report_name_what_was_not_written(
    run, images, tmp_path, monkeypatch, capsys
):
    """The command in an install without the `litert` extra, in this process: each
    `ai_edge_litert` module is None in sys.modules, so that no import of it succeeds (a
    fresh process with that shim cost ~11 CPU-s more for TensorFlow's import alone).
    Without the `onnx` and `openvino` extras too (the base install): their conversions
    added time and nothing to the LiteRT line checked here."""
    hidden = ("ai_edge_litert", "onnx", "onnxruntime", "tf2onnx", "openvino")
    for name in {*hidden, *(name for name in sys.modules if name.split(".")[0] in hidden)}:
        monkeypatch.setitem(sys.modules, name, None)
    output = tmp_path / "out"
    output.mkdir()
    copy_trained(run[0], output)
    assert finetune_command.main(run_argv(images, output)) == 0
    printed = capsys.readouterr().out
    missing = "model.tflite not written: the LiteRT check needs ai_edge_litert"
    assert missing in printed and "keras-autoshuffle[litert]" in printed
    assert not (output / "model.tflite").exists()
    report = (output / "report.md").read_text(encoding="utf-8")
    assert "Not written: model.tflite (" in report and "keras-autoshuffle\\[litert\\]" in report
    assert "model.tflite" in json.loads((output / "report.json").read_text())["not_exported"]
