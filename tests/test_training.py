"""Recipes, schedule, coupled weight decay, strategies, multi-host and stop-and-resume."""

import csv
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers

from keras_autoshuffle import RelaxedShuffle, data, training


# A tiny training job, run in subprocesses (CHILD) and in the test process.
def job_model():
    return keras.Sequential([
        keras.Input((32, 32, 3)),
        layers.Conv2D(8, 3, strides=4, use_bias=False),
        layers.BatchNormalization(),
        RelaxedShuffle(penalty=1e-2),
        layers.ReLU(),
        layers.GlobalAveragePooling2D(),
        layers.Dense(10, activation="softmax"),
    ])  # fmt: skip


def run_job(out, epochs, strategy="one-device", harden_at=0, callbacks=()):
    """The tiny training job of CHILD and of the uninterrupted runs (harden_at 0: at the
    end): its report."""
    train, test = data.digits(seed=7)
    train, test = train.subset(128), test.subset(64)
    recipe = training.get_recipe("digits", epochs=epochs, batch_size=32)
    return training.train(
        job_model, train, test, recipe, str(out), strategy=strategy, seed=5, export=False,
        callbacks=list(callbacks), harden_at_epoch=harden_at or None, verbose=0,
    )  # fmt: skip


# The job in a subprocess (the multi-worker test's two workers): argv = output, epochs,
# strategy.
CHILD = r"""
import os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, {tests!r})
from keras_autoshuffle import training

out, epochs, strategy = sys.argv[1], int(sys.argv[2]), sys.argv[3]
strategy = training.make_strategy(strategy)  # before any TF op (multi-worker needs it)
import test_training as job

job.run_job(out, epochs, strategy)
"""


def _start_child(tmp_path, out, epochs, strategy, env):
    """CHILD in a fresh interpreter: the process (its output piped)."""
    script = tmp_path / "child.py"
    if not script.exists():  # never rewritten under a running child that reads it
        partial = tmp_path / "child.py.partial"
        partial.write_text(CHILD.format(tests=os.path.dirname(__file__)))
        os.replace(partial, script)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env}
    args = [sys.executable, str(script), str(out), str(epochs), strategy]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _weights_and_permutations(path):
    model = keras.saving.load_model(path, safe_mode=True)
    perms = [layer.permutation for layer in model.layers if isinstance(layer, RelaxedShuffle)]
    return model.get_weights(), perms


def _epochs_logged(path):
    with open(path) as f:
        return [int(row["epoch"]) for row in csv.DictReader(f)]


# Stop-and-resume scenarios (4 epochs): the run stopped at the end of epoch `stop_at`
# (after its backup), hardened after epoch `harden_at` (0: at the end). Each is a copy of
# an uninterrupted run's folder at that instant (`Snapshot`): the files a kill there leaves.
# Real SIGKILLs, at five instants of a run (in an epoch, between a backup's moves, in the
# hardening, in the exports), are tests/test_durability_kill.py's; a child killed here too
# cost a fresh interpreter's imports and its two epochs.
STOPPED = {
    "mid_run": (2, 0),
    "at_hardening_epoch": (2, 2),
    "after_hardening": (3, 2),
    "before_end_hardening": (4, 0),
}


class Snapshot(keras.callbacks.Callback):
    """Copies the run's folder to `copies[epoch]` at the end of those epochs (1-based),
    after the backup (callbacks run after the built-in ones); `seconds[epoch]`: the
    seconds from `start` to the copy."""

    def __init__(self, out, copies, start):
        super().__init__()
        self.out, self.copies, self.start, self.seconds = out, copies, start, {}

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 in self.copies:
            self.seconds[epoch + 1] = time.time() - self.start
            shutil.copytree(self.out, self.copies[epoch + 1])


@pytest.fixture(scope="module")
def stop_and_resume(tmp_path_factory):
    """Every STOPPED scenario, then run again to the end, and the uninterrupted runs they
    must end at (hardened at the end and after epoch 2), all in this process. Per
    scenario: `stopped_after` (seconds from the uninterrupted run's start to the copy),
    what the stopped run left (`backup`, `hardening_record`, `epochs`), `dir`, and
    `resumed`: the resume's warnings; `whole`: {harden_at: run folder}."""
    folder = tmp_path_factory.mktemp("stop_and_resume")
    seconds = {}
    for h in (0, 2):
        copied = [item for item in STOPPED.items() if item[1][1] == h]
        copies = {stop_at: folder / name for name, (stop_at, _) in copied}
        keras.backend.clear_session()
        out = folder / f"whole{h}"
        snapshot = Snapshot(out, copies, time.time())
        run_job(out, 4, harden_at=h, callbacks=[snapshot])
        seconds.update({name: snapshot.seconds[stop_at] for name, (stop_at, _) in copied})
    scenarios = {}
    for name in STOPPED:
        out = folder / name
        scenarios[name] = {
            "dir": out,
            "stopped_after": seconds[name],
            "backup": (out / "backup").exists(),
            "hardening_record": (out / "backup" / "hardening.json").exists(),
            "epochs": _epochs_logged(out / "history.csv") if out.exists() else None,
        }
    for name in STOPPED:
        keras.backend.clear_session()
        # Every warning, those this process gave before included (an optimizer state not
        # restored is one).
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run_job(folder / name, 4, harden_at=STOPPED[name][1])
        scenarios[name]["resumed"] = [str(w.message) for w in caught]
    return {**scenarios, "whole": {h: folder / f"whole{h}" for h in (0, 2)}}


def test_recipes_match_the_paper():
    # The paper's Section 4: its CIFAR-10 and ImageNet training recipes.
    cifar = training.get_recipe("cifar10")
    assert (cifar.penalty, cifar.learning_rates, cifar.cycle_epochs) == (1e-3, (0.2,), (200,))
    assert (cifar.momentum, cifar.weight_decay, cifar.batch_size) == (0.95, 1e-4, 128)
    imagenet = training.get_recipe("imagenet")
    assert (imagenet.penalty, imagenet.learning_rates) == (2e-3, (0.2, 0.1))
    assert imagenet.cycle_epochs == (100, 100) and imagenet.epochs == 200
    assert (imagenet.momentum, imagenet.weight_decay, imagenet.batch_size) == (0.9, 4e-5, 512)
    quick = training.get_recipe("digits", epochs=3, batch_size=16, penalty=0.1, learning_rate=0.05)
    assert (quick.epochs, quick.batch_size, quick.penalty, quick.learning_rates) == (
        3,
        16,
        0.1,
        (0.05,),
    )
    assert training.get_recipe("imagenet", epochs=2, learning_rate=0.4).learning_rates == (
        0.4,
        0.2,
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"name": "mnist"}, "recipe='mnist'"),
        ({"name": "digits", "epochs": 0}, "epochs=0"),
        ({"name": "digits", "batch_size": 2.5}, "batch_size=2.5"),
        ({"name": "digits", "penalty": -1.0}, "penalty=-1.0"),
    ],
)
def test_bad_recipe_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        training.get_recipe(**kwargs)


def test_bad_strategy_raises():
    with pytest.raises(ValueError, match="strategy='tpu'"):
        training.make_strategy("tpu")


def test_linear_cycles_schedule():
    schedule = training.LinearCycles((0.2, 0.1), (10, 20))
    steps = np.arange(0, 35)
    # Independent NumPy statement of the paper's schedule: linear decay within each cycle.
    expected = np.where(
        steps < 10,
        0.2 * (1 - steps / 10),
        np.where(steps < 30, 0.1 * (1 - (steps - 10) / 20), 0.0),
    )
    got = [float(schedule(s)) for s in steps]
    np.testing.assert_allclose(got, expected, atol=1e-7)
    assert got[10] == pytest.approx(0.1)  # cycle 2 restarts at 0.1
    restored = training.LinearCycles.from_config(schedule.get_config())
    assert float(restored(15)) == pytest.approx(0.075)
    with pytest.raises(ValueError, match="cycle_steps"):
        training.LinearCycles((0.2,), (10, 10))


def test_coupled_sgd_matches_pytorch_sgd_weight_decay():
    lr, momentum, wd = 0.1, 0.9, 0.01
    w = keras.Variable(np.array([1.0, -2.0, 3.0], "float32"))
    m = keras.Variable(np.eye(3, dtype="float32"))
    optimizer = training.CoupledSGD(lr, momentum=momentum, l2=wd)
    optimizer.exclude_from_weight_decay(var_list=[m])
    grads = [np.array([0.5, 0.1, -0.2], "float32"), np.array([0.3, 0.3, 0.3], "float32")]
    # PyTorch: d = g + wd * w; buf = momentum * buf + d; w -= lr * buf.
    ref_w, buf = w.numpy().astype(np.float64), 0.0
    ref_m, buf_m = m.numpy().astype(np.float64), 0.0
    for g in grads:
        optimizer.apply_gradients([(g, w), (np.ones((3, 3), "float32"), m)])
        buf = momentum * buf + g + wd * ref_w
        ref_w = ref_w - lr * buf
        buf_m = momentum * buf_m + 1.0  # excluded: no decay term
        ref_m = ref_m - lr * buf_m
    np.testing.assert_allclose(w.numpy(), ref_w, rtol=1e-6)
    np.testing.assert_allclose(m.numpy(), ref_m, rtol=1e-6)
    config = training.CoupledSGD.from_config(optimizer.get_config()).get_config()
    assert config["l2"] == wd


def test_make_optimizer_excludes_the_shuffle_matrices():
    model = keras.Sequential([keras.Input((4, 4, 6)), layers.Conv2D(6, 1), RelaxedShuffle()])
    optimizer = training.make_optimizer(training.get_recipe("digits"), 10, model)
    matrix = model.layers[1].matrix
    assert not optimizer._use_weight_decay(matrix)
    assert optimizer._use_weight_decay(model.layers[0].kernel)


def _tiny_model():
    # No BatchNorm: its batch statistics are per replica, so they differ from one device.
    return keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            layers.Conv2D(8, 3, strides=4),
            RelaxedShuffle(penalty=1e-2, seed=3),
            layers.ReLU(),
            layers.GlobalAveragePooling2D(),
            layers.Dense(10, activation="softmax"),
        ]
    )


@pytest.mark.slow
def test_mirrored_one_epoch_matches_one_device(two_cpus, tmp_path):
    train, test = data.digits(seed=1)
    train, test = train.subset(128), test.subset(64)
    recipe = training.get_recipe("digits", epochs=1, batch_size=32)
    results = []
    for name, strategy in [
        ("one", tf.distribute.OneDeviceStrategy(two_cpus[0])),
        ("mirrored", training.cpu_mirrored_strategy(two_cpus)),
    ]:
        report = training.train(
            _tiny_model,
            train,
            test,
            recipe,
            str(tmp_path / name),
            strategy=strategy,
            seed=2,
            export=False,
            verbose=0,
        )
        weights, perms = _weights_and_permutations(report["files"]["keras"])
        with open(report["files"]["history"]) as f:
            loss = float(next(csv.DictReader(f))["loss"])
        results.append((weights, perms, loss, report))
    (w1, p1, l1, r1), (w2, p2, l2, r2) = results
    assert (r1["settings"]["strategy"], r1["settings"]["replicas"]) == ("one-device", 1)
    assert (r2["settings"]["strategy"], r2["settings"]["replicas"]) == ("mirrored", 2)
    assert l1 == pytest.approx(l2, rel=1e-5)
    for a, b in zip(w1, w2, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_array_equal(p1[0], p2[0])


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.mark.slow
def test_two_process_multi_worker_run_holds_identical_weights(tmp_path):
    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    out = tmp_path / "mw"
    processes = [
        _start_child(
            tmp_path,
            out,
            epochs=1,
            strategy="multi-worker",
            env={
                "TF_CONFIG": json.dumps(
                    {"cluster": cluster, "task": {"type": "worker", "index": i}}
                )
            },
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0].decode(errors="replace") for p in processes]
    for process, output in zip(processes, outputs, strict=True):
        assert process.returncode == 0, output[-3000:]
    chief = _weights_and_permutations(str(out / "model.keras"))
    worker = _weights_and_permutations(str(out / "worker-1" / "model.keras"))
    for a, b in zip(chief[0], worker[0], strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(chief[1][0], worker[1][0])
    assert sorted(chief[1][0]) == list(range(8))
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["strategy"] == "multi-worker"
    assert report["settings"]["replicas"] == 2
    assert _epochs_logged(out / "history.csv") == [0]
    assert np.isfinite(report["relaxed_loss"])


@pytest.mark.slow
def test_stopped_run_resumes_and_ends_with_the_same_weights(stop_and_resume):
    run = stop_and_resume["mid_run"]
    assert run["backup"]
    assert run["epochs"] == [0, 1]
    # The reported time counts the stopped invocation's training too (kept in the backup).
    report = json.loads((run["dir"] / "report.json").read_text())
    before = report["time"] - report["time_this_invocation"]
    assert 0 < before < run["stopped_after"]
    # Resumed at epoch 2: the log holds each epoch once.
    assert _epochs_logged(run["dir"] / "history.csv") == [0, 1, 2, 3]
    whole = _weights_and_permutations(str(stop_and_resume["whole"][0] / "model.keras"))
    resumed = _weights_and_permutations(str(run["dir"] / "model.keras"))
    for a, b in zip(whole[0], resumed[0], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    np.testing.assert_array_equal(whole[1][0], resumed[1][0])


@pytest.mark.slow
@pytest.mark.parametrize(
    "scenario", ["at_hardening_epoch", "after_hardening", "before_end_hardening"]
)
def test_run_hardened_mid_training_resumes_with_the_same_permutations(stop_and_resume, scenario):
    # 4 epochs, stopped at the end of an epoch after its backup. Hardened after epoch 2:
    # stopped at the end of epoch 2 or 3, the backup holds a hardened net, whose weights
    # carry its permutations into the fresh model (the record beside them keeps only the
    # hardening's report). Hardened at the end: stopped after the last epoch's backup,
    # before the hardening, the restart trains no more and hardens.
    _, harden_at = STOPPED[scenario]
    run = stop_and_resume[scenario]
    assert run["backup"] and run["hardening_record"] == bool(harden_at)
    # The optimizer state was restored.
    assert not [w for w in run["resumed"] if "Skipping variable loading" in w], run["resumed"]
    stopped = run["dir"]
    assert not (stopped / "backup").exists()
    report = json.loads((stopped / "report.json").read_text())
    assert report["epoch"] == (harden_at or None)
    whole = _weights_and_permutations(str(stop_and_resume["whole"][harden_at] / "model.keras"))
    resumed = _weights_and_permutations(str(stopped / "model.keras"))
    np.testing.assert_array_equal(whole[1][0], resumed[1][0])
    for a, b in zip(whole[0], resumed[0], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


class EvaluatedAgain(keras.callbacks.Callback):
    """At each epoch's end: fit's validation logs, and the same epoch's weights evaluated
    again on a fresh pass of the test split."""

    def __init__(self, test):
        super().__init__()
        self.test, self.pairs = test, []

    def on_epoch_end(self, epoch, logs=None):
        again = self.model.evaluate(self.test, verbose=0, return_dict=True)
        self.pairs.append(
            ((logs["val_loss"], logs["val_accuracy"]), (again["loss"], again["accuracy"]))
        )


def test_each_epochs_validation_is_one_whole_pass_of_the_test_split(tmp_path):
    # fit reads one repeated validation iterator, `steps` batches an epoch: with 50 test
    # images in batches of 32 (the last one partial), each epoch must see exactly the 50.
    train, test = data.digits(seed=7)
    train, test = train.subset(64), test.subset(50)
    check = EvaluatedAgain(test.eval_dataset(32))
    recipe = training.get_recipe("digits", epochs=3, batch_size=32)
    training.train(
        job_model, train, test, recipe, str(tmp_path), seed=5, export=False,
        callbacks=[check], verbose=0,
    )  # fmt: skip
    assert len(check.pairs) == 3
    for logged, again in check.pairs:
        assert logged == pytest.approx(again, rel=1e-6, abs=0)


def test_train_rejects_a_non_boolean_balanced(tmp_path):
    train, test = data.digits()
    recipe = training.get_recipe("digits", epochs=1)
    with pytest.raises(ValueError, match="Received: balanced='v2'"):
        training.train(lambda: None, train, test, recipe, str(tmp_path), balanced="v2")


def test_mixed_precision_trains_in_bfloat16_on_cpu_with_float32_matrices(tmp_path):
    train, test = data.digits(seed=1)
    train, test = train.subset(32), test.subset(16)
    recipe = training.get_recipe("digits", epochs=1, batch_size=16)
    dtypes = []

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            shuffle = self.model.layers[1]
            dtypes.append((self.model.layers[0].compute_dtype, shuffle.matrix.dtype))

    report = training.train(
        _tiny_model, train, test, recipe, str(tmp_path), strategy="one-device",
        mixed_precision=True, export=False, callbacks=[Record()], verbose=0,
    )  # fmt: skip
    assert report["settings"]["mixed_precision"] == "mixed_bfloat16"
    assert dtypes == [("bfloat16", "float32")]
    assert keras.config.dtype_policy().name == "float32"  # restored afterwards
    assert np.isfinite(report["relaxed_loss"])
