"""experiments.scale_study: its augmentation, one real run of each arm on a few images, and
the paired summary (the full study runs on a GPU machine, outside CI). The runs and nets
here are tiny v2s (tests/helpers.py: `use_tiny_builders`; the study's code is the same for
every net size: the 0.5x net took 50-66 s a run of CI's time, mostly tracing)."""

import argparse
import json

import keras
import numpy as np
import pytest
from helpers import use_tiny_builders

from experiments import scale_study


def test_each_crop_is_a_window_of_the_padded_image_mirrored_or_not():
    rng = np.random.default_rng(0)
    images = rng.normal(size=(64, 6, 6, 2)).astype(np.float32)
    padded = np.pad(images, ((0, 0), (2, 2), (2, 2), (0, 0)))
    crops = scale_study.pad_crop_flip(padded, np.random.default_rng(1), size=6)
    assert crops.shape == images.shape
    offsets, flips = set(), 0
    for crop, image in zip(crops, padded, strict=True):
        found = [
            (dy, dx, flip)
            for dy in range(5)
            for dx in range(5)
            for flip in (False, True)
            if np.array_equal(crop, image[dy : dy + 6, dx : dx + 6][:, :: -1 if flip else 1])
        ]
        assert found, "a crop that is no window of its padded image"
        offsets.add(found[0][:2])
        flips += found[0][2]
    assert len(offsets) > 10  # the offsets vary
    assert 16 < flips < 48  # about half mirrored


def test_the_paired_interval_is_a_t_interval_over_seeds():
    # arm - manual by seed: 0.01, 0.03, 0.02: mean 0.02, sd 0.01; t(0.975, 2) = 4.303.
    rows = [{"arm": "manual", "seed": s, "accuracy": 0.90} for s in range(4)]
    rows += [
        {"arm": "paper", "seed": s, "accuracy": 0.90 + d} for s, d in enumerate((0.01, 0.03, 0.02))
    ]
    result = scale_study.paired(rows, "paper")
    assert result["n"] == 3  # seed 3 has no paper run
    assert result["mean"] == pytest.approx(0.02)
    assert result["high"] - result["mean"] == pytest.approx(4.303 * 0.01 / np.sqrt(3), rel=1e-3)
    assert "| paper | 3 | +2.00 | -0.48 to +4.48 |" in scale_study.summary(rows)


@pytest.mark.lab
@pytest.mark.slow
@pytest.mark.skipif(
    keras.backend.backend() == "jax",
    reason="a minute of JAX compilation per net on a CPU; the JAX run was checked by hand",
)
@pytest.mark.parametrize("arm", ["paper", "search_retrain"])  # manual: the same path, less
def test_a_learned_arm_trains_and_appends_its_row(tmp_path, monkeypatch, arm):
    # A real run of a tiny v2 on 64 images (random ones: only the row's story is checked).
    # Two or three units a stage: a stage of one unit sends every channel to the stage's
    # end, as manual does, whatever its permutation (routing difference 0 for (1, 1, 1));
    # with more, a learned routing equals manual's only where every count matches by chance.
    use_tiny_builders(monkeypatch, repeats=(2, 3, 2))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 28, 28, 1)).astype(np.float32)
    y = rng.integers(0, 10, 64).astype(np.int32)
    monkeypatch.setattr(scale_study, "load_arrays", lambda _: (x, y, x[:500], y[:500]))
    path = tmp_path / "rows.jsonl"
    argv = ["--epochs", "2", "--search-epochs", "1", "--batch-size", "32", "--width", "0.5"]
    scale_study.main([*argv, "--seeds", "3", "--rows", str(path), "--worker", arm])
    (row,) = scale_study.read_rows(path)
    assert (row["arm"], row["seed"], len(row["epoch_seconds"])) == (arm, 3, 2)
    assert 0 <= row["accuracy"] <= 1
    assert 0 < row["routing_difference"] <= 1  # a learned routing, not manual's
    if arm == "paper":
        assert row["penalty_at_rounding"] > 0  # still relaxed when rounded
        assert 0 <= row["relaxed_accuracy"] <= 1
    else:
        assert len(row["search_epoch_seconds"]) == 1 and row["search_penalty"] > 0
    json.dumps(row)  # rows are plain JSON


def test_the_epochs_that_fit_follow_the_calibration_runs_timings():
    calibration = [
        {"arm": "manual", "seconds": 100.0, "epoch_seconds": [60.0, 10.0]},
        {"arm": "search_retrain", "seconds": 130.0, "epoch_seconds": [70.0, 10.0]},
    ]
    # search_retrain, 19 epochs: 130 s + (17 more + 5 more search epochs) x 12 s = 394 s;
    # 20 epochs: 130 + (18 + 5) x 12 = 406 s > 400. manual alone would fit 27.
    assert scale_study.epochs_that_fit(calibration, 400, most=100) == 19
    assert scale_study.epochs_that_fit(calibration[:1], 400, most=100) == 27
    assert scale_study.epochs_that_fit(calibration, 400, most=15) == 15
    assert scale_study.epochs_that_fit(calibration, 50, most=100) == 0
    # A slower run's last epoch (15 s) prices every run's epochs at 18 s: search_retrain,
    # 14 epochs: 130 + (12 + 4 - 1) x 18 = 400 s; 15 epochs: 130 + (13 + 4 - 1) x 18 = 418.
    slower = [*calibration, {"arm": "paper", "seconds": 110.0, "epoch_seconds": [70.0, 15.0]}]
    assert scale_study.epochs_that_fit(slower, 400, most=100) == 14


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--time-budget", "0"],
            "--time-budget must be positive seconds. Received: time_budget=0.0",
        ),
        (["--epochs", "3", "--search-epochs", "3"], "Received: search_epochs=3"),
        (["--epochs", "1"], "--epochs must be at least 2. Received: epochs=1"),
        (["--batch-size", "0"], "--batch-size must be at least 1. Received: batch_size=0"),
        (["--max-train-examples", "100"], "at least one batch (--batch-size). Received: max_train"),
        (
            ["--time-budget", "60", "--search-epochs", "2"],
            "leave it out. Received: search_epochs=2",
        ),
    ],
)
def test_bad_settings_are_refused_naming_them(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit):
        scale_study.main([*flags, "--rows", str(tmp_path / "rows.jsonl")])
    assert message in capsys.readouterr().err
    assert not (tmp_path / "rows.jsonl").exists()


def test_rows_of_other_settings_are_refused_and_finished_runs_not_redone(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    args = argparse.Namespace(
        rows=str(path),
        seeds=[0, 1],
        arms=["manual", "paper"],
        epochs=10,
        search_epochs=3,
        width=1.0,
        batch_size=512,
        learning_rate=0.2,
        penalty=0.01,
        max_train_examples=None,
    )
    row = {
        "arm": "paper",
        "seed": 1,
        "accuracy": 0.9,
        **{k: getattr(args, k) for k in scale_study.SETTINGS},
    }
    scale_study.append_row(path, row)
    assert scale_study.runs_to_do(args) == [(0, "manual"), (0, "paper"), (1, "manual")]
    scale_study.append_row(path, {**row, "seed": 0, "epochs": 20})
    with pytest.raises(SystemExit, match="rows of other settings \\(epochs=20\\)"):
        scale_study.runs_to_do(args)
    with pytest.raises(SystemExit):  # --time-budget needs a new rows file
        scale_study.main(["--time-budget", "60", "--rows", str(path)])
    assert f"Received: rows={str(path)!r}" in capsys.readouterr().err


def test_the_retrained_net_starts_from_the_manual_runs_weights(monkeypatch):
    from keras_autoshuffle import RelaxedShuffle, harden_model, shuffle_layers

    # A basic unit in stage 3 besides the down-sampling units: both kinds of shuffle.
    use_tiny_builders(monkeypatch, repeats=(1, 2, 1))
    args = argparse.Namespace(width=0.5, penalty=1e-2)
    searched = scale_study.build(3, args, "auto")
    harden_model(searched)
    permutations = {
        layer.name: list(layer.permutation)
        for layer in shuffle_layers(searched)
        if isinstance(layer, RelaxedShuffle)
    }
    manual = scale_study.build(3, args, "manual").get_weights()
    retrain = scale_study.build(3, args, "auto", shuffle_permutations=permutations).get_weights()
    assert len(manual) == len(retrain)
    for a, b in zip(manual, retrain, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.tensorflow_only(reason="keras_autoshuffle.data needs TensorFlow")
def test_the_normalisation_is_the_packages():
    from keras_autoshuffle import data

    assert (scale_study.MEAN,) == data.FASHION_MNIST_MEAN
    assert (scale_study.STD,) == data.FASHION_MNIST_STD


def test_each_epoch_draws_once_and_a_new_draw_differs():
    x = np.arange(8 * 28 * 28, dtype=np.float32).reshape(8, 28, 28, 1)
    y = np.arange(8, dtype=np.int32)
    data = scale_study.epochs_data(x, y, 4, seed=0)
    first, labels = data[0]
    assert data.epoch == 1 and first.shape == (4, 28, 28, 1)
    data.on_epoch_end()
    assert data.epoch == 2 and not np.array_equal(data[0][0], first)
    assert set(labels) <= set(y)


@pytest.mark.parametrize("line", ["not json", "[1, 2]", '{"arm": "manual"}'])
def test_a_rows_file_that_holds_no_rows_is_refused_naming_file_and_line(tmp_path, line):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"arm": "manual", "seed": 0, "accuracy": 0.9}\n' + line + "\n")
    with pytest.raises(SystemExit, match=f"{path} line 2 is not a row. Received: "):
        scale_study.read_rows(str(path))
