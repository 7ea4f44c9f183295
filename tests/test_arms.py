"""The ways to learn a shuffle that the study compares with the manual one: a hard forward
pass with a straight-through gradient, shuffles fixed from the first step, search then
retrain, and the study's arms and verdict."""

import dataclasses
import json
import shutil

import keras
import numpy as np
import pytest
from helpers import fit
from scipy.optimize import linear_sum_assignment

from keras_autoshuffle import RelaxedShuffle, data, hardening, training
from keras_autoshuffle.applications import shufflenet_v1, shufflenet_v2
from keras_autoshuffle.hard_forward import straight_through
from keras_autoshuffle.layers import shuffle_layers
from keras_autoshuffle.training import search
from keras_autoshuffle.training.fault_tolerance import RunDirectoryError

TINY = dict(
    include_top=True,
    weights=None,
    input_tensor=None,
    input_shape=(16, 16, 3),
    pooling=None,
    classes=10,
    classifier_activation="softmax",
    name=None,
    penalty=1e-2,
    stem="cifar",
    shuffle_initializer="random",
    padding="same",
    sinkhorn_iterations=10,
    shuffle_forward="relaxed",
    shuffle_permutations=None,
    features_only=False,
    prefix="tiny",
)


def tiny_v2(**overrides):
    arguments = {**TINY, "width": 0.5, "shuffle": "auto", "channels": (8, 16, 32, 64, 64)}
    return shufflenet_v2._shufflenet_v2(**{**arguments, "repeats": (2, 1, 1), **overrides})


def tiny_v1(**overrides):
    arguments = {**TINY, "width": 0.25, "groups": 3, "shuffle": "auto"}
    arguments.update(channels=(6, 24, 48, 96), repeats=(2, 1, 1))
    return shufflenet_v1._shufflenet_v1(**{**arguments, **overrides})


def _gradient(function, value):
    """d sum(function(value)) / d value on the current backend."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        value = tf.Variable(value)
        with tf.GradientTape() as tape:
            total = tf.reduce_sum(function(value))
        return tape.gradient(total, value).numpy()
    if backend == "jax":
        import jax

        return np.asarray(jax.grad(lambda v: function(v).sum())(value))
    pytest.skip(f"no gradient helper for {backend}")


def test_hard_forward_is_the_nearest_permutation_with_a_straight_through_gradient():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 3, 6)).astype("float32")
    weights = rng.normal(size=(2, 3, 3, 6)).astype("float32")
    layer = RelaxedShuffle(penalty=0.0, forward="hard", seed=3)
    layer.build(x.shape)
    matrix = keras.ops.convert_to_numpy(layer.matrix)
    rows, cols = linear_sum_assignment(-matrix)  # the assignment maximising trace(P^T M)
    perm = cols[np.argsort(rows)]
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(x)), x[..., perm])

    def loss(m):
        y = keras.ops.tensordot(x, straight_through(m), axes=[[-1], [1]])
        return y * weights

    # Straight-through: the gradient of y = M x taken at M, i.e. sum over pixels of
    # upstream_i * x_j, whatever permutation the forward pass used.
    expected = np.einsum("bhwi,bhwj->ij", weights, x)
    np.testing.assert_allclose(_gradient(loss, matrix), expected, rtol=1e-5, atol=1e-5)


def test_hard_forward_round_trips_and_is_checked(tmp_path):
    layer = RelaxedShuffle(forward="hard")
    assert RelaxedShuffle.from_config(layer.get_config()).forward_pass == "hard"
    with pytest.raises(ValueError, match="Received: forward='soft'"):
        RelaxedShuffle(forward="soft")
    model = tiny_v2(shuffle_forward="hard")
    x = np.random.default_rng(1).normal(size=(2, 16, 16, 3)).astype("float32")
    path = str(tmp_path / "hard.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert {layer.forward_pass for layer in shuffle_layers(loaded)} == {"hard"}
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    with pytest.raises(ValueError, match="Received: shuffle_forward='soft'"):
        tiny_v2(shuffle_forward="soft")


V1_ON_TF = pytest.mark.tensorflow_only(
    reason="v2 covers the JAX path; v1's grouped convs compile for 45 s"
)


@pytest.mark.parametrize(
    "build", [tiny_v2, pytest.param(tiny_v1, marks=V1_ON_TF)], ids=["v2", "v1"]
)
def test_a_hard_net_started_at_manual_is_the_manual_net_and_trains(build):
    x = np.random.default_rng(2).normal(size=(8, 16, 16, 3)).astype("float32")
    keras.utils.set_random_seed(5)
    manual = build(shuffle="manual")
    keras.utils.set_random_seed(5)
    hard = build(shuffle_initializer="manual", shuffle_forward="hard")
    # The same initial weights (the shuffles draw nothing) and the same function.
    np.testing.assert_array_equal(hard.predict(x, verbose=0), manual.predict(x, verbose=0))
    hard.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    fit(hard, x, np.arange(8) % 10, epochs=2, batch_size=4, verbose=0)
    assert np.isfinite(hard.predict(x, verbose=0)).all()
    # Every training step computed an exact permutation: hardening changes nothing.
    before = hard.predict(x, verbose=0)
    hardening.harden_model(hard)
    np.testing.assert_allclose(hard.predict(x, verbose=0), before, atol=1e-6)


def test_fixed_permutations_start_as_the_manual_net_of_the_seed():
    rng = np.random.default_rng(3)
    relaxed = tiny_v2()
    perms = {
        layer.name: rng.permutation(layer.matrix.shape[0]) for layer in shuffle_layers(relaxed)
    }
    keras.utils.set_random_seed(7)
    manual = tiny_v2(shuffle="manual")
    keras.utils.set_random_seed(7)
    fixed = tiny_v2(shuffle_permutations=perms)
    assert all(layer.is_hardened for layer in shuffle_layers(fixed))
    for layer in shuffle_layers(fixed):
        np.testing.assert_array_equal(layer.permutation, perms[layer.name])
    assert len(fixed.trainable_weights) == len(manual.trainable_weights)
    for a, b in zip(fixed.get_weights(), manual.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    missing = dict(perms)
    name = missing.popitem()[0]
    with pytest.raises(ValueError, match=f"no entry for the shuffle layer '{name}'"):
        tiny_v2(shuffle_permutations=missing)
    with pytest.raises(ValueError, match="does not have as shuffles: \\['nope'\\]"):
        tiny_v2(shuffle_permutations={**perms, "nope": [0]})
    with pytest.raises(ValueError, match="Received: shuffle='manual'"):
        tiny_v2(shuffle="manual", shuffle_permutations=perms)
    with pytest.raises(ValueError, match="must be a dict"):
        tiny_v2(shuffle_permutations=list(perms.values()))


def _splits(count=48):
    rng = np.random.default_rng(0)
    images = rng.normal(size=(count, 16, 16, 3)).astype("float32")
    labels = np.arange(count) % 10
    return data.ArrayData(images, labels, 10), data.ArrayData(images[:16], labels[:16], 10)


def _model_fn(**overrides):
    return tiny_v2(**overrides)


@pytest.fixture(scope="module")
def searched_run(tmp_path_factory):
    """A finished search-then-retrain run (one search epoch, seed 4): (report, folder).
    Shared: test_a_search_is_reused... starts from a copy of it."""
    keras.backend.clear_session()
    train_data, test_data = _splits(32)
    recipe = training.get_recipe("digits", epochs=2, batch_size=16)
    out = tmp_path_factory.mktemp("searched") / "run"
    report = training.search_then_retrain(
        _model_fn, train_data, test_data, recipe, str(out), search_epochs=1, seed=4,
        export=False, verbose=0,
    )  # fmt: skip
    return report, out


@pytest.mark.tensorflow_only(reason="train() runs on the TensorFlow backend")
def test_search_then_retrain_fixes_the_searched_permutations(tmp_path, searched_run):
    train_data, test_data = _splits(32)
    recipe = training.get_recipe("digits", epochs=2, batch_size=16)
    report, out = searched_run
    record = json.loads((out / "search" / "permutations.json").read_text())
    searched = keras.saving.load_model(str(out / "search" / "model.keras"), safe_mode=True)
    final = keras.saving.load_model(str(out / "model.keras"), safe_mode=True)
    for layer in shuffle_layers(searched):
        assert record["permutations"][layer.name] == layer.permutation.tolist()
        np.testing.assert_array_equal(final.get_layer(layer.name).permutation, layer.permutation)
    assert report["search"]["epochs"] == 1 and report["settings"]["search_epochs"] == 1
    history = (out / "history.csv").read_text().strip().splitlines()
    assert len(history) == 1 + recipe.epochs  # the retraining ran the whole schedule
    # Searching again reads the record back instead of training (a killed retraining
    # resumes with the same permutations).
    stamp = (out / "search" / "model.keras").stat().st_mtime_ns
    definition = json.loads((out / "search" / "definition.json").read_text())
    assert record["definition"] == definition and definition["seed"] == 4
    again, penalty = search._search(
        _model_fn, train_data, test_data, recipe, str(out / "search"), 1, False, 4, None, 0,
        definition,
    )  # fmt: skip
    assert again == record["permutations"] and penalty == record["l12_penalty_at_hardening"]
    assert (out / "search" / "model.keras").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="Received: search_epochs=3"):
        training.search_then_retrain(
            _model_fn, train_data, test_data, recipe, str(tmp_path / "x"), search_epochs=3
        )


@pytest.mark.parametrize("inside", [False, True], ids=["a_file", "under_a_file"])
def test_a_search_into_a_file_is_refused_naming_the_output_folder(tmp_path, inside):
    train_data, test_data = _splits(32)
    recipe = training.get_recipe("digits", epochs=2, batch_size=16)
    (tmp_path / "runfile").write_text("not a folder")
    output = tmp_path / "runfile" / "run" if inside else tmp_path / "runfile"
    match = f"cannot be used \\(Not a directory: .*Received: output_dir='{output}'"
    with pytest.raises(training.RunDirectoryError, match=match):
        training.search_then_retrain(
            _model_fn, train_data, test_data, recipe, str(output), search_epochs=1, verbose=0
        )
    assert (tmp_path / "runfile").read_text() == "not a folder"


@pytest.mark.tensorflow_only(reason="train() runs on the TensorFlow backend")
def test_a_search_is_reused_only_by_its_run_and_zero_epochs_fix_the_balanced_routing(
    tmp_path, searched_run
):
    train_data, test_data = _splits(32)
    recipe = training.get_recipe("digits", epochs=2, batch_size=16)
    out = tmp_path / "run"

    def run(output=out, **kwargs):
        arguments = {"search_epochs": 0, "export": False, "verbose": 0, **kwargs}
        return training.search_then_retrain(
            _model_fn, train_data, test_data, recipe, str(output), **arguments
        )

    def record():
        return json.loads((out / "search" / "permutations.json").read_text())

    # A finished run of seed 4 (its search of one epoch), copied.
    shutil.copytree(searched_run[1], out)
    first = record()
    assert first["definition"]["seed"] == 4
    # --overwrite removes the finished run's search: a new one is made for seed 1.
    run(seed=1, balanced=True, overwrite=True)
    second = record()
    assert (second["definition"]["seed"], second["definition"]["search_balanced"]) == (1, True)
    assert second["permutations"] != first["permutations"]
    # A search of zero epochs fixes the balanced routing of the fresh net: independently,
    # the same fresh net, balanced-hardened by hand.
    keras.utils.set_random_seed(1)
    fresh = _model_fn()
    hardening.harden_model(fresh, balanced=True)
    final = keras.saving.load_model(str(out / "model.keras"), safe_mode=True)
    for layer in shuffle_layers(fresh):
        np.testing.assert_array_equal(final.get_layer(layer.name).permutation, layer.permutation)
    # Killed between the search and the retraining, rerun with other flags: refused
    # before any training, naming the record (nothing is written).
    for name in ("report.json", "model.keras", "history.csv", "logs"):
        shutil.rmtree(out / name) if name == "logs" else (out / name).unlink()
    before = sorted(p.name for p in out.rglob("*"))
    with pytest.raises(RunDirectoryError, match=r"definition\.json records a search made"):
        run(seed=7, balanced=True)
    with pytest.raises(RunDirectoryError, match=r"search_epochs=1 \(recorded: 0\)"):
        run(seed=1, balanced=True, search_epochs=1)
    assert sorted(p.name for p in out.rglob("*")) == before
    # Its permutations copied from another run: refused too.
    definition = json.loads((out / "search" / "definition.json").read_text())
    (out / "search" / "permutations.json").write_text(json.dumps(first))
    with pytest.raises(RunDirectoryError, match=r"permutations\.json records a search made"):
        run(seed=1, balanced=True)
    # Its permutations tampered with (the definition kept): named, not built.
    broken = {
        **second,
        "permutations": {n: [0] * len(p) for n, p in second["permutations"].items()},
    }
    (out / "search" / "permutations.json").write_text(json.dumps(broken))
    with pytest.raises(RunDirectoryError, match=r"permutations\.json is damaged: `permutation of"):
        run(seed=1, balanced=True)
    # A search folder that does not say what made it is not reused.
    (out / "search" / "definition.json").unlink()
    with pytest.raises(RunDirectoryError, match="no definition.json"):
        run(seed=1, balanced=True)
    # A killed retraining of other settings is refused before the search starts.
    other = tmp_path / "other"
    (other / "backup").mkdir(parents=True)
    (other / "backup" / "settings.json").write_text(json.dumps({**definition, "seed": 3}))
    with pytest.raises(RunDirectoryError, match=r"seed=1 \(recorded: 3\)"):
        run(other, seed=1, balanced=True)
    assert not (other / "search").exists()
    # A finished run is refused before its search is read or redone.
    shutil.rmtree(out / "search")
    (out / "report.json").write_text("{}")
    with pytest.raises(RunDirectoryError, match="holds a finished run"):
        run(seed=1)
    assert not (out / "search").exists()


def test_study_arms_and_verdict():
    from experiments import study

    settings = study.StudySettings(finalists=("warm_hard",), verdict_seeds=(0, 1, 2, 3))
    specs = {spec.name: spec for spec in study.specs(settings)}
    assert specs["v2_warm_hard_seed0"].shuffle_forward == "hard"
    assert specs["v2_warm_hard_seed0"].shuffle_initializer == "manual"
    assert specs["v2_search_retrain_seed1"].search_epochs == settings.search_epochs
    assert (
        specs["v2_balanced_fixed_seed2"].balanced
        and specs["v2_balanced_fixed_seed2"].search_epochs == 0
    )
    assert {"v1_warm_hard_seed3", "v1_manual_seed3", "v1_auto_lambda0.01_sinkhorn10_seed3"} <= set(
        specs
    )
    assert len(specs) == len(study.specs(settings))  # no run twice
    # More seeds add v2's manual net and finalists only.
    more = dataclasses.replace(settings, more_seeds=(5, 6))
    added = {s.name for s in study.specs(more)} - {s.name for s in study.specs(settings)}
    assert added == {f"v2_{arm}_seed{seed}" for arm in ("manual", "warm_hard") for seed in (5, 6)}
    with pytest.raises(ValueError, match="Received: finalists=\\('best',\\)"):
        study.StudySettings(finalists=("best",))

    def row(model, arm, seed, accuracy, relaxed=None):
        return {
            "model": model, "arm": arm, "seed": seed, "final_accuracy": accuracy,
            "rounded_accuracy": accuracy, "relaxed_accuracy": relaxed,
            "penalty": 0.0, "routing_difference": 0.0 if arm == "warm" else 0.1,
            "equals_manual": arm == "warm",
        }  # fmt: skip

    manual = [0.90, 0.91, 0.92]
    warm = [0.905, 0.905, 0.93]
    runs = [row("v2", "manual", s, a) for s, a in enumerate(manual)]
    runs += [row("v2", "warm", s, a, a) for s, a in enumerate(warm)]
    runs += [row("v2", "warm_hard", 0, 0.95, 0.95)]
    (entry, single) = study.verdict(runs)
    diffs = 100 * (np.array(warm) - np.array(manual))  # +0.5, -0.5, +1.0 points
    assert entry["n"] == 3 and entry["diff_mean"] == pytest.approx(diffs.mean())
    # 95% two-sided Student t with 2 degrees of freedom: 4.302653 (a t table).
    half = 4.302653 * diffs.std(ddof=1) / np.sqrt(3)
    assert entry["ci_low"] == pytest.approx(diffs.mean() - half, abs=1e-5)
    assert entry["ci_high"] == pytest.approx(diffs.mean() + half, abs=1e-5)
    assert (entry["wins"], entry["losses"], entry["equals_manual"]) == (2, 1, 3)
    # A CI down to -1.56 points misses the target: no arm is recommended, manual stays.
    assert not entry["meets_target"] and not entry["recommended"]
    assert single["ci_low"] is None and not single["meets_target"]  # one seed is no verdict
    steady = [
        row("v2", "warm", s, a + d, a + d)
        for s, (a, d) in enumerate(zip(manual, (0.004, 0.005, 0.006), strict=True))
    ]
    (entry, single) = study.verdict(runs[:3] + steady + runs[-1:])
    assert entry["meets_target"] and entry["recommended"] and not single["recommended"]
    assert entry["ci_low"] == pytest.approx(0.5 - 4.302653 * 0.1 / np.sqrt(3), abs=1e-4)
    # Rows from before the arms existed get theirs from what they recorded.
    old = {"shuffle": "auto", "harden_at_epoch": None, "lambda": 1e-2, "sinkhorn_iterations": 10}
    assert study.arm_of(old, settings) == "ten_passes"
    assert study.arm_of({**old, "sinkhorn_iterations": 1}, settings) == "paper"
    assert study.arm_of({**old, "harden_at_epoch": 8}, settings) == "harden8"


def test_a_hardened_nets_weights_file_carries_its_permutations(tmp_path):
    x = np.random.default_rng(4).normal(size=(2, 16, 16, 3)).astype("float32")
    model = tiny_v2()
    hardening.harden_model(model)
    path = str(tmp_path / "hardened.weights.h5")
    model.save_weights(path)
    fresh = tiny_v2()  # relaxed: each shuffle is hardened by the file's permutation
    fresh.load_weights(path)
    assert all(layer.is_hardened for layer in shuffle_layers(fresh))
    np.testing.assert_array_equal(fresh.predict(x, verbose=0), model.predict(x, verbose=0))
    # A relaxed matrix is not loaded into a hardened layer.
    relaxed_path = str(tmp_path / "relaxed.weights.h5")
    tiny_v2().save_weights(relaxed_path)
    with pytest.raises(ValueError, match="holds a relaxed matrix"):
        fresh.load_weights(relaxed_path)


def test_the_study_checks_its_flags_and_its_recorded_settings(tmp_path):

    from experiments import reproduce, study

    for bad, match in (
        ({"max_train_examples": -5}, "Received: max_train_examples=-5"),
        ({"lambdas": (0.0, 1e-2, float("nan"))}, "Received: lambdas=nan"),
        ({"arms": ("warm", "best")}, "Received: arms="),
        ({"search_epochs": 10}, "Received: search_epochs=10"),
        ({"more_seeds": (-1,), "finalists": ("warm",)}, "Received: more_seeds=\\(-1,\\)"),
        ({"seeds": (0, 1.5)}, "Received: seeds=\\(0, 1.5\\)"),
    ):
        with pytest.raises(ValueError, match=match):
            study.StudySettings(**bad)
    settings = study.StudySettings()
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"settings": {**dataclasses.asdict(settings), "epochs": 20}}))
    with pytest.raises(ValueError, match="Received: epochs=10 \\(recorded: 20\\)"):
        study.study(settings, str(tmp_path), train=False)
    # Seeds, finalists, more seeds only add runs: a study unites the recorded ones with those
    # given, so a resume or a report without an earlier call's flags keeps its runs.
    recorded = {**dataclasses.asdict(settings), "finalists": ["search_retrain"], "more_seeds": [5]}
    results.write_text(json.dumps({"settings": recorded, "runs": ["kept"]}))
    united = study.with_recorded_runs(study.StudySettings(seeds=(3,)), str(tmp_path))
    assert united.finalists == ("search_retrain",) and united.more_seeds == (5,)
    assert united.seeds == (0, 1, 2, 3)  # the recorded first: the lambda sweep keeps its seed
    assert {"v2_search_retrain_seed5", "v2_manual_seed5"} <= {s.name for s in study.specs(united)}
    # The plan is recorded before training (a kill then loses none of it), the report kept.
    study.record_plan(dataclasses.replace(united, more_seeds=(5, 7)), str(tmp_path))
    assert json.loads(results.read_text())["runs"] == ["kept"]
    assert study.with_recorded_runs(settings, str(tmp_path)).more_seeds == (5, 7)
    # More seeds without finalists: the manual nets of those seeds.
    manual_only = {s.name for s in study.specs(study.StudySettings(more_seeds=(8,)))}
    assert "v2_manual_seed8" in manual_only and "v1_manual_seed8" not in manual_only
    del recorded["more_seeds"]  # a study recorded before the setting existed
    results.write_text(json.dumps({"settings": recorded}))
    assert study.with_recorded_runs(settings, str(tmp_path)).more_seeds == ()
    # A tampered file is refused naming it and the setting.
    for name, value, match in (
        ("more_seeds", [{"seed": 5}], "settings.more_seeds must be a list"),
        ("more_seeds", None, "settings.more_seeds must be a list"),
        ("seeds", list(range(5000)), "settings.seeds must be a list of at most 1000"),
        ("seeds", [3.0], "results.json: its recorded settings are refused.*Received: seeds="),
        ("arms", ["bogus"], "results.json: its recorded settings are refused.*arms="),
        ("epochs", "absent", "does not record what defines its runs.*Missing: \\['epochs'\\]"),
    ):
        tampered = {**recorded, name: value}
        if value == "absent":
            del tampered[name]
        results.write_text(json.dumps({"settings": tampered}))
        with pytest.raises(ValueError, match=match):
            study.with_recorded_runs(settings, str(tmp_path))
    for flags in (["--seed", "3"], ["--dataset", "digits"]):
        with pytest.raises(SystemExit):
            reproduce.main(["--study", "fashion_mnist", "--output", str(tmp_path), *flags])
    with pytest.raises(SystemExit):
        reproduce.main(["--quick", "--output", str(tmp_path), "--arms", "warm"])
    with pytest.raises(SystemExit):
        reproduce.main(["--quick", "--output", str(tmp_path), "--jobs", "0"])
