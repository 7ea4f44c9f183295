"""No trained epoch is lost (issue 21): atomic files, checks before training, divergence,
a distrusted backup, all-or-nothing hardening, and clear errors for hostile inputs.

The kill -9 tests of whole runs are in test_durability_kill.py; here a "killed" run is
one interrupted by an exception at the start of an epoch, which leaves the same files.
"""

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys

import h5py
import keras
import numpy as np
import pytest
from helpers import Interrupt
from keras import layers

import keras_autoshuffle as ka
from keras_autoshuffle import _atomic, data, export, training
from keras_autoshuffle.optimizers import LinearCycles
from keras_autoshuffle.training import backup as bk
from keras_autoshuffle.training import cli
from keras_autoshuffle.training import fault_tolerance as ft
from keras_autoshuffle.training.divergence import DIVERGENCE_FILE, TrainingDivergedError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tiny():
    return keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            layers.Conv2D(8, 3, strides=2, use_bias=False),
            layers.BatchNormalization(),
            ka.RelaxedShuffle(penalty=1e-2, seed=0, name="shuffle"),
            layers.ReLU(),
            layers.GlobalAveragePooling2D(),
            layers.Dense(4, activation="softmax"),
        ],
        name="tiny",
    )


def _data(test_examples=16):
    rng = np.random.default_rng(0)
    images = rng.normal(size=(48, 8, 8, 3)).astype("float32")
    labels = np.arange(48) % 4
    train = data.ArrayData(images[:32], labels[:32], 4)
    test = data.ArrayData(images[32 : 32 + test_examples], labels[32 : 32 + test_examples], 4)
    return train, test


RECIPE = training.Recipe(1e-2, (0.05,), (2,), 0.9, 1e-4, 16)


def _train(out, recipe=RECIPE, model_fn=_tiny, test_examples=16, **kwargs):
    train, test = _data(test_examples)
    kwargs = {"export": False, "verbose": 0, "seed": 1, **kwargs}
    return training.train(model_fn, train, test, recipe, str(out), **kwargs)


def _interrupted(out, epoch=1, **kwargs):
    with pytest.raises(KeyboardInterrupt):
        _train(out, callbacks=[Interrupt(epoch)], **kwargs)
    return out / ft.BACKUP


# 1. Atomic files.


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "model.keras"
    path.write_text("old")

    def half_then_fail(partial):
        with open(partial, "w") as f:
            f.write("ne")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        _atomic.write_atomically(path, half_then_fail)
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.keras"]


def test_a_folder_is_replaced_whole(tmp_path):
    # A SavedModel is a folder: the new one replaces the old, no file of the old stays.
    path = tmp_path / "saved_model"
    for files in (("a", "b"), ("c",)):

        def write(partial, files=files):
            os.makedirs(partial)
            for name in files:
                open(os.path.join(partial, name), "w").close()

        _atomic.write_atomically(path, write)
    assert sorted(p.name for p in path.iterdir()) == ["c"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved_model"]


def _backup_of(tmp_path, epochs):
    """A backup folder of `epochs` epochs written by the run's writer, with settings."""
    backup = tmp_path / "run" / ft.BACKUP
    model = _tiny()
    model.compile(optimizer="sgd", loss="mse")
    model.optimizer.build(model.trainable_variables)
    bk.save_backup(model, str(backup), epochs)
    _atomic.write_json(str(backup / ft.SETTINGS_FILE), {"epochs": 2})
    return backup


def test_a_backup_write_cut_before_its_weights_moved_resumes_the_epoch_before(tmp_path):
    backup = _backup_of(tmp_path, 1)
    (backup / "latest.partial.weights.h5").write_bytes(b"\x89HDF\r\n half a file")
    (backup / "training_metadata.partial.json").write_text('{"epoch": 2, "batch": 0, "wei')
    assert ft.prepare_run_directory(str(tmp_path / "run"), {"epochs": 2}) is True
    assert json.loads((backup / ft.METADATA_FILE).read_text())["epoch"] == 1
    assert not [p.name for p in backup.iterdir() if ".partial" in p.name]


@contextlib.contextmanager
def _tmpfs(folder, size):
    """A tmpfs of `size` bytes mounted at `folder`: a real disk that fills up (root only)."""
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)]
    if os.geteuid() != 0 or subprocess.run(mount, capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root (the file size limit case runs anywhere)")
    try:
        yield
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)


@contextlib.contextmanager
def _file_size_limit(size):
    """This process's files limited to `size` bytes: a real write failure (EFBIG)."""
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write, not the process
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


@pytest.mark.parametrize("full", ["tmpfs", "file_size_limit"])
def test_a_backup_that_runs_out_of_space_is_removed_and_named(tmp_path, full):
    size = (_backup_of(tmp_path / "measure", 1) / ft.WEIGHTS_FILE).stat().st_size
    folder = tmp_path / "disk"
    folder.mkdir()
    # tmpfs: room for one backup, not for the next beside it; else no file of half its size.
    disk = _tmpfs(folder, size + size // 2) if full == "tmpfs" else contextlib.nullcontext()
    limit = contextlib.nullcontext() if full == "tmpfs" else _file_size_limit(size // 2)
    with disk:
        backup = _backup_of(folder, 1)
        model = _tiny()
        model.compile(optimizer="sgd", loss="mse")
        model.optimizer.build(model.trainable_variables)
        with limit, pytest.raises(ft.RunDirectoryError) as error:
            bk.save_backup(model, str(backup), 2)
        reason = "No space left on device" if full == "tmpfs" else "File too large"
        assert f"backup of epoch 2 could not be written in {backup} ({reason})" in str(error.value)
        # The partial files are gone; the epoch before stays whole, for the rerun.
        names = sorted(p.name for p in backup.iterdir())
        assert names == sorted([ft.SETTINGS_FILE, ft.METADATA_FILE, ft.WEIGHTS_FILE])
        assert ft.backed_up_epochs(str(backup), 2) == 1


def test_a_first_backup_write_cut_before_its_weights_moved_starts_over(tmp_path):
    backup = tmp_path / "run" / ft.BACKUP
    backup.mkdir(parents=True)
    (backup / ft.SETTINGS_FILE).write_text('{"epochs": 2}')
    (backup / "latest.partial.weights.h5").write_bytes(b"\x89HDF\r\n half a file")
    (backup / "training_metadata.partial.json").write_text('{"epoch": 1, "batch": 0}')
    assert ft.prepare_run_directory(str(tmp_path / "run"), {"epochs": 2}) is False
    assert sorted(p.name for p in backup.iterdir()) == [ft.SETTINGS_FILE]


def test_a_backup_metadata_that_does_not_describe_its_weights_is_refused(tmp_path):
    backup = _backup_of(tmp_path, 1)
    metadata = json.loads((backup / ft.METADATA_FILE).read_text())
    metadata.update(epoch=2, weights_sha256="0" * 64)
    (backup / "training_metadata.partial.json").write_text(json.dumps(metadata))
    path = re.escape(str(backup / "training_metadata.partial.json"))
    with pytest.raises(ft.RunDirectoryError, match=f"{path} is damaged: not the metadata of"):
        ft.prepare_run_directory(str(tmp_path / "run"), {"epochs": 2})


def test_a_fresh_start_removes_the_files_of_a_run_that_died_before_its_first_backup(tmp_path):
    out = tmp_path / "run"
    for folder in ("saved_model/variables", "logs/train", "backup"):
        (out / folder).mkdir(parents=True)
    for name in ("model.tflite", "history.csv", "model.partial.keras", "notes.txt"):
        (out / name).write_text("x")
    (out / "backup" / ft.SETTINGS_FILE).write_text('{"epochs": 2}')
    assert ft.prepare_run_directory(str(out), {"epochs": 2}) is False
    assert sorted(p.name for p in out.iterdir()) == ["backup", "notes.txt"]
    assert json.loads((out / "backup" / ft.SETTINGS_FILE).read_text()) == {"epochs": 2}


def test_a_finished_run_with_its_backup_left_is_refused_and_cleaned(tmp_path):
    # Killed after report.json, its last file, before the backup was removed.
    backup = _backup_of(tmp_path, 2)
    (tmp_path / "run" / "report.json").write_text("{}")
    with pytest.raises(ft.RunDirectoryError, match="holds a finished run"):
        ft.prepare_run_directory(str(tmp_path / "run"), {"epochs": 2})
    assert not backup.exists()


# 2. Checks before training.


def test_litert_with_mixed_precision_is_refused_before_training(tmp_path):
    # bfloat16 layers convert to Flex ops the LiteRT interpreter lacks.
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=r"litert: a model computing in bfloat16.*export="):
        _train(out, mixed_precision=True, export=("saved_model", "litert"))
    assert not out.exists()


def test_litert_with_mixed_precision_is_left_out_when_not_asked_for(tmp_path):
    recipe = training.Recipe(1e-2, (0.05,), (1,), 0.9, 1e-4, 16)
    with pytest.warns(UserWarning, match="will not export litert"):
        report = _train(tmp_path / "run", recipe=recipe, mixed_precision=True, export=True)
    assert "bfloat16" in report["export_skipped"]["litert"]
    assert set(report["export"]) == {"keras", "saved_model"}
    assert not (tmp_path / "run" / "model.tflite").exists()
    assert "litert: not exported" in cli.format_run_summary(report)


JAX_CHILD = r"""
import sys
from keras_autoshuffle.commands.train import main
main(sys.argv[1:])
"""


def test_the_cli_on_jax_refuses_litert_before_training(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(JAX_CHILD)
    out = tmp_path / "run"
    args = [sys.executable, str(script), "--dataset", "digits", "--epochs", "1"]
    args += ["--max-train-examples", "64", "--export-formats", "saved_model,litert"]
    # PYTHONPATH: the child imports this checkout's package, not another install's.
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}
    result = subprocess.run(
        [*args, "--output", str(out)], env=env, capture_output=True, timeout=240
    )
    output = (result.stdout + result.stderr).decode(errors="replace")
    assert result.returncode == 1, output[-3000:]
    assert "LiteRT export needs Keras's TensorFlow backend" in output
    assert not out.exists()  # refused before anything was written


def test_an_output_folder_that_is_a_file_is_refused_before_training(tmp_path):
    (tmp_path / "run").write_text("a file")
    with pytest.raises(ft.RunDirectoryError, match="is a file. Received: output_dir="):
        _train(tmp_path / "run", callbacks=[Interrupt(0)])
    with pytest.raises(ft.RunDirectoryError, match="cannot be used.*Received: output_dir="):
        _train(tmp_path / "run" / "inside", callbacks=[Interrupt(0)])


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_output_folder_is_refused_before_training(tmp_path):
    (tmp_path / "locked").mkdir(mode=0o500)
    with pytest.raises(ft.RunDirectoryError, match="cannot be used"):
        _train(tmp_path / "locked" / "run", callbacks=[Interrupt(0)])


def test_empty_test_data_is_refused_before_training(tmp_path):
    with pytest.raises(ValueError, match="`test_data` holds no examples"):
        _train(tmp_path / "run", test_examples=0)
    assert not (tmp_path / "run").exists()


def test_a_model_that_cannot_be_saved_is_refused_before_training(tmp_path):
    def with_lambda():
        model = _tiny()
        return keras.Sequential([model, layers.Lambda(lambda x: x * 1.0)])

    with pytest.raises(ValueError, match="cannot be saved and loaded as a .keras file"):
        _train(tmp_path / "run", model_fn=with_lambda)
    assert not (tmp_path / "run").exists()


# 3. Divergence.


def test_a_diverged_run_stops_naming_the_epoch_and_resumes_with_a_lower_rate(tmp_path):
    out = tmp_path / "run"
    absurd = training.Recipe(1e-2, (0.05, 1e30), (1, 1), 0.9, 1e-4, 16)
    with pytest.raises(TrainingDivergedError, match=r"in epoch 2: non-finite .*lower learning"):
        _train(out, recipe=absurd)
    # The epoch that diverged was not backed up, logged or reported.
    assert json.loads((out / ft.BACKUP / ft.METADATA_FILE).read_text())["epoch"] == 1
    assert (out / "history.csv").read_text().count("\n") == 2
    assert not (out / "report.json").exists()
    # Another change than the learning rate would mix two runs.
    other = training.Recipe(2e-2, (0.05, 0.05), (1, 1), 0.9, 1e-4, 16)
    with pytest.raises(ft.RunDirectoryError, match="penalty=0.02"):
        _train(out, recipe=other)
    calm = training.Recipe(1e-2, (0.05, 0.05), (1, 1), 0.9, 1e-4, 16)
    report = _train(out, recipe=calm)
    assert report["resumed_after_divergence"]["epoch"] == 2
    assert tuple(report["settings"]["learning_rates"]) == (0.05, 0.05)
    assert np.isfinite(report["relaxed_loss"])
    assert [row.split(",")[0] for row in (out / "history.csv").read_text().split()[1:]] == [
        "0",
        "1",
    ]


class StepsBegun(keras.callbacks.Callback):
    """The (epoch, step) of every training step begun."""

    def __init__(self):
        super().__init__()
        self.epoch, self.steps = 0, []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.steps.append((self.epoch, batch))


@pytest.mark.parametrize("loop", ["fit", "multi_worker"])
def test_a_loss_turning_nan_stops_the_run_in_that_step(tmp_path, monkeypatch, loop):
    # lr 1e30: step 1 (the first) is finite, its update makes step 2's loss NaN; 4 steps
    # an epoch, so an end-of-epoch check would have run steps 3 and 4 first.
    if loop == "multi_worker":  # the hand-written loop, on this process's one device
        monkeypatch.setattr(training.distribution, "is_multi_worker", lambda strategy: True)
    out = tmp_path / "run"
    absurd = training.Recipe(1e-2, (1e30,), (2,), 0.9, 1e-4, 8)
    begun = StepsBegun()
    with pytest.raises(
        TrainingDivergedError, match=r"in epoch 1: non-finite loss at step 2\. .*start over"
    ):
        _train(out, recipe=absurd, callbacks=[begun], strategy="one-device")
    assert begun.steps == [(0, 0), (0, 1)]
    record = json.loads((out / ft.BACKUP / DIVERGENCE_FILE).read_text())
    assert (record["epoch"], record["step"], record["non_finite"]) == (1, 2, ["loss"])
    assert not (out / "history.csv").exists() and not (out / "report.json").exists()
    # The rerun with a lower learning rate is accepted (nothing was backed up: it starts
    # over) and finishes.
    report = _train(out, recipe=training.Recipe(1e-2, (0.05,), (2,), 0.9, 1e-4, 8))
    assert tuple(report["settings"]["learning_rates"]) == (0.05,)
    assert np.isfinite(report["relaxed_loss"])


# 4. A resume trusts nothing in the backup folder.


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A run stopped at the start of its second epoch: its backup holds epoch 1."""
    keras.backend.clear_session()
    out = tmp_path_factory.mktemp("interrupted") / "run"
    _interrupted(out)
    return out


def _set_hash(backup):
    metadata = json.loads((backup / ft.METADATA_FILE).read_text())
    metadata["weights_sha256"] = bk.sha256(backup / ft.WEIGHTS_FILE)
    (backup / ft.METADATA_FILE).write_text(json.dumps(metadata))


def _empty_weights(backup):
    h5py.File(backup / ft.WEIGHTS_FILE, "w").close()
    _set_hash(backup)


def _nan_weights(backup):
    with h5py.File(backup / ft.WEIGHTS_FILE, "r+") as f:
        arrays = []
        f.visititems(lambda n, x: arrays.append(x) if isinstance(x, h5py.Dataset) else None)
        kernel = next(x for x in arrays if x.dtype.kind == "f" and x.ndim == 4)
        kernel[0, 0, 0, 0] = np.nan
    _set_hash(backup)


def _write(name, value):
    def damage(backup):
        (backup / name).write_text(value if isinstance(value, str) else json.dumps(value))

    return damage


def _metadata(**changes):
    def damage(backup):
        metadata = json.loads((backup / ft.METADATA_FILE).read_text())
        (backup / ft.METADATA_FILE).write_text(json.dumps({**metadata, **changes}))

    return damage


HARDENING = {"epoch": None, "layers": [{"name": "shuffle", "permutation": [1, 0, 2, 3]}]}
DAMAGED = {
    "settings_a_list": (_write(ft.SETTINGS_FILE, [1, 2]), "run settings", "not an object"),
    "settings_missing": (
        lambda b: (b / ft.SETTINGS_FILE).unlink(),
        "no record of the settings",
        "",
    ),
    "epoch_past_the_schedule": (_metadata(epoch=5), "backup metadata", r"\[1, 2\]"),
    "epoch_a_boolean": (_metadata(epoch=True), "backup metadata", r"\[1, 2\]"),
    "weights_not_described": (_empty_weights, "backup weights", "not this model's"),
    "weights_replaced": (
        lambda b: h5py.File(b / ft.WEIGHTS_FILE, "w").close(),
        "backup weights",
        "not the file its metadata",
    ),
    "weights_not_finite": (_nan_weights, "backup weights", "non-finite values"),
    "steps_not_the_epochs": (_metadata(epoch=2, weights_sha256=None), "backup weights", "steps"),
    "hardening_a_list": (_write(ft.HARDENING_FILE, []), "hardening record", "not an object"),
    "hardening_boolean_permutation": (
        _write(ft.HARDENING_FILE, {**HARDENING, "epoch": 1, "layers": [{"name": "s"}]}),
        "hardening record",
        "permutation",
    ),
    "hardening_of_another_schedule": (
        _write(ft.HARDENING_FILE, {**HARDENING, "epoch": 1}),
        "hardening record",
        "harden_at_epoch=1",
    ),
    "hardening_before_the_end": (
        _write(ft.HARDENING_FILE, HARDENING),
        "hardening record",
        "before the last epoch",
    ),
    "divergence_a_string": (_write(DIVERGENCE_FILE, '"nan"'), "divergence record", "object"),
    "divergence_step_zero": (
        _write(DIVERGENCE_FILE, {"epoch": 1, "step": 0, "learning_rates": [0.1]}),
        "divergence record",
        "'step' must be an integer >= 1",
    ),
}


@pytest.mark.parametrize("damage", DAMAGED.values(), ids=DAMAGED.keys())
def test_every_file_of_a_backup_is_checked_before_a_resume(tmp_path, interrupted, damage):
    damage, what, problem = damage
    out = tmp_path / "run"
    shutil.copytree(interrupted, out)
    damage(out / ft.BACKUP)
    with pytest.raises(ft.RunDirectoryError, match=f"{what}.*{problem}.*Received"):
        _train(out, callbacks=[Interrupt(1)])


def test_an_undamaged_copy_resumes(tmp_path, interrupted):
    # The damaged cases above fail for their damage, not for being a copy.
    out = tmp_path / "run"
    shutil.copytree(interrupted, out)
    with pytest.raises(KeyboardInterrupt):  # resumed at epoch 1 (0-based), not 0
        _train(out, callbacks=[Interrupt(1)])


# 5. harden_model is all-or-nothing.


def _two_shuffles(fit=True):
    model = keras.Sequential(
        [
            keras.Input((4, 4, 6)),
            layers.Conv2D(6, 1),
            ka.RelaxedShuffle(seed=1, name="first"),
            layers.Conv2D(6, 1),
            ka.RelaxedShuffle(seed=2, name="second"),
            layers.GlobalAveragePooling2D(),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    x = np.random.default_rng(0).normal(size=(8, 4, 4, 6)).astype("float32")
    if fit:
        model.fit(x, np.zeros((8, 6)), epochs=1, verbose=0)
    return model, x


GOOD = [5, 4, 3, 2, 1, 0]
BAD_PERMUTATIONS = {
    "a_boolean": ({"first": GOOD, "second": [True, False, True, False, True, False]}, "integers"),
    "too_short": ({"first": GOOD, "second": [0, 1]}, "6 entries"),
    "a_fraction": ({"first": GOOD, "second": [0.5, 1, 2, 3, 4, 5]}, "integers"),
    "unknown_name": ({"first": GOOD, "second": GOOD, "third": GOOD}, "unknown"),
    "one_missing": ({"first": GOOD}, r"missing \['second'\]"),
}


@pytest.mark.parametrize("bad", BAD_PERMUTATIONS.values(), ids=BAD_PERMUTATIONS.keys())
def test_a_bad_permutation_hardens_nothing(bad):
    permutations, message = bad
    model, x = _two_shuffles(fit=False)
    before = model.predict(x, verbose=0)
    with pytest.raises(ValueError, match=message):
        ka.harden_model(model, permutations=permutations)
    assert not any(layer.is_hardened for layer in ka.shuffle_layers(model))
    np.testing.assert_array_equal(model.predict(x, verbose=0), before)


def test_a_non_finite_matrix_hardens_nothing_and_training_goes_on(tmp_path):
    model, x = _two_shuffles()
    model.get_layer("second").matrix.assign(np.full((6, 6), np.nan))
    variables = len(model.optimizer.variables)
    with pytest.raises(ValueError, match="shuffle 'second' holds non-finite.*nothing was hardened"):
        ka.harden_model(model)
    assert not model.get_layer("first").is_hardened
    assert len(model.optimizer.variables) == variables
    model.get_layer("second").matrix.assign(np.eye(6))
    model.fit(x, np.zeros((8, 6)), epochs=1, verbose=0)  # the compiled step still fits
    report = ka.harden_model(model, permutations={"first": GOOD, "second": list(range(6))})
    assert [entry["permutation"] for entry in report] == [GOOD, list(range(6))]
    assert model.get_layer("first").permutation.tolist() == GOOD
    model.fit(x, np.zeros((8, 6)), epochs=1, verbose=0)  # and after the hardening


# 7. Errors naming the argument or file and the value received.


@pytest.mark.parametrize("seed", [-1, 2**32, True, 1.5])
def test_an_out_of_range_seed_is_refused(tmp_path, seed):
    with pytest.raises(ValueError, match=re.escape(f"Received: seed={seed!r}")):
        _train(tmp_path / "run", seed=seed)


def test_the_cli_checks_seeds_and_export_formats():
    parser = training.add_arguments(argparse.ArgumentParser(), ("digits",), "digits")
    assert parser.parse_args(["--output", "o", "--seed", "7"]).seed == 7
    for bad in (["--seed", "-1"], ["--seed", "4294967296"], ["--export-formats", "coreml"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["--output", "o", *bad])
    args = parser.parse_args(["--output", "o", "--export-formats", "saved_model,litert"])
    assert args.export_formats == ("saved_model", "litert")
    args = parser.parse_args(["--output", "o", "--export-formats", "onnx", "openvino,litert"])
    assert args.export_formats == ("onnx", "openvino", "litert")


def test_export_refuses_non_finite_samples_and_a_file_as_folder(tmp_path):
    inputs = keras.Input((4,))
    model = keras.Model(inputs, layers.Dense(2)(inputs))
    x = np.ones((2, 4), "float32")
    x[1, 2] = np.nan
    with pytest.raises(ValueError, match="`sample_inputs` must hold only finite.*Received: 1"):
        export.export_model(model, str(tmp_path), x, formats=("keras",))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="must be a folder.*Received: output_dir="):
        export.export_model(model, str(tmp_path / "file"), x[:1], formats=("keras",))


def test_relaxed_shuffle_refuses_no_channels_and_boolean_or_matrix_permutations():
    with pytest.raises(ValueError, match="at least one channel. Received: input_shape"):
        ka.RelaxedShuffle().build((None, 2, 2, 0))
    with pytest.raises(ValueError, match="integers 0..n-1. Received: permutation=\\[True"):
        ka.RelaxedShuffle(permutation=[True, False])
    layer = ka.RelaxedShuffle()
    layer.build((None, 2, 2, 2))
    for bad in ([True, False], np.eye(2, dtype="int32"), "01"):
        with pytest.raises(ValueError, match="Received: permutation="):
            layer.harden(bad)
    assert not layer.is_hardened
    assert layer.harden(np.array([1.0, 0.0])).tolist() == [1, 0]


@pytest.mark.parametrize(
    ("rates", "steps"), [([-0.1], [10]), ([float("nan")], [10]), ([np.inf], [10]), ([0.1], [0])]
)
def test_the_schedule_refuses_bad_learning_rates(rates, steps):
    with pytest.raises(ValueError, match="Received: (learning_rates|cycle_steps)="):
        LinearCycles(rates, steps)


@pytest.mark.parametrize(
    "changes",
    [
        {"learning_rates": (-0.1,)},
        {"learning_rates": (float("nan"),)},
        {"momentum": 1.5},
        {"weight_decay": -1e-4},
        {"cycle_epochs": (0,)},
        {"batch_size": 0},
        {"penalty": float("inf")},
    ],
    ids=lambda c: next(iter(c)),
)
def test_a_recipe_refuses_bad_values(changes):
    key = next(iter(changes))
    with pytest.raises(ValueError, match=f"Received: {key}="):
        training.Recipe(**{**vars(RECIPE), **changes})


def test_an_atomic_write_beside_a_named_pipe_neither_blocks_nor_reads_its_neighbours(tmp_path):
    # After the move only the parent folder's entry is flushed: flushing every file beside
    # the written one opened the pipe for reading, which blocks until a writer comes.
    import threading

    os.mkfifo(tmp_path / "pipe")
    done = []
    thread = threading.Thread(
        target=lambda: done.append(_atomic.write_json(str(tmp_path / "row.json"), {"a": 1})),
        daemon=True,
    )
    thread.start()
    thread.join(timeout=30)
    assert done, "write_json blocked on a named pipe beside its file"
    assert json.loads((tmp_path / "row.json").read_text()) == {"a": 1}
