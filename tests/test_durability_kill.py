"""kill -9 at many instants of a short run: every rerun ends with the report of an
uninterrupted run and never retrains a completed epoch.

The job: a tiny ShuffleNet v2 (16x16 inputs), 32 training and 16 test images, two
epochs of two steps, SavedModel and LiteRT export. A child process runs it and sends
itself SIGKILL at a named instant (CHILD's kill points: the child wraps a package function,
the package holds no test hook): in an epoch, between the two moves of a backup write, in
the hardening, before the SavedModel and LiteRT files move into place (these three in
turn, each child resuming the run the one before left), and after `report.json`, the last
file. The rerun
then runs in the test process.

A child starts from scratch or from a copy of the uninterrupted run's folder at the end
of an epoch (`reference`'s snapshots; a run killed after its training left that folder),
so each test pays one child (a fresh interpreter: 6-8 s of imports measured on the shared
2-core machine) and one rerun.
"""

import csv
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_autoshuffle import RelaxedShuffle, data, training
from keras_autoshuffle.applications import AutoShuffleNetV2, shufflenet_v2
from keras_autoshuffle.training import fault_tolerance as ft

# Each test: a child (a fresh interpreter) and a rerun with the exports, most of a minute.
pytestmark = pytest.mark.slow

EPOCHS = 2


def tiny_model():
    arguments = {n: p.default for n, p in inspect.signature(AutoShuffleNetV2).parameters.items()}
    arguments.update(
        input_shape=(16, 16, 3),
        classes=4,
        shuffle="auto",
        penalty=1e-2,
        channels=(8, 16, 32, 64, 64),
        repeats=(1, 1, 1),
        prefix="autoshufflenet_v2",
    )
    return shufflenet_v2._shufflenet_v2(**arguments)


class Trace(keras.callbacks.Callback):
    """Appends "<pid> <epoch>" to `path` at the start of every epoch the process trains."""

    def __init__(self, path):
        super().__init__()
        self.path = path

    def on_epoch_begin(self, epoch, logs=None):
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()} {epoch}\n")


def run_job(out, callbacks=()):
    rng = np.random.default_rng(0)
    images = rng.normal(size=(48, 16, 16, 3)).astype("float32")
    labels = np.arange(48) % 4
    train = data.ArrayData(images[:32], labels[:32], 4, seed=3)
    test = data.ArrayData(images[32:], labels[32:], 4, seed=3)
    recipe = training.get_recipe("digits", epochs=EPOCHS, batch_size=16)
    return training.train(
        tiny_model, train, test, recipe, str(out), seed=1, callbacks=list(callbacks), verbose=0
    )


# The child: argv = output folder, trace file, kill point.
CHILD = r"""
import json, os, signal, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, {tests!r})
import keras
import test_durability_kill as job
from keras_autoshuffle import _atomic, export
from keras_autoshuffle.hardening import harden
from keras_autoshuffle.training import backup, fault_tolerance, loops

out, trace, point = sys.argv[1:]


def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


class KillInEpoch(keras.callbacks.Callback):  # after the first step of an epoch
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == int(detail):
            die()


kind, _, detail = point.partition(":")
if kind == "backup":  # the new weights in place, their metadata not yet
    move = backup.move_into_place

    def move_or_die(temporary, path):
        if path.endswith(fault_tolerance.METADATA_FILE):
            with open(temporary) as f:
                if json.load(f)["epoch"] == int(detail):
                    die()
        move(temporary, path)

    backup.move_into_place = move_or_die
elif kind == "hardening":  # the shuffles hardened in memory, the optimizer not yet
    harden.drop_removed_variables = die
elif kind == "export":  # the file written under its temporary name, not moved
    move = _atomic.move_into_place
    name = export.FILENAMES[detail]

    def move_or_die(temporary, path):
        if os.path.basename(path) == name:
            die()
        move(temporary, path)

    _atomic.move_into_place = move_or_die
elif kind == "report":  # report.json written, the backup not yet removed
    loops.finish_run = die
callbacks = [job.Trace(trace)] + ([KillInEpoch()] if kind == "epoch" else [])
job.run_job(out, callbacks)
print("NOT KILLED")
"""


def _kill_at(tmp_path, out, point):
    """Runs the job into `out` in a child that kills itself at `point`."""
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=os.path.dirname(__file__)))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    args = [sys.executable, str(script), str(out), str(tmp_path / "trace.txt"), point]
    result = subprocess.run(args, env=env, capture_output=True, timeout=240)
    output = (result.stdout + result.stderr).decode(errors="replace")
    assert result.returncode == -signal.SIGKILL, output[-3000:]


def _epochs_trained(tmp_path):
    """[(pid, epoch)] of every epoch begun, in order."""
    path = tmp_path / "trace.txt"
    lines = path.read_text().split() if path.exists() else []
    return [(int(p), int(e)) for p, e in zip(lines[::2], lines[1::2], strict=True)]


def _comparable(report, out):
    """The report without its times, paths relative to the run's folder."""
    text = json.dumps({k: v for k, v in report.items() if not k.startswith("time")})
    return json.loads(text.replace(str(out), "<run>"))


def _model_state(out):
    model = keras.saving.load_model(out / "model.keras", safe_mode=True)
    perms = {x.name: x.permutation.tolist() for x in model.layers if isinstance(x, RelaxedShuffle)}
    return model.get_weights(), perms


def _history_epochs(out):
    with open(out / "history.csv") as f:
        return [int(row["epoch"]) for row in csv.DictReader(f)]


class Snapshot(keras.callbacks.Callback):
    """Copies the run's folder at the end of each epoch, after its backup."""

    def __init__(self, out, folder):
        super().__init__()
        self.out, self.folder = out, folder

    def on_epoch_end(self, epoch, logs=None):
        shutil.copytree(self.out, self.folder / f"epoch{epoch + 1}")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run: (report, folder, snapshots folder)."""
    keras.backend.clear_session()
    folder = tmp_path_factory.mktemp("reference")
    out = folder / "run"
    report = run_job(out, [Snapshot(out, folder)])
    return report, out, folder


def _finish_and_compare(tmp_path, out, reference, resumes_at):
    """Reruns the job in this process; checks it starts at epoch `resumes_at` (0-based)
    and ends as the uninterrupted run."""
    expected, reference_out, _ = reference
    keras.backend.clear_session()
    before = len(_epochs_trained(tmp_path))
    report = run_job(out, [Trace(str(tmp_path / "trace.txt"))])
    rerun = [epoch for _, epoch in _epochs_trained(tmp_path)[before:]]
    assert rerun == list(range(resumes_at, EPOCHS))
    assert _comparable(report, out) == _comparable(expected, reference_out)
    assert not (out / ft.BACKUP).exists()
    assert _history_epochs(out) == list(range(EPOCHS))
    weights, perms = _model_state(out)
    expected_weights, expected_perms = _model_state(reference_out)
    assert perms == expected_perms
    for a, b in zip(weights, expected_weights, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    leftovers = [p.name for p in out.iterdir() if ".partial" in p.name or ".old" in p.name]
    assert not leftovers


def _from_snapshot(tmp_path, reference, epoch):
    out = tmp_path / "run"
    shutil.copytree(reference[2] / f"epoch{epoch}", out)
    return out


def test_killed_in_an_epoch_resumes_from_the_last_completed_one(tmp_path, reference):
    out = tmp_path / "run"
    _kill_at(tmp_path, out, "epoch:1")  # from scratch, in the second epoch
    assert [epoch for _, epoch in _epochs_trained(tmp_path)] == [0, 1]
    assert json.loads((out / ft.BACKUP / ft.METADATA_FILE).read_text())["epoch"] == 1
    _finish_and_compare(tmp_path, out, reference, resumes_at=1)


def test_killed_between_the_moves_of_a_backup_resumes_after_that_epoch(tmp_path, reference):
    # The new weights are in place, their metadata still under its temporary name: the
    # epoch is complete, and the rerun must not train it again.
    out = _from_snapshot(tmp_path, reference, 1)
    _kill_at(tmp_path, out, f"backup:{EPOCHS}")
    assert [epoch for _, epoch in _epochs_trained(tmp_path)] == [1]
    assert json.loads((out / ft.BACKUP / ft.METADATA_FILE).read_text())["epoch"] == 1
    _finish_and_compare(tmp_path, out, reference, resumes_at=EPOCHS)


# The instants after training, in the order a run reaches them: the shuffles hardened in
# memory, then export files written but not yet moved into place. `model.keras`, the first
# file, moves as the others do (`_atomic.move_into_place`, its leftover temporary file
# removed as theirs): its instant is left out, a child less (10-15 s).
AFTER_TRAINING = ("hardening", "export:saved_model", "export:litert")


def test_killed_after_training_at_each_instant_redoes_only_what_came_after(tmp_path, reference):
    """A child killed at each instant after training in turn, each resuming from what the
    one before left (a kill at one instant, then at the next): none trains an epoch again,
    and the last rerun ends as the uninterrupted run."""
    out = _from_snapshot(tmp_path, reference, EPOCHS)
    for point in AFTER_TRAINING:
        _kill_at(tmp_path, out, point)
        assert _epochs_trained(tmp_path) == [], point  # the children trained nothing
        assert (out / ft.BACKUP / ft.WEIGHTS_FILE).exists(), point
        assert not (out / "report.json").exists(), point
    _finish_and_compare(tmp_path, out, reference, resumes_at=EPOCHS)


def test_killed_after_the_report_is_finished(tmp_path, reference):
    # report.json, the last file, is written; the backup not yet removed. The rerun is
    # refused as for any finished run, and removes the backup the kill left.
    out = _from_snapshot(tmp_path, reference, EPOCHS)
    _kill_at(tmp_path, out, "report")
    assert (out / ft.BACKUP).exists()
    keras.backend.clear_session()
    with pytest.raises(ft.RunDirectoryError, match="holds a finished run"):
        run_job(out)
    assert not (out / ft.BACKUP).exists()
    expected, reference_out, _ = reference
    report = json.loads((out / "report.json").read_text())
    assert _comparable(report, out) == _comparable(expected, reference_out)
