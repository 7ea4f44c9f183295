"""The fine-tuning report (`finetuning.report`): metrics against independent counts, the
confusion matrix PNG, exported files' latency, and report.json / report.md."""

import json
import math
import os
import sys

import keras
import matplotlib
import numpy as np
import pytest
from PIL import Image

from keras_autoshuffle import export
from keras_autoshuffle.finetuning import report
from tests.helpers import needs_extra

UNICODE_NAMES = ["chat noir", "猫 (ねこ)", "собака | пёс", "$5 bill", "naïve_*x*"]


# --- classification_metrics ---------------------------------------------------------------


def test_metrics_of_a_hand_counted_example():
    names = ["cat", "dog", "fox", "owl"]
    labels = np.array([0, 0, 0, 1, 1, 2])
    predicted = [0, 0, 1, 1, 2, 2]  # owl: no example, never predicted
    probabilities = np.eye(4)[predicted] * 0.7 + 0.1
    metrics = report.classification_metrics(labels, probabilities, names)
    assert metrics["examples"] == 6
    assert metrics["accuracy"] == pytest.approx(4 / 6)
    assert metrics["confusion_matrix"] == [[2, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 0], [0, 0, 0, 0]]
    assert metrics["per_class"] == [
        {"name": "cat", "examples": 3, "accuracy": pytest.approx(2 / 3), "precision": 1.0},
        {"name": "dog", "examples": 2, "accuracy": 0.5, "precision": 0.5},
        {"name": "fox", "examples": 1, "accuracy": 1.0, "precision": 0.5},
        {"name": "owl", "examples": 0, "accuracy": None, "precision": None},
    ]
    json.dumps(metrics)  # plain Python numbers


def test_metrics_match_an_independent_count():
    rng = np.random.default_rng(3)
    classes, count = 40, 500
    # uint8 labels: 39 * 40 + 39 does not fit in 8 bits. The last class has no example.
    labels = rng.integers(0, classes - 1, count).astype(np.uint8)
    logits = rng.normal(size=(count, classes)).astype("float32")
    metrics = report.classification_metrics(labels, logits, [f"c{i}" for i in range(classes)])

    predicted = logits.argmax(axis=1)
    expected = np.zeros((classes, classes), int)
    np.add.at(expected, (labels, predicted), 1)
    np.testing.assert_array_equal(metrics["confusion_matrix"], expected)
    assert metrics["accuracy"] == pytest.approx(np.mean(predicted == labels))
    for i, entry in enumerate(metrics["per_class"]):
        of_class, as_class = labels == i, predicted == i
        assert entry["examples"] == of_class.sum()
        if of_class.any():
            assert entry["accuracy"] == pytest.approx(np.mean(predicted[of_class] == i))
        else:
            assert entry["accuracy"] is None
        if as_class.any():
            assert entry["precision"] == pytest.approx(np.mean(labels[as_class] == i))
        else:
            assert entry["precision"] is None


@pytest.mark.parametrize(
    "labels, probabilities, names, match",
    [
        (np.array([[0, 1]]), np.ones((1, 2)), ["a", "b"], "Received: labels="),
        (np.array([0.0, 1.0]), np.ones((2, 2)), ["a", "b"], "Received: labels="),
        (np.array([], int), np.ones((0, 2)), ["a", "b"], "Received: labels="),
        (np.array([0, 2]), np.ones((2, 2)), ["a", "b"], r"out of range: \[2\]"),
        (np.array([-1, 0]), np.ones((2, 2)), ["a", "b"], r"out of range: \[-1\]"),
        (np.array([0, 1]), np.ones((2, 3)), ["a", "b"], "probabilities of shape"),
        (np.array([0, 1]), np.ones((3, 2)), ["a", "b"], "probabilities of shape"),
        (np.array([0, 1]), np.array([[0.5, np.nan], [1, 0]]), ["a", "b"], "1 non-finite"),
        (np.array([0, 1]), np.array([["a", "b"], ["c", "d"]]), ["a", "b"], "dtype <U1"),
        (np.array([0, 1]), np.ones((2, 2), complex), ["a", "b"], "dtype complex128"),
        (np.array([0, 1]), np.ones((2, 2)), "ab", "Received: class_names='ab'"),
        (np.array([0, 1]), np.ones((2, 2)), ["a", "a"], r"repeated: \['a'\]"),
        (np.array([0, 1]), np.ones((2, 2)), ["a", 1], "Received: class_names="),
    ],
)
def test_metrics_refuse_bad_inputs(labels, probabilities, names, match):
    with pytest.raises(ValueError, match=match):
        report.classification_metrics(labels, probabilities, names)


# --- plot_confusion_matrix ----------------------------------------------------------------


@pytest.mark.parametrize("classes", [3, 60])
def test_confusion_matrix_png(tmp_path, classes):
    names = [f"{UNICODE_NAMES[i % len(UNICODE_NAMES)]} {i}" for i in range(classes)]
    matrix = np.random.default_rng(0).integers(0, 20, (classes, classes))
    matrix[0] = 0  # a class without validation examples: an empty row, no division by 0
    pyplot = "matplotlib.pyplot" in sys.modules
    with matplotlib.rc_context({"backend": "svg"}):  # a user's choice, restored after
        path = report.plot_confusion_matrix(matrix, names, tmp_path / "out" / "cm.png")
        assert matplotlib.rcParams._get("backend") == "svg"  # untouched (read unresolved)
    assert ("matplotlib.pyplot" in sys.modules) == pyplot  # drawn without pyplot
    assert path == str(tmp_path / "out" / "cm.png")
    assert os.listdir(tmp_path / "out") == ["cm.png"]  # no temporary left
    with Image.open(path) as image:
        assert image.format == "PNG"
        width, height = image.size
        pixels = np.asarray(image.convert("L"))
    # Each class gets a readable strip: at least 10 px of the image a class.
    assert 300 <= min(width, height) and max(width, height) <= 8000
    assert min(width, height) >= 10 * classes
    assert pixels.min() < 100 and pixels.max() > 200  # drawn, not blank


@pytest.mark.parametrize(
    "matrix",
    [
        np.ones((2, 3), int),
        np.ones((3, 3), int),
        [[1, -1], [0, 2]],
        [[1.5, 0], [0, 1]],
        [[1, 0], [0]],
        [[1, 0], [0, np.nan]],
    ],
)
def test_confusion_matrix_png_refuses_bad_matrices(tmp_path, matrix):
    with pytest.raises(ValueError, match="Received: matrix="):
        report.plot_confusion_matrix(matrix, ["a", "b"], tmp_path / "cm.png")
    assert not os.listdir(tmp_path)


# --- file_latency -------------------------------------------------------------------------


def _small_net():
    """A conv net of three layers. Not a ShuffleNet: `file_latency` runs any file, and
    LiteRT's converter takes 10 s a file for the tiny ShuffleNet of tests/helpers.py
    against 1 s for this (2 shared cores)."""
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(8, 3, strides=2, activation="relu")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(5, activation="softmax")(x))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """`_small_net` as each file format `file_latency` runs (those installed)."""
    folder = tmp_path_factory.mktemp("files")
    model = _small_net()
    calibration = np.random.default_rng(0).normal(size=(8, 16, 16, 3)).astype("float32")
    paths = {
        "litert": export.export_litert(model, str(folder / "model.tflite")),
        "int8": export.export_int8(model, str(folder / "model_int8.tflite"), calibration),
    }
    for fmt, writer, name in (
        ("onnx", export.export_onnx, "model.onnx"),
        ("openvino", export.export_openvino, "openvino"),
    ):
        if not export.unsupported_formats((fmt,), export.compute_dtypes(model)):
            paths[fmt] = writer(model, str(folder / name))
    return paths


@pytest.mark.parametrize(
    "fmt",
    [
        "litert",
        "int8",
        pytest.param("onnx", marks=needs_extra("onnx")),
        pytest.param("openvino", marks=needs_extra("openvino")),
    ],
)
def test_file_latency_times_each_format(exported, fmt):
    result = report.file_latency(exported[fmt], (1, 16, 16, 3), 2, warmup=1, runs=4)
    assert set(result) == {"median_ms", "p90_ms", "runs", "num_threads"}
    assert result["runs"] == 4 and result["num_threads"] == 2
    for key in ("median_ms", "p90_ms"):
        assert math.isfinite(result[key]) and result[key] > 0, result
    assert result["p90_ms"] >= result["median_ms"]


@pytest.mark.parametrize(
    "arguments, match",
    [
        ({}, r"model\.tflite cannot be loaded as a model of format 'litert'"),
        ({"path": "missing.tflite"}, r"Received: path='.*missing\.tflite'"),
        ({"input_shape": (2, 16, 16, 3)}, r"Received: input_shape=\(2, 16, 16, 3\)"),
        ({"input_shape": (1, 0, 16, 3)}, "Received: input_shape="),
        ({"input_shape": 16}, "Received: input_shape=16"),
        ({"num_threads": 0}, "Received: num_threads=0"),
        ({"warmup": -1}, "Received: warmup=-1"),
        ({"runs": 0}, "Received: runs=0"),
        ({"runs": 2.5}, "Received: runs=2.5"),
    ],
)
def test_file_latency_refuses_bad_arguments(tmp_path, arguments, match):
    path = tmp_path / "model.tflite"
    path.write_bytes(b"")  # read only once the arguments are checked: a damaged file
    call = {"path": str(path), "input_shape": (1, 16, 16, 3), **arguments}
    call["path"] = str(tmp_path / call["path"])
    with pytest.raises(ValueError, match=match):
        report.file_latency(**call)


# --- write_report -------------------------------------------------------------------------


def _full_report():
    names = ["cat", "dog | wolf", "bird_*x*"]
    labels = np.array([0, 0, 1, 1, 1, 2])
    probabilities = np.eye(3)[[0, 1, 1, 1, 0, 2]]
    return {
        "data": {
            "classes": names,
            "train_examples": 24,
            "val_examples": 6,
            "source": "seeded split (seed 0, 20 %)",
            "skipped": ["notes.txt"],
        },
        "settings": {"epochs": 3, "learning_rate": 0.001, "weights": None, "side": [224, 224]},
        "validation": report.classification_metrics(labels, probabilities, names),
        "files": {
            "litert": {
                "path": "model.tflite",
                "size_bytes": 5_400_000,
                "accuracy": 5 / 6,
                "top1_agreement": 1.0,
                "latency": {"median_ms": 3.25, "p90_ms": 3.5, "runs": 30, "num_threads": 1},
            },
            "int8": {"path": "model_int8.tflite", "size_bytes": 1_500_000, "accuracy": 4 / 6},
        },
        "int8": {"accuracy_drop": 16.67, "top1_agreement": 0.8333},
        "cpu": "Test CPU @ 1 GHz",
        "written": "2026-01-02 03:04:05 UTC",
    }


def test_write_report_writes_json_markdown_and_png(tmp_path):
    content = _full_report()
    paths = report.write_report(tmp_path / "run", content)
    folder = tmp_path / "run"
    assert paths == {
        "confusion_matrix": str(folder / "confusion_matrix.png"),
        "markdown": str(folder / "report.md"),
        "json": str(folder / "report.json"),
    }
    assert sorted(os.listdir(folder)) == ["confusion_matrix.png", "report.json", "report.md"]
    with open(paths["json"]) as f:
        assert json.load(f) == json.loads(json.dumps(content))
    with Image.open(paths["confusion_matrix"]) as image:
        assert image.format == "PNG"

    markdown = (folder / "report.md").read_text(encoding="utf-8")
    lines = markdown.splitlines()
    # Predicted [cat, dog, dog, dog, cat, bird] for [cat, cat, dog, dog, dog, bird]: cat 1 of
    # 2 right, predicted twice (1 right); dog | wolf 2 of 3, predicted 3 times (2 right);
    # bird 1 of 1, predicted once.
    assert "| cat | 2 | 50.00 % | 50.00 % |" in lines
    assert r"| dog \| wolf | 3 | 66.67 % | 66.67 % |" in lines
    assert r"| bird\_\*x\* | 1 | 100.00 % | 100.00 % |" in lines
    assert "Accuracy: **66.67 %** of 6 images." in lines
    assert "![confusion matrix](confusion_matrix.png)" in lines
    header = (
        "| format | file | size (MB) | accuracy | top-1 agreement with Keras "
        "| latency ms/image (median) | threads |"
    )
    assert header in lines
    assert "| litert | `model.tflite` | 5.4 | 83.33 % | 100.00 % | 3.25 (p90 3.50) | 1 |" in lines
    assert "| int8 | `model_int8.tflite` | 1.5 | 66.67 % |  |  |  |" in lines
    assert "| `weights` | `None` |" in lines and "| `side` | `[224, 224]` |" in lines
    assert "- Validation images from: seeded split (seed 0, 20 %)" in lines
    assert "- Skipped files: 1 (`notes.txt`)" in lines
    assert r"- Classes (3): cat, dog \| wolf, bird\_\*x\*" in lines
    assert "- Accuracy drop from the float model: 16.67 percentage points" in lines
    assert any("Test CPU @ 1 GHz" in line for line in lines)
    assert "Written 2026-01-02 03:04:05 UTC." in lines
    # Every table row has as many cells as its header: no `|` of a name split a cell.
    tables = [line for line in lines if line.startswith("|")]
    for line in tables:
        cells = line.replace(r"\|", "").count("|")
        assert cells in (5, 3, 8), line


def test_report_md_gives_each_int8_check_beside_the_float_numbers(tmp_path):
    check = {
        "accuracy": 0.82,
        "float_accuracy": 0.822,
        "accuracy_drop": 0.2,
        "max_accuracy_drop": 2.0,
        "top1_agreement": 0.982,
        "test_examples": 500,
    }
    refused = {**check, "accuracy": 0.792, "accuracy_drop": 3.0, "refused": "Beyond the bound."}
    written = {**check, "path": str(tmp_path / "model_int8.tflite")}
    report.write_report(tmp_path, {"int8": written, "onnx_int8": refused})
    lines = (tmp_path / "report.md").read_text(encoding="utf-8").splitlines()
    start = lines.index("## int8 LiteRT")
    assert lines[start + 2 : start + 6] == [
        "- Written: `model_int8.tflite`",
        "- Accuracy: 82.00 %, the float model's 82.20 % (on 500 validation images)",
        "- Accuracy drop from the float model: 0.20 percentage points (bound: 2, "
        "`--int8-max-drop`)",
        "- Top-1 agreement with the float model: 98.20 %",
    ]
    start = lines.index("## int8 ONNX")
    assert lines[start + 2 : start + 5] == [
        "- Refused: Beyond the bound.",
        "- Accuracy: 79.20 %, the float model's 82.20 % (on 500 validation images)",
        "- Accuracy drop from the float model: 3.00 percentage points (bound: 2, "
        "`--int8-max-drop`)",
    ]


def test_write_report_leaves_out_what_is_absent(tmp_path):
    data = {"classes": ["golden_retriever", "_a", "$5"], "val_examples": 4}
    paths = report.write_report(tmp_path, {"data": data})
    assert set(paths) == {"json", "markdown"}
    assert not (tmp_path / "confusion_matrix.png").exists()
    markdown = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "None" not in markdown and "## Validation" not in markdown
    assert "## Exported files" not in markdown and "## Settings" not in markdown
    # `_` inside a word starts no emphasis: left as it is.
    assert r"- Classes (3): golden_retriever, \_a, \$5" in markdown
    assert "- Validation images: 4" in markdown
    assert "Training images" not in markdown
    with open(paths["json"]) as f:
        written = json.load(f)
    assert written["cpu"] and written["written"]  # recorded beside the data


def test_write_report_is_stable_but_for_the_written_line(tmp_path):
    content = _full_report()
    del content["written"]
    texts = []
    for name in ("a", "b"):
        report.write_report(tmp_path / name, content)
        texts.append((tmp_path / name / "report.md").read_text(encoding="utf-8").splitlines())
    differing = [(a, b) for a, b in zip(*texts, strict=True) if a != b]
    assert all(a.startswith("Written ") for a, _ in differing)


@pytest.mark.parametrize(
    "output_dir, content, match",
    [
        (None, {}, "Received: output_dir=None"),
        ("out", [1], r"Received: report=\[1\]"),
        ("out", {"files": ["model.tflite"]}, r"Received: report\['files'\]="),
        ("out", {"files": {"litert": 3}}, r"Received: report\['files'\]\['litert'\]=3"),
        ("out", {"validation": {"confusion_matrix": [[1]]}}, r"report\['validation'\]"),
    ],
)
def test_write_report_refuses_bad_reports(tmp_path, output_dir, content, match):
    with pytest.raises(ValueError, match=match):
        report.write_report(output_dir and tmp_path / output_dir, content)
