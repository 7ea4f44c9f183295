"""The training commands end to end on the embedded digits, with tiny settings.

`autoshuffle-train`'s `main(argv)` (keras_autoshuffle/commands/train.py) and
scripts/train_imagenet.py's run in the test process (a fresh interpreter would add its
imports, ~10 s, to every call); a run's refusals end in SystemExit as on the command
line. The trainings build tiny nets (tests/helpers.py: `use_tiny_builders`; the real 0.5x
net took 90-160 s of CI's time, mostly tracing): the commands' code is the same for every
net size. The digits job below is trained once for the module.
"""

import contextlib
import csv
import io
import json
import re
import shutil

import keras
import numpy as np
import pytest
from helpers import load_script, use_tiny_builders

from keras_autoshuffle import RelaxedShuffle, data

DIGITS_JOB = [
    "--dataset", "digits", "--model", "v2", "--width", "0.5", "--shuffle", "auto",
    "--epochs", "2", "--batch-size", "32", "--max-train-examples", "96",
    "--harden-at-epoch", "1", "--balanced", "--verbose", "0", "--sinkhorn-iterations", "3",
]  # fmt: skip
# Units per stage of the digits job's tiny v2: a down-sampling unit in each stage, a basic
# unit after it in stage 3. One learned shuffle per unit.
DIGITS_JOB_REPEATS = (1, 2, 1)
DIGITS_JOB_SHUFFLES = sum(DIGITS_JOB_REPEATS)


def _main(name, *args):
    """main(args) of scripts/<name>.py, or of the `autoshuffle-train` command for "train":
    (exit status, what it printed or exited with)."""
    if name == "train":
        from keras_autoshuffle.commands import train as script
    else:
        script = load_script(name)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            script.main(list(args))
    except SystemExit as exit:
        code = exit.code
        if isinstance(code, str):  # sys.exit("error: ..."): printed, status 1
            return 1, printed.getvalue() + code
        return code or 0, printed.getvalue()
    return 0, printed.getvalue()


@pytest.fixture(scope="module")
def digits_job(tmp_path_factory):
    """`autoshuffle-train`'s digits job, run once: (output folder, exit, printed).
    The tiny v2 has a basic unit in stage 3 (its channel split: in the folded LiteRT file,
    one conv per half, `export.litert_graph`)."""
    keras.backend.clear_session()
    out = tmp_path_factory.mktemp("digits_job") / "run"
    with pytest.MonkeyPatch.context() as monkeypatch:
        use_tiny_builders(monkeypatch, repeats=DIGITS_JOB_REPEATS)
        code, output = _main("train", *DIGITS_JOB, "--output", str(out))
    return out, code, output


@pytest.mark.slow
def test_train_command_on_digits_writes_everything(digits_job):
    out, code, output = digits_job
    assert code == 0, output[-3000:]
    for name in ("model.keras", "saved_model", "model.tflite", "report.json", "history.csv"):
        assert (out / name).exists(), name
    assert any((out / "logs").rglob("events.out.tfevents*"))
    # No model chosen on the test split (the split the report quotes): no best.keras.
    assert not (out / "best.keras").exists() and not (out / "backup").exists()
    assert "best" not in json.loads((out / "report.json").read_text())["files"]
    # The command prints where everything is.
    assert str(out / "model.tflite") in output and "rounded" in output

    report = json.loads((out / "report.json").read_text())
    for key in (
        "relaxed_accuracy",
        "rounded_accuracy",
        "relative_change",
        "l12_penalty_at_hardening",
    ):
        assert np.isfinite(report[key]), key
    assert 0 <= report["rounded_accuracy"] <= 1 and report["time"] > 0
    assert report["settings"]["penalty"] == 5e-2 and report["settings"]["epochs"] == 2
    assert report["epoch"] == 1 and report["settings"]["balanced"] is True
    assert report["settings"]["shuffle"] == "auto" and report["settings"]["train_examples"] == 96
    # One learned shuffle per unit, all hardened (balanced), each in the report.
    assert len(report["layers"]) == DIGITS_JOB_SHUFFLES
    assert all(layer["groups"] == 2 for layer in report["layers"])
    # .keras, SavedModel and LiteRT agree with the in-memory hardened model; the latter
    # two hold the folded network.
    assert set(report["export"]) == {"keras", "saved_model", "litert"}
    for entry in report["export"].values():
        assert entry["max_abs_diff"] <= 1e-4
    assert report["export"]["litert"]["folded"] and report["export"]["saved_model"]["folded"]
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(out / "model.tflite"))
    ops = {op["op_name"] for op in interpreter._get_ops_details()}
    # Folded: concatenations, no GATHER; each sliced conv written as one conv per slice.
    assert "GATHER" not in ops and "CONCATENATION" in ops and "STRIDED_SLICE" not in ops
    with open(out / "history.csv") as f:
        row = next(csv.DictReader(f))
    assert float(row["l12_penalty"]) > 0

    model = keras.saving.load_model(out / "model.keras", safe_mode=True)
    shuffles = [layer for layer in model.layers if isinstance(layer, RelaxedShuffle)]
    assert len(shuffles) == DIGITS_JOB_SHUFFLES and all(layer.is_hardened for layer in shuffles)
    # --sinkhorn-iterations reached every learned shuffle, and the run's settings.
    assert {layer.sinkhorn_iterations for layer in shuffles} == {3}
    assert report["settings"]["sinkhorn_iterations"] == 3
    # The saved model's test accuracy is the report's final accuracy (hardened after
    # epoch 1, then trained on).
    _, test = data.digits()
    predictions = model.predict(test.images, verbose=0).argmax(-1)
    assert np.mean(predictions == test.labels) == pytest.approx(report["final_accuracy"], abs=1e-6)


def test_train_imagenet_without_data_fails_fast_with_instructions(tmp_path):
    # An error the script explains ends in SystemExit; any other exception (a
    # traceback on the command line) fails the test by propagating.
    code, output = _main(
        "train_imagenet",
        "--data-dir", str(tmp_path), "--manual-dir", str(tmp_path), "--output", str(tmp_path / "o"),
    )  # fmt: skip
    assert code != 0
    assert "ILSVRC2012_img_train.tar" in output and "Traceback" not in output


def test_train_command_rejects_bad_arguments(tmp_path):
    code, output = _main("train", "--epochs", "0", "--output", str(tmp_path))
    assert code != 0 and "--epochs: must be a positive integer, got '0'" in output
    code, output = _main("train", "--max-train-examples", "-5", "--output", str(tmp_path))
    assert code != 0 and "--max-train-examples: must be a positive integer, got '-5'" in output
    code, output = _main("train", "--sinkhorn-iterations", "1001", "--output", str(tmp_path))
    assert code != 0 and "Received: sinkhorn_iterations=1001" in output


TINY_RUN = [
    "--dataset", "digits", "--max-train-examples", "64", "--batch-size", "32", "--epochs", "1",
    "--verbose", "0", "--no-export",
]  # fmt: skip


@pytest.mark.parametrize(
    "args, message",
    [
        (["--search-epochs", "2", "--epochs", "2"], "argument --search-epochs: must be below"),
        (["--harden-at-epoch", "5", "--epochs", "2"], "argument --harden-at-epoch: must be below"),
        (["--width", "0.3"], "argument --width: must be one of 0.5, 1.0, 1.5, 2.0 with --model v2"),
        (["--width", "nan"], "argument --width: must be one of .*, got nan"),
        (["--model", "v1", "--groups", "5"], "argument --groups: must be one of 1, 2, 3, 4, 8"),
        (["--penalty", "1e31"], "argument --penalty/--lambda: must be at most 1e\\+30"),
        (["--balanced"], "argument --balanced: needs learned shuffles \\(--shuffle auto\\)"),
        (["--shuffle", "manual", "--shuffle-forward", "hard"], "--shuffle-forward hard: needs"),
        (["--shuffle", "manual", "--shuffle-initializer", "manual"], "initializer manual: needs"),
        (["--shuffle", "manual", "--search-epochs", "0"], "--search-epochs: needs learned"),
        (["--int8"], "argument --int8: needs the LiteRT, ONNX or OpenVINO export, got --no-export"),
        (["--batch-size", "1000"], "--batch-size: must be at most the 64 training examples"),
        (["--output", " "], "argument --output: must name a folder, got ' '"),
        (["--download"], "argument --download: only CIFAR-10 downloads, got --dataset digits"),
    ],
)
def test_train_command_refuses_contradicting_options_as_argparse_does(tmp_path, args, message):
    # Checked after parsing, before anything runs: argparse's usage, error and status 2.
    out = tmp_path / "run"
    code, output = _main("train", *TINY_RUN, "--output", str(out), *args)
    assert code == 2 and "Traceback" not in output, output[-3000:]
    assert "usage: " in output and "error: argument --" in output, output[-3000:]
    assert re.search(message, output), output[-3000:]
    assert not out.exists()


@pytest.mark.slow
def test_a_killed_balanced_search_run_resumes(tmp_path, monkeypatch):
    # The retraining records balanced=False and the recipe's lambda (the flags: --balanced,
    # no --penalty): its backup is this run's all the same, not refused before the search.
    use_tiny_builders(monkeypatch)
    out = tmp_path / "run"
    args = [*TINY_RUN, "--shuffle", "auto", "--search-epochs", "0", "--balanced"]
    args += ["--output", str(out)]
    code, output = _main("train", *args)
    assert code == 0, output[-3000:]
    settings = json.loads((out / "report.json").read_text())["settings"]
    for key in ("strategy", "replicas", "jit_compile"):
        settings.pop(key)
    (out / "report.json").unlink()
    (out / "backup").mkdir()
    (out / "backup" / "settings.json").write_text(json.dumps(settings))
    code, output = _main("train", *args)
    assert code == 0 and "Traceback" not in output, output[-3000:]


@pytest.mark.slow
def test_train_command_reruns_into_a_used_output_directory(digits_job, tmp_path, monkeypatch):
    # The digits job's finished run, copied: the reruns below must not train or write.
    use_tiny_builders(monkeypatch, repeats=DIGITS_JOB_REPEATS)  # the nets the job built
    finished, code, output = digits_job
    assert code == 0, output[-3000:]
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    args = [*DIGITS_JOB, "--output", str(out)]
    # A finished run is not overwritten (--overwrite's removal of every old file is
    # tests/test_fault_tolerance.py's).
    code, output = _main("train", *args)
    assert code != 0 and "Traceback" not in output, output[-3000:]
    assert "holds a finished run" in output and "--overwrite" in output
    assert (out / "model.keras").exists() and (out / "report.json").exists()
    # A killed run's backup (its settings kept) is not resumed with another width.
    settings = json.loads((out / "report.json").read_text())["settings"]
    for key in ("strategy", "replicas", "jit_compile"):  # how, not what, the run trains
        settings.pop(key)
    (out / "report.json").unlink()
    (out / "backup").mkdir()
    (out / "backup" / "settings.json").write_text(json.dumps(settings))
    code, output = _main("train", *args, "--width", "1.0")
    assert code != 0 and "Traceback" not in output, output[-3000:]
    assert "width=1.0 (backup: 0.5)" in output
