"""Hardening: balanced rounding (g groups and the v2 routing) against brute force, under
time limits, and `harden_model`'s reports and argument checks."""

import itertools

import keras
import numpy as np
import pytest
from helpers import (
    TINY_SIDE,
    TINY_UNITS,
    TINY_V2_CHANNELS,
    _assert_folds_exactly,
    _brute_force_best,
    _layer_counts,
    tiny_v1,
    tiny_v2,
)

import keras_autoshuffle as ka
from keras_autoshuffle import folding, hardening, permutations
from keras_autoshuffle.hardening import balanced, balanced_v2

# Matrix-level checks (NumPy and SciPy only): the same on every backend, run once.
NUMPY_ONLY = pytest.mark.tensorflow_only(reason="NumPy and SciPy only, the same on every backend")


def _brute_force_balanced(matrix, groups, counts):
    n = matrix.shape[0]
    best, best_perm = -np.inf, None
    for perm in itertools.permutations(range(n)):
        perm = np.asarray(perm)
        if not np.array_equal(permutations.block_counts(perm, groups), counts):
            continue
        mass = matrix[np.arange(n), perm].sum()
        if mass > best:
            best, best_perm = mass, perm
    return best, best_perm


@NUMPY_ONLY
@pytest.mark.parametrize("n,groups,seed", [(6, 2, 0), (6, 3, 1), (8, 2, 2), (6, 3, 3), (8, 4, 4)])
def test_balanced_is_optimal_by_brute_force(n, groups, seed):
    rng = np.random.default_rng(seed)
    matrix = rng.random((n, n))
    counts = permutations.block_counts(permutations.group_shuffle_permutation(n, groups), groups)
    perm, info = hardening.nearest_balanced_permutation(matrix, groups, return_info=True)
    np.testing.assert_array_equal(permutations.block_counts(perm, groups), counts)
    best, _ = _brute_force_balanced(matrix, groups, counts)
    assert info["optimal"]
    assert info["mass"] == pytest.approx(best, abs=1e-9)
    assert permutations.matched_mass(matrix, perm) == pytest.approx(best, abs=1e-9)
    # The constraint binds: never more mass than the unconstrained assignment.
    plain = permutations.nearest_permutation(matrix)
    assert best <= permutations.matched_mass(matrix, plain) + 1e-12


@NUMPY_ONLY
def test_balanced_with_prescribed_counts_and_bad_counts():
    rng = np.random.default_rng(5)
    matrix = rng.random((6, 6))
    counts = np.array([[2, 1], [1, 2]])
    perm = hardening.nearest_balanced_permutation(matrix, 2, counts=counts)
    np.testing.assert_array_equal(permutations.block_counts(perm, 2), counts)
    assert permutations.matched_mass(matrix, perm) == pytest.approx(
        _brute_force_balanced(matrix, 2, counts)[0]
    )
    with pytest.raises(ValueError, match="counts"):
        hardening.nearest_balanced_permutation(matrix, 2, counts=[[2, 2], [1, 1]])
    with pytest.raises(ValueError, match="groups"):
        hardening.nearest_balanced_permutation(matrix, 4)


def test_harden_model_balanced_report():
    model = tiny_v1(groups=3, shuffle="auto", classes=3)
    report = ka.harden_model(model, balanced=True)
    groups = hardening.shuffle_groups(model)
    assert groups["stage2_unit1_shuffle"] is None
    assert groups["stage3_unit1_shuffle"] == 3
    for entry in report:
        perm = np.asarray(entry["permutation"])
        if groups[entry["name"]]:
            n = perm.size
            manual = permutations.group_shuffle_permutation(n, 3)
            np.testing.assert_array_equal(
                permutations.block_counts(perm, 3), permutations.block_counts(manual, 3)
            )
            assert entry["mass"] <= entry["plain_mass"] + 1e-9
            assert entry["distance"] >= entry["plain_distance"] - 1e-9
        else:
            assert "mass" not in entry
    folded = folding.fold_model(model)
    assert _layer_counts(folded).get("ChannelSlice", 0) == 0
    # One manual reshape-transpose per unit but stage 2 unit 1 (ungrouped conv1).
    assert _layer_counts(folded)["ChannelShuffle"] == TINY_UNITS - 1


@NUMPY_ONLY
@pytest.mark.parametrize("seed", range(12))
def test_two_group_lagrangian_bound_and_result(seed):
    # Rounded matrices have many ties, where bisection alone misses the target count.
    rng = np.random.default_rng(seed)
    matrix = rng.random((8, 8))
    if seed % 2:
        matrix = np.round(matrix, 1)
    counts = np.array([[2, 2], [2, 2]])
    best = _brute_force_best(
        matrix, lambda p: np.array_equal(permutations.block_counts(p, 2), counts)
    )
    perm, bound = balanced._two_group_lagrangian(matrix, 2)
    np.testing.assert_array_equal(permutations.block_counts(perm, 2), counts)
    mass = permutations.matched_mass(matrix, perm)
    assert bound >= best - 1e-9 and mass <= best + 1e-9
    if mass >= bound - 1e-9:  # certified: must be the brute-force optimum
        assert mass == pytest.approx(best, abs=1e-9)
    full, info = hardening.nearest_balanced_permutation(matrix, 2, return_info=True)
    assert info["optimal"] and info["mass"] == pytest.approx(best, abs=1e-9)


def _v2_family(blocks, half):
    """Does a permutation keep the folded v2 routing one SPLIT + one CONCAT per unit?"""
    quarter = half // 2

    def keep(perm):
        to_branch = np.zeros(2 * half, dtype=bool)
        to_branch[perm[half:]] = True  # sources read by the next branch
        groups = blocks or [np.arange(half)]
        for block in groups:
            sent = np.count_nonzero(to_branch[block])
            whole = sent in (0, block.size)
            if not (whole or (block.size == half and sent == quarter)):
                return False
        return np.count_nonzero(to_branch[half:]) in (0, quarter, half)

    return keep


@NUMPY_ONLY
@pytest.mark.parametrize(
    "blocks",
    [[], [np.arange(0, 2), np.arange(2, 4)], [np.arange(4)], [np.array([0, 3]), np.array([1, 2])]],
    ids=["down_unit", "two_quarters", "one_half", "scattered_quarters"],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_v2_routed_hardening_is_optimal_by_brute_force(blocks, seed):
    rng = np.random.default_rng(seed)
    matrix = rng.random((8, 8))
    perm, optimal = balanced_v2._nearest_v2_routed(matrix, blocks)
    keep = _v2_family(blocks, 4)
    assert optimal and keep(perm)
    best = _brute_force_best(matrix, keep)
    assert permutations.matched_mass(matrix, perm) == pytest.approx(best, abs=1e-9)


def test_harden_model_balanced_v2_folds_into_splits_and_concats():
    common = dict(stem="cifar", classes=5, classifier_activation=None)
    model = tiny_v2(shuffle="auto", **common)
    report = ka.harden_model(model, balanced=True)
    assert len(report) == TINY_UNITS
    for entry in report:
        assert entry["groups"] == 2 and entry["optimal"]
        assert entry["mass"] <= entry["plain_mass"] + 1e-9
    folded = _assert_folds_exactly(model, 3, TINY_SIDE)
    counts = _layer_counts(folded)
    # Each unit's output cut at most once into two halves, each unit input (and stage
    # end) one concat of whole pieces: no slices, at most one SPLIT and one CONCAT per
    # unit (the net without shuffles has a SPLIT per basic unit and a CONCAT per unit,
    # copying twice the channels).
    assert counts.get("ChannelSlice", 0) == 0
    assert counts.get("ChannelSplit", 0) <= TINY_UNITS
    assert counts.get("Concatenate", 0) <= TINY_UNITS
    # Plain hardening of the same kind of matrices needs slices.
    plain = tiny_v2(shuffle="auto", **common)
    ka.harden_model(plain)
    assert _layer_counts(folding.fold_model(plain)).get("ChannelSlice", 0) > TINY_UNITS


def test_balanced_v2_rejects_bad_arguments():
    model = tiny_v2(shuffle="auto", classes=3)
    n = TINY_V2_CHANNELS[1]  # stage 2
    ok = np.full((n, n), 1 / n)
    for name in ("head_conv", "stage2_unit0_shuffle", "stage2_unit2_shuffle", None):
        with pytest.raises(ValueError, match=f"Received: shuffle_name={name!r}"):
            hardening.nearest_balanced_v2_permutation(model, name, ok)
    with pytest.raises(ValueError, match=r"Received: matrix.shape=\(4, 4\)"):
        hardening.nearest_balanced_v2_permutation(model, "stage2_unit1_shuffle", np.eye(4))
    with pytest.raises(ValueError, match="Received: time_limit=-1"):
        hardening.nearest_balanced_v2_permutation(model, "stage2_unit1_shuffle", ok, time_limit=-1)
    v1 = tiny_v1(groups=3, shuffle="auto", classes=3)
    with pytest.raises(ValueError, match="needs a ShuffleNet v2"):
        hardening.nearest_balanced_v2_permutation(v1, "stage2_unit1_shuffle", ok)


def test_hardening_arguments_are_checked_up_front():
    with pytest.raises(ValueError, match="Received: time_limit=-1"):
        ka.HardenShuffles(balanced=True, time_limit=-1)
    with pytest.raises(ValueError, match="Received: balanced='yes'"):
        ka.HardenShuffles(balanced="yes")
    with pytest.raises(ValueError, match="`allowed`"):
        permutations.nearest_permutation(np.ones((3, 3)), allowed=np.eye(3, k=1, dtype=bool))


@NUMPY_ONLY
@pytest.mark.parametrize("groups", [2, 3, 8])
def test_balanced_under_a_tiny_time_limit_returns_a_valid_balanced_permutation(groups):
    # A time limit means "the best feasible answer so far", never an exception (HiGHS
    # alone found no feasible point in 1 s at n = 240, g = 8, and left `mip_gap` None).
    rng = np.random.default_rng(groups)
    n = 240
    matrix = 0.1 * rng.random((n, n)) + permutations.permutation_matrix(
        rng.permutation(n), dtype=np.float64
    )
    perm, info = hardening.nearest_balanced_permutation(
        matrix, groups, time_limit=0.2, return_info=True
    )
    manual = permutations.block_counts(permutations.group_shuffle_permutation(n, groups), groups)
    np.testing.assert_array_equal(permutations.block_counts(perm, groups), manual)
    assert info["mass"] == pytest.approx(permutations.matched_mass(matrix, perm))
    plain = permutations.matched_mass(matrix, permutations.nearest_permutation(matrix))
    assert info["mass"] <= plain + 1e-9
    assert isinstance(info["optimal"], bool) and info["seconds"] < 30


@NUMPY_ONLY
def test_repair_reaches_any_prescribed_counts_from_any_start():
    rng = np.random.default_rng(3)
    n, groups = 12, 3
    for _ in range(20):
        counts = permutations.block_counts(rng.permutation(n), groups)
        start = rng.permutation(n)
        perm = balanced._repair_counts(rng.random((n, n)), start, counts)
        np.testing.assert_array_equal(permutations.block_counts(perm, groups), counts)


def test_balanced_v2_hardening_under_a_tiny_time_limit_reports_it():
    model = tiny_v2(shuffle="auto", classes=3)
    report = ka.harden_model(model, balanced=True, time_limit=1e-3)
    assert len(report) == TINY_UNITS
    assert all(isinstance(entry["optimal"], bool) for entry in report)
    counts = _layer_counts(folding.fold_model(model))
    assert counts.get("ChannelSlice", 0) == 0


@NUMPY_ONLY
def test_v2_routing_counts_of_the_manual_shuffle_by_hand():
    # Half = 4, four units, traced by hand through the interleaving shuffle:
    # unit 1 keeps [L0 R0 L1 R1] and sends [L2 R2 L3 R3] to unit 2; unit 2 keeps
    # [L0 B0 R0 B1], sends [L1 B2 R1 B3] to unit 3; unit 3 keeps [L0 C0 B0 C1], sends
    # [R0 C2 B1 C3] to unit 4; unit 4's concat goes to the stage end.
    manual = [permutations.group_shuffle_permutation(8, 2)] * 4
    producers, consumers, counts = hardening.v2_stage_counts(manual, 4)
    assert producers == ["left", 1, 2, 3, 4] and consumers == [2, 3, 4, "end"]
    expected = [[2, 1, 0, 1], [2, 1, 1, 0], [0, 2, 1, 1], [0, 0, 2, 2], [0, 0, 0, 4]]
    np.testing.assert_array_equal(counts, expected)


def test_routing_difference_is_zero_exactly_for_manual_counts():
    manual = tiny_v2(classes=3)
    assert hardening.routing_difference(manual) == 0.0
    # v1: balanced hardening keeps the manual block counts, so the manual net re-parametrised.
    v1 = tiny_v1(groups=3, shuffle="auto", classes=3)
    ka.harden_model(v1, balanced=True)
    assert hardening.routing_difference(v1) == 0.0
    # Swapping the halves keeps each unit's fresh output and sends the kept half on.
    v2 = tiny_v2(shuffle="auto", classes=3)
    for layer in ka.relaxed_shuffles(v2):
        n = layer.matrix.shape[0]
        layer.harden(np.roll(np.arange(n), n // 2))  # swap the halves
    # Stage 3 (three units): the down unit's whole left branch goes to unit 2.
    entry = next(e for e in hardening.routing_counts(v2) if e["stage"] == 3)
    assert entry["counts"][0, 0] == TINY_V2_CHANNELS[2] // 2
    assert 0 < hardening.routing_difference(v2) <= 1


def test_harden_model_refuses_a_string_and_an_unbuilt_model():
    with pytest.raises(ValueError, match="keras.Model. Received: model='model.keras'"):
        ka.harden_model("model.keras")
    unbuilt = keras.Sequential([ka.RelaxedShuffle(name="shuffle")], name="unbuilt")
    with pytest.raises(
        ValueError, match="built before it is hardened. Received: unbuilt model 'unbuilt'"
    ):
        ka.harden_model(unbuilt)
    with pytest.raises(ValueError, match="Received: unbuilt model"):
        ka.harden_and_evaluate(unbuilt)


@pytest.mark.parametrize("shuffle,evaluations", [("manual", 1), ("auto", 2)])
def test_harden_and_evaluate_evaluates_again_only_what_it_rounded(shuffle, evaluations):
    """A net with nothing to round is measured once (before == after) and keeps its
    compiled test function; a relaxed one is measured before and after the rounding."""
    model = tiny_v2(shuffle=shuffle, classes=3)
    model.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    x = np.random.default_rng(0).normal(size=(4, TINY_SIDE, TINY_SIDE, 3)).astype("float32")
    compiled = []  # the test function each evaluation ran

    def evaluate():
        result = model.evaluate(x, np.arange(4) % 3, verbose=0)
        compiled.append(model.test_function)
        return result

    report = ka.harden_and_evaluate(model, evaluate)
    assert len(compiled) == evaluations
    assert bool(report["layers"]) == (shuffle == "auto")
    if shuffle == "manual":
        assert report["rounded_accuracy"] == report["relaxed_accuracy"]
        assert model.test_function is compiled[0], "a manual net's compiled function was reset"
    else:  # the rounding reset it: the second evaluation traced the hardened net anew
        assert compiled[1] is not compiled[0]
