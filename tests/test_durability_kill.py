"""kill -9 at many instants of one short run, in turn: each rerun resumes where the kill
left the run and never retrains a completed epoch, and the run ends with the report,
permutations and weights of an uninterrupted run.

The job: a tiny ShuffleNet v2 (16x16 inputs), 32 training and 16 test images, two epochs of
two steps, the Keras file and the SavedModel export (LiteRT's conversion, some 10 s a run,
moves its file as every export does: `_atomic.move_into_place`). A child process runs it
and sends itself SIGKILL at a named instant (CHILD's kill points: the child wraps a package
function, the package holds no test hook): in an epoch, between the two moves of a backup
write, in the hardening, before the SavedModel folder moves into place. Each child resumes
the run the one before left (a fresh interpreter each: some 10 CPU-s of imports on the
2-core EPYC), so the work of the run is done once. The last instant, after `report.json`
(the last file) is written, before the backup is removed, is reached in the test process
(an exception in place of the kill: nothing else runs between the two); the rerun after it
is refused as the finished run's.
"""

import csv
import inspect
import json
import os
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_autoshuffle import RelaxedShuffle, data, training
from keras_autoshuffle.applications import AutoShuffleNetV2, shufflenet_v2
from keras_autoshuffle.training import fault_tolerance as ft
from keras_autoshuffle.training import loops

# Four children (fresh interpreters), one after the other: some 1.5 minutes.
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
        tiny_model,
        train,
        test,
        recipe,
        str(out),
        seed=1,
        export=("saved_model",),
        callbacks=list(callbacks),
        verbose=0,
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
from keras_autoshuffle.training import backup, fault_tolerance

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


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run: (report, folder)."""
    keras.backend.clear_session()
    out = tmp_path_factory.mktemp("reference") / "run"
    return run_job(out), out


# The instants after training, in the order a run reaches them: the shuffles hardened in
# memory, then the SavedModel written but not yet moved into place. `model.keras`, the first
# file, moves as the others do (`_atomic.move_into_place`, its leftover temporary file
# removed as theirs): its instant is left out, a child less (10-15 s).
AFTER_TRAINING = ("hardening", "export:saved_model")


def _backup_epoch(out):
    return json.loads((out / ft.BACKUP / ft.METADATA_FILE).read_text())["epoch"]


class Stopped(BaseException):
    """Raised in place of a kill; no `except Exception` of the package catches it."""


def _stop(*args, **kwargs):
    raise Stopped


def test_killed_at_each_instant_in_turn_resumes_where_the_kill_left_it(
    tmp_path, reference, monkeypatch
):
    out = tmp_path / "run"

    def kill_at(point):
        """The epochs the child killed at `point` began."""
        before = len(_epochs_trained(tmp_path))
        _kill_at(tmp_path, out, point)
        return [epoch for _, epoch in _epochs_trained(tmp_path)[before:]]

    # In the second epoch, from scratch: its first epoch's backup is the last one.
    assert kill_at("epoch:1") == [0, 1]
    assert _backup_epoch(out) == 1
    # Resumed from the last completed epoch, killed between the moves of the next backup:
    # the new weights in place, their metadata still under its temporary name. The epoch
    # is complete, and no rerun below trains it again.
    assert kill_at(f"backup:{EPOCHS}") == [1]
    assert _backup_epoch(out) == 1
    for point in AFTER_TRAINING:  # each redoing only what came after the one before
        assert kill_at(point) == [], point
        assert (out / ft.BACKUP / ft.WEIGHTS_FILE).exists(), point
        assert not (out / "report.json").exists(), point
    # report.json, the last file, is written; the backup not yet removed. Stopped here in
    # this process (a fresh interpreter less): nothing runs between the report's write and
    # `finish_run` but the return, so an exception in its place leaves the kill's files.
    before = len(_epochs_trained(tmp_path))
    keras.backend.clear_session()
    monkeypatch.setattr(loops, "finish_run", _stop)
    with pytest.raises(Stopped):
        run_job(out, [Trace(tmp_path / "trace.txt")])
    monkeypatch.undo()
    assert _epochs_trained(tmp_path)[before:] == []
    assert (out / "report.json").exists() and (out / ft.BACKUP).exists()
    # The rerun is refused as for any finished run, and removes the backup the kill left.
    keras.backend.clear_session()
    with pytest.raises(ft.RunDirectoryError, match="holds a finished run"):
        run_job(out)
    assert not (out / ft.BACKUP).exists()
    # The run ends as the uninterrupted one.
    expected, reference_out = reference
    report = json.loads((out / "report.json").read_text())
    assert _comparable(report, out) == _comparable(expected, reference_out)
    assert _history_epochs(out) == list(range(EPOCHS))
    weights, perms = _model_state(out)
    expected_weights, expected_perms = _model_state(reference_out)
    assert perms == expected_perms
    for a, b in zip(weights, expected_weights, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    leftovers = [p.name for p in out.iterdir() if ".partial" in p.name or ".old" in p.name]
    assert not leftovers
