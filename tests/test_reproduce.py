"""Smoke test of `python -m experiments.reproduce`'s quick path with tiny settings.

The script's `main(argv)` runs in the test process on tiny nets (tests/helpers.py: the
real ones took 60-130 s per run, mostly tracing); a second invocation with two jobs reads
every finished run back through worker processes.
"""

import dataclasses
import json
import os
import re

import keras
import numpy as np
import pytest
from helpers import use_tiny_builders

from experiments import paper, reproduce, runs
from keras_autoshuffle import data

# The first 320 of the 360 digits test images: whole batches of the quick path's 64, so no
# evaluation is traced again for a last partial batch (13 CPU-s of the 6 trainings).
TEST_IMAGES = 320


def _digits_test(load):
    """`data.load` with the test split cut to `TEST_IMAGES`."""

    def cut(*args, **kwargs):
        train, test = load(*args, **kwargs)
        return train, test.subset(TEST_IMAGES)

    return cut


@pytest.mark.lab
@pytest.mark.slow
def test_quick_path_writes_report_json_and_pictures(tmp_path, monkeypatch):
    use_tiny_builders(monkeypatch)
    monkeypatch.setattr(data, "load", _digits_test(data.load))
    monkeypatch.setattr(runs, "_SPLITS", {})  # none loaded before the cut, none kept after
    out = tmp_path / "report"
    argv = [
        "--quick",
        "--output", str(out),
        "--epochs", "2",
        "--lambdas", "0", "0.05",
        "--harden-at-epoch", "1",
        "--max-train-examples", "128",
    ]  # fmt: skip
    reproduce.main(argv)

    for name in ("report.md", "results.json", "pmat.png", "smat.png", "penaltyplot.png",
                 "roundplot.png"):  # fmt: skip
        assert (out / name).stat().st_size > 0, name
    results = json.loads((out / "results.json").read_text())
    assert [row["lambda"] for row in results["lambda_sweep"]] == [0.0, 0.05]
    for row in results["lambda_sweep"]:
        assert set(row) >= {"lambda", "relaxed_accuracy", "rounded_accuracy", "penalty"}
    assert {(r["model"], r["shuffle"]) for r in results["comparison"]} == {
        ("v1", "manual"), ("v1", "auto"), ("v2", "manual"), ("v2", "auto"),
    }  # fmt: skip
    report = (out / "report.md").read_text()
    for name in results["figures"].values():
        assert f"({name})" in report

    # The rounded accuracy in the JSON, recomputed from the saved hardened model with an
    # independent argmax over its predictions.
    _, test = data.digits(seed=0)
    test = test.subset(TEST_IMAGES)
    images = np.concatenate([x.numpy() for x, _ in test.eval_dataset(100)])
    labels = np.concatenate([y.numpy() for _, y in test.eval_dataset(100)])
    accuracies = {}  # by file: the comparison repeats the sweep's row of the penalty
    for row in results["lambda_sweep"] + results["comparison"]:
        # The row's path: absolute, or relative to the output folder.
        path = os.path.join(out, row["model_path"])
        if path not in accuracies:
            model = keras.saving.load_model(path, safe_mode=True)
            relaxed = [x.name for x in model.layers if getattr(x, "is_hardened", True) is False]
            assert not relaxed, f"the saved model must be hardened: {relaxed}"
            # A plain call, not `predict` (which traces a function per model).
            outputs = keras.ops.convert_to_numpy(model(images, training=False))
            accuracies[path] = float(np.mean(np.argmax(outputs, -1) == labels))
        assert accuracies[path] == pytest.approx(row["rounded_accuracy"], abs=1e-6)

    # The process pool path: every row comes back from a worker process (the finished
    # runs are read back, none trained again), the same rows as before.
    models = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/model.keras")}
    assert len(models) == 6
    reproduce.main([*argv, "--jobs", "2"])
    assert {p: p.stat().st_mtime_ns for p in out.glob("runs/*/model.keras")} == models
    again = json.loads((out / "results.json").read_text())
    for key in ("lambda_sweep", "comparison", "early_hardening"):
        assert again[key] == results[key], key


def test_settings_are_validated():
    with pytest.raises(ValueError, match="Received: jobs=0"):
        paper.reproduce(paper.quick(), "unused", jobs=0)
    with pytest.raises(ValueError, match="Received: lambdas"):
        paper.Settings(lambdas=(0.0, 1e-3))  # the default penalty 5e-2 is missing
    with pytest.raises(ValueError, match="Received: harden_at_epoch=10"):
        paper.Settings(harden_at_epoch=10)


def _main_exit(capsys, *argv):
    """reproduce.main(argv)'s exit: (status, what it printed or exited with)."""
    with pytest.raises(SystemExit) as exit:
        reproduce.main(list(argv))
    printed = capsys.readouterr()
    code = exit.value.code
    if isinstance(code, str):  # sys.exit("error: ..."): printed, status 1
        return 1, printed.out + printed.err + code
    return code, printed.out + printed.err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--study", "fashion_mnist", "--seeds", "-1"], r"Received: seeds=\(-1,\)"),
        (["--study", "fashion_mnist", "--arms", "bogus"], r"Received: arms=\('bogus',\)"),
        (["--study", "fashion_mnist", "--lambdas", "nan"], "Received: lambdas=nan"),
        (["--quick", "--lambdas", "nan"], "Received: lambdas=nan"),
        (["--quick", "--epochs", "3", "--harden-at-epoch", "3"], "Received: harden_at_epoch=3"),
        (["--study", "fashion_mnist", "--penalty", "0.02"], "`penalty` must be one of the swept"),
    ],
)
def test_invalid_values_end_as_argparse_errors(tmp_path, capsys, argv, message):
    code, output = _main_exit(capsys, *argv, "--output", str(tmp_path / "out"))
    assert code == 2 and "Traceback" not in output and "usage: " in output, output
    assert re.search(message, output), output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("mode", [["--quick"], ["--study", "fashion_mnist", "--report-only"]])
def test_jobs_beyond_the_cpus_end_as_argparse_errors(tmp_path, capsys, mode):
    jobs = (os.cpu_count() or 1) + 1
    code, output = _main_exit(capsys, *mode, "--jobs", str(jobs), "--output", str(tmp_path / "o"))
    assert code == 2 and "Traceback" not in output and "usage: " in output, output
    assert f"Received: --jobs {jobs}" in output, output
    assert not (tmp_path / "o").exists()


def test_flags_against_a_recorded_study_name_the_difference(tmp_path, capsys):
    from experiments import study

    out = tmp_path / "study"
    out.mkdir()
    (out / "results.json").write_text(
        json.dumps({"settings": dataclasses.asdict(study.StudySettings())})
    )
    before = (out / "results.json").read_text()
    # --epochs 5 contradicts the recorded epochs (not the harden_at_epoch it implies).
    for flag, value, recorded in (("--epochs", "5", "10"), ("--penalty", "0.02", "0.01")):
        code, output = _main_exit(
            capsys, "--study", "fashion_mnist", flag, value, "--output", str(out)
        )
        assert code == 2 and "holds a study run with other settings" in output, output
        name = flag[2:]
        assert f"{name}={value} (recorded: {recorded})" in output, output
        assert "harden_at_epoch" not in output and "must include 0" not in output
    # A damaged record is named, without a traceback.
    (out / "results.json").write_text(before[:50])
    code, output = _main_exit(capsys, "--study", "fashion_mnist", "--output", str(out))
    assert code == 1 and f"{out / 'results.json'} is damaged" in output, output
