"""Run-directory safety: finished runs, killed runs with other settings, damaged backups."""

import dataclasses
import json
import os
import re

import keras
import numpy as np
import pytest

from keras_autoshuffle import HardenShuffles, RelaxedShuffle, _atomic
from keras_autoshuffle.training import backup as bk
from keras_autoshuffle.training import fault_tolerance as ft
from keras_autoshuffle.training.fault_tolerance import RunDirectoryError, prepare_run_directory

SETTINGS = {"dataset": "digits", "shuffle": "auto", "epochs": 2, "penalty": 0.05}


def _killed_run(output_dir, settings=SETTINGS, epoch=1):
    """The backup a run killed after `epoch` epochs leaves behind (settings, metadata, weights)."""
    backup = output_dir / ft.BACKUP
    backup.mkdir(parents=True)
    (backup / ft.SETTINGS_FILE).write_text(json.dumps(settings))
    (backup / ft.METADATA_FILE).write_text(json.dumps({"epoch": epoch, "batch": -1}))
    inputs = keras.Input((4,))
    keras.Model(inputs, inputs).save_weights(backup / ft.WEIGHTS_FILE)
    return backup


def _finished_run(output_dir):
    output_dir.mkdir(parents=True)
    for name in ("report.json", "model.keras", "best.keras", "history.csv", "model.tflite"):
        (output_dir / name).write_text("{}")
    for folder in ("saved_model/variables", "logs/train"):
        (output_dir / folder).mkdir(parents=True)
        (output_dir / folder / "file").write_text("x")
    (output_dir / "notes.txt").write_text("the user's own file")


def test_a_fresh_directory_starts_a_run(tmp_path):
    assert prepare_run_directory(str(tmp_path / "run"), SETTINGS) is False
    saved = json.loads((tmp_path / "run" / ft.BACKUP / ft.SETTINGS_FILE).read_text())
    assert saved == SETTINGS


def test_a_finished_run_is_not_overwritten(tmp_path):
    out = tmp_path / "run"
    _finished_run(out)
    with pytest.raises(RunDirectoryError, match="holds a finished run.*--overwrite"):
        prepare_run_directory(str(out), SETTINGS)
    assert (out / "model.tflite").exists() and (out / "saved_model").exists()


def test_overwrite_removes_every_file_of_the_old_run(tmp_path):
    out = tmp_path / "run"
    _finished_run(out)
    assert prepare_run_directory(str(out), SETTINGS, overwrite=True) is False
    # No stale SavedModel or LiteRT file stays beside the new run's files.
    assert sorted(p.name for p in out.iterdir()) == ["backup", "notes.txt"]


def test_overwrite_and_resume_remove_the_int8_file_and_overwrite_the_search(tmp_path):
    # An earlier --int8 run's file would not match the new float files; a finished run's
    # search/ belongs to it (a new search must not reuse its permutations).
    out = tmp_path / "run"
    _finished_run(out)
    (out / "model_int8.tflite").write_text("old")
    (out / "model.onnx").write_text("old")  # an earlier --export-formats onnx openvino run
    (out / "openvino").mkdir()
    (out / "search").mkdir()
    (out / "search" / "permutations.json").write_text("{}")
    prepare_run_directory(str(out), SETTINGS, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["backup", "notes.txt"]
    # Resumed, a run remakes its products: a killed --int8 run's old int8 file goes.
    out = tmp_path / "killed"
    _killed_run(out)
    (out / "model_int8.tflite").write_text("old")
    (out / "model.onnx").write_text("old")
    assert prepare_run_directory(str(out), SETTINGS) is True
    assert not (out / "model_int8.tflite").exists() and not (out / "model.onnx").exists()
    # A run killed before its first backup keeps its search (search.py checks it).
    out = tmp_path / "searched"
    (out / "search").mkdir(parents=True)
    (out / "model_int8.tflite").write_text("old")
    assert prepare_run_directory(str(out), SETTINGS) is False
    assert sorted(p.name for p in out.iterdir()) == ["backup", "search"]


def test_a_killed_run_resumes_with_the_same_settings(tmp_path):
    out = tmp_path / "run"
    _killed_run(out)
    assert prepare_run_directory(str(out), SETTINGS) is True


def test_a_killed_run_with_other_settings_is_refused_naming_them(tmp_path):
    out = tmp_path / "run"
    _killed_run(out)
    other = {**SETTINGS, "shuffle": "manual", "penalty": 0.1}
    expected = "Received: penalty=0.1 (backup: 0.05), shuffle='manual' (backup: 'auto')"
    with pytest.raises(RunDirectoryError, match=re.escape(expected)):
        prepare_run_directory(str(out), other)
    # --overwrite replaces finished runs only: a killed run's backup is never mixed.
    with pytest.raises(RunDirectoryError, match="other settings"):
        prepare_run_directory(str(out), other, overwrite=True)
    assert json.loads((out / ft.BACKUP / ft.SETTINGS_FILE).read_text()) == SETTINGS


def test_a_truncated_weights_backup_is_named(tmp_path):
    out = tmp_path / "run"
    backup = _killed_run(out)
    inputs = keras.Input((4,))
    keras.Model(inputs, keras.layers.Dense(3)(inputs)).save_weights(backup / ft.WEIGHTS_FILE)
    data = (backup / ft.WEIGHTS_FILE).read_bytes()
    (backup / ft.WEIGHTS_FILE).write_bytes(data[: len(data) // 2])
    path = re.escape(str(backup / ft.WEIGHTS_FILE))
    with pytest.raises(RunDirectoryError, match=f"backup weights file {path} is damaged"):
        prepare_run_directory(str(out), SETTINGS)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        (ft.METADATA_FILE, '{"epoch": 1, "bat', "backup metadata file"),
        (ft.METADATA_FILE, '{"batch": 3}', "backup metadata file"),
        (ft.METADATA_FILE, '{"epoch": -2}', "backup metadata file"),
        (ft.SETTINGS_FILE, "[1, 2", "run settings file"),
        (ft.HARDENING_FILE, "{", "hardening record file"),
        (ft.ELAPSED_FILE, '{"seconds": 1', "elapsed time file"),
        (ft.ELAPSED_FILE, '{"seconds": NaN}', "elapsed time file"),
        (ft.ELAPSED_FILE, '{"seconds": -5}', "elapsed time file"),
        (ft.ELAPSED_FILE, "[3]", "elapsed time file"),
        (ft.ELAPSED_FILE, '{"seconds": 1%s}' % ("0" * 400), "elapsed time file"),
    ],
    ids=[
        "truncated_metadata",
        "metadata_without_epoch",
        "negative_epoch",
        "settings",
        "hardening",
        "truncated_elapsed",
        "nan_elapsed",
        "negative_elapsed",
        "elapsed_not_a_dict",
        "elapsed_past_the_float_range",
    ],
)
def test_a_broken_backup_file_is_named(tmp_path, name, content, message):
    out = tmp_path / "run"
    backup = _killed_run(out)
    (backup / name).write_text(content)
    path = re.escape(str(backup / name))
    with pytest.raises(RunDirectoryError, match=f"{message} {path} is damaged"):
        prepare_run_directory(str(out), SETTINGS)


def _shuffle_model():
    inputs = keras.Input((4,))
    model = keras.Model(inputs, RelaxedShuffle(seed=0, name="shuffle")(inputs))
    model.compile(optimizer="sgd", loss="mse")
    return model


X = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
Y = np.arange(16) % 4


class _Kill(keras.callbacks.Callback):
    """Stops the fit after epoch `epoch`'s backup, as a kill would (nothing after it runs)."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.epoch:
            raise KeyboardInterrupt


def _hardened_fit(backup, kill_after=None):
    """Three epochs of a tiny net hardened after the first, with a run's hardening, record
    and backup callbacks (as `train()` orders them); returns (model, hardening report)."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    x = RelaxedShuffle(seed=0, name="shuffle")(keras.layers.Dense(4)(inputs))
    model = keras.Model(inputs, keras.layers.Softmax()(x))
    model.compile(
        optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    hardening = HardenShuffles(validation_data=(X, Y), at_epoch=1, verbose=0)
    callbacks = [hardening, ft.HardeningRecord(backup, hardening), bk.RunBackup(backup)]
    callbacks += [_Kill(kill_after)] if kill_after else []
    model.fit(X, Y, batch_size=8, epochs=3, shuffle=False, callbacks=callbacks, verbose=0)
    return model, hardening.report


def test_a_run_killed_after_its_hardening_resumes_as_an_uninterrupted_one(tmp_path):
    # The backup of epoch 2 holds the hardened net: loaded into the fresh relaxed model,
    # its weights harden the shuffle and restore the optimizer's momentum; the record
    # gives only the report, measured on the relaxed net before rounding.
    whole, whole_report = _hardened_fit(str(tmp_path / "whole"))
    backup = tmp_path / "killed"
    with pytest.raises(KeyboardInterrupt):
        _hardened_fit(str(backup), kill_after=2)
    assert ft.backed_up_epochs(str(backup)) == 2 and (backup / ft.HARDENING_FILE).exists()
    resumed, report = _hardened_fit(str(backup))
    assert report == whole_report and report["epoch"] == 1
    shuffle = resumed.get_layer("shuffle")
    np.testing.assert_array_equal(shuffle.permutation, whole.get_layer("shuffle").permutation)
    # Dense's kernel and bias; under JAX the fit fails unless the optimizer forgets the
    # matrix the load hardened away too (`hardening.harden.after_hardening`).
    assert shuffle.is_hardened and len(resumed.trainable_variables) == 2
    for a, b in zip(resumed.get_weights(), whole.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


def test_a_hardening_record_not_of_the_backups_weights_is_named(tmp_path):
    backup = tmp_path / "killed"
    with pytest.raises(KeyboardInterrupt):
        _hardened_fit(str(backup), kill_after=2)
    report = json.loads((backup / ft.HARDENING_FILE).read_text())
    report["layers"][0]["permutation"] = report["layers"][0]["permutation"][::-1]
    (backup / ft.HARDENING_FILE).write_text(json.dumps(report))
    with pytest.raises(RunDirectoryError, match="not the hardening of the backup's weights"):
        _hardened_fit(str(backup))


def test_hardening_record_ahead_of_the_backup_is_ignored(tmp_path):
    # Written just before a kill, before the backup of that epoch: harden again on time,
    # and record that hardening (which may pick other permutations, e.g. balanced under a
    # time limit), not keep the stale record that a later resume would check.
    backup = _killed_run(tmp_path / "run", epoch=1)
    report = {"epoch": 2, "layers": [{"name": "shuffle", "permutation": [2, 0, 3, 1]}]}
    _atomic.write_json(str(backup / ft.HARDENING_FILE), report)
    model, hardening = _shuffle_model(), HardenShuffles(verbose=0)
    record = ft.HardeningRecord(str(backup), hardening)
    record.set_model(model)
    record.on_train_begin()
    assert not model.get_layer("shuffle").is_hardened and hardening.report is None
    assert not (backup / ft.HARDENING_FILE).exists()
    hardening.report = {**report, "layers": [{"name": "shuffle", "permutation": [1, 0, 3, 2]}]}
    record.on_epoch_end(1)
    assert json.loads((backup / ft.HARDENING_FILE).read_text()) == hardening.report


def test_a_broken_hardening_record_is_named_on_resume(tmp_path):
    backup = _killed_run(tmp_path / "run")
    (backup / ft.HARDENING_FILE).write_text('{"epoch": 1, "lay')
    record = ft.HardeningRecord(str(backup), HardenShuffles(verbose=0))
    record.set_model(_shuffle_model())
    path = re.escape(str(backup / ft.HARDENING_FILE))
    with pytest.raises(RunDirectoryError, match=f"hardening record file {path} is damaged"):
        record.on_train_begin()


def test_a_new_setting_with_its_default_resumes_a_backup_written_without_it(tmp_path, monkeypatch):
    # A setting added to RunIdentity after the backup was written: the stored record
    # lacks it and takes its default, so the run resumes; another value is refused.
    from keras_autoshuffle.training import identity

    @dataclasses.dataclass(frozen=True)
    class Added(identity.RunIdentity):
        label_smoothing: float = 0.0

    monkeypatch.setattr(identity, "RunIdentity", Added)
    run = identity.RunIdentity.make(SETTINGS).record()
    _killed_run(tmp_path / "run", settings=SETTINGS)  # written before the setting existed
    assert prepare_run_directory(str(tmp_path / "run"), run) is True
    stored = json.loads((tmp_path / "run" / ft.BACKUP / ft.SETTINGS_FILE).read_text())
    assert stored["label_smoothing"] == 0.0  # the resumed run's record holds it
    _killed_run(tmp_path / "other", settings=SETTINGS)
    changed = identity.RunIdentity.make(SETTINGS, label_smoothing=0.1).record()
    with pytest.raises(RunDirectoryError, match=r"label_smoothing=0.1 \(backup: 0.0\)"):
        prepare_run_directory(str(tmp_path / "other"), changed)


def test_run_identity_refuses_a_setting_it_does_not_define():
    from keras_autoshuffle.training.identity import RunIdentity

    with pytest.raises(ValueError, match=r"fields of RunIdentity .*Received: colour='red'"):
        RunIdentity.make({"colour": "red", "seed": 1})


def test_a_backup_without_recorded_settings_is_refused(tmp_path):
    # Its settings cannot be compared: resuming could mix two configurations.
    backup = _killed_run(tmp_path / "run")
    (backup / ft.SETTINGS_FILE).unlink()
    with pytest.raises(RunDirectoryError, match="no record of the settings"):
        prepare_run_directory(str(tmp_path / "run"), SETTINGS)


def test_read_json_refuses_what_is_not_a_small_regular_json_file(tmp_path, monkeypatch):
    # A FIFO would block the reader, a deeply nested file raised a raw RecursionError, and
    # a huge file would be read whole: each is named as damaged.
    fifo = tmp_path / "result.json"
    os.mkfifo(fifo)
    with pytest.raises(RunDirectoryError, match="not a regular file"):
        ft.read_json(str(fifo), "result")
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(RunDirectoryError, match="nested.json is damaged"):
        ft.read_json(str(nested), "result")
    monkeypatch.setattr(ft, "MAX_JSON_BYTES", 10)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"accuracy": 0.5}))
    with pytest.raises(RunDirectoryError, match="larger than 10 bytes"):
        ft.read_json(str(big), "result")


def _full_record(**changes):
    from keras_autoshuffle.training.identity import RunIdentity

    fields = dict(epochs=2, batch_size=16, learning_rates=(0.05,), cycle_epochs=(2,))
    fields.update(layer_types={"Dense": 1, "RelaxedShuffle": 2}, model_name="tiny")
    return RunIdentity.make({**SETTINGS, **fields, **changes}).record()


def _settings_with_defaults():
    from keras_autoshuffle.training.identity import UNRECORDED, RunIdentity

    record = _full_record()
    defaults = RunIdentity().record()
    return sorted({k for k in record if record[k] == defaults[k]} | set(UNRECORDED))


@pytest.mark.parametrize("name", _settings_with_defaults())
def test_a_backup_written_before_a_setting_existed_resumes(tmp_path, name):
    # Issue 39: a backup without `layer_types` (written before that setting existed) was
    # refused. A setting absent from an old record takes its default; one describing
    # the built network (no default) is not compared there.
    record = _full_record()
    old = {k: v for k, v in record.items() if k != name}
    _killed_run(tmp_path / "run", settings=old)
    assert prepare_run_directory(str(tmp_path / "run"), record) is True
    stored = json.loads((tmp_path / "run" / ft.BACKUP / ft.SETTINGS_FILE).read_text())
    assert stored == record  # the resumed run's record holds it from now on


@pytest.mark.parametrize(
    "name, value",
    [("layer_types", {"Dense": 1}), ("padding", "same"), ("sinkhorn_iterations", 1)],
)
def test_a_recorded_setting_of_another_value_is_refused_by_name(tmp_path, name, value):
    _killed_run(tmp_path / "run", settings=_full_record(**{name: value}))
    with pytest.raises(RunDirectoryError, match=rf"Received: {name}="):
        prepare_run_directory(str(tmp_path / "run"), _full_record())


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"colour": "red"}, r"colour: a setting this version does not define .*newer version"),
        ({"epochs": "2"}, r"epochs=2 \(backup: '2'\)"),
        ({"layer_types": None}, r"layer_types=\{.*\} \(backup: None\)"),
        ({"seed": 1.5}, r"seed=0 \(backup: 1.5\)"),
    ],
)
def test_a_tampered_settings_record_is_refused_naming_the_setting(tmp_path, changes, message):
    _killed_run(tmp_path / "run", settings={**_full_record(), **changes})
    with pytest.raises(RunDirectoryError, match=message):
        prepare_run_directory(str(tmp_path / "run"), _full_record())


@pytest.mark.parametrize("content", ['{"dataset": "dig', "[1, 2]", "null", ""])
def test_a_truncated_or_non_object_settings_record_is_named(tmp_path, content):
    backup = _killed_run(tmp_path / "run")
    (backup / ft.SETTINGS_FILE).write_text(content)
    with pytest.raises(RunDirectoryError, match="run settings file .* is damaged"):
        prepare_run_directory(str(tmp_path / "run"), SETTINGS)
