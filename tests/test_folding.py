"""Folding shuffles into weights: exact for v1 (every group count) and v2 (every width),
with random, balanced and manual permutations; balanced hardening vs brute force."""

import itertools

import keras
import numpy as np
import pytest

import keras_autoshuffle as ka
from keras_autoshuffle import export, folding, permutations
from keras_autoshuffle.applications import ShuffleNetV1, ShuffleNetV2


def _randomize_batch_norm(model, rng):
    """Non-trivial BN statistics, so a mis-permuted BN parameter shows in the outputs."""
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            n = layer.get_weights()[0].size
            layer.set_weights(
                [
                    rng.uniform(0.5, 1.5, n),
                    rng.normal(size=n) * 0.2,
                    rng.normal(size=n) * 0.2,
                    rng.uniform(0.5, 1.5, n),
                ]
            )


def _layer_counts(model):
    counts = {}
    for layer in model.layers:
        counts[type(layer).__name__] = counts.get(type(layer).__name__, 0) + 1
    return counts


def _assert_folds_exactly(model, seed, side):
    rng = np.random.default_rng(seed)
    _randomize_batch_norm(model, rng)
    x = rng.normal(size=(2, side, side, 3)).astype("float32")
    folded = folding.fold_model(model)
    expected = keras.ops.convert_to_numpy(model(x, training=False))
    got = keras.ops.convert_to_numpy(folded(x, training=False))
    scale = np.max(np.abs(expected))
    assert scale > 1e-2
    np.testing.assert_allclose(got, expected, atol=2e-5 * scale, rtol=0)
    assert folding.count_gathers(folded) == 0
    assert not any(isinstance(layer, ka.RelaxedShuffle) for layer in folded.layers)
    return folded


def _harden_randomly(model, rng, perm_fn=None):
    for layer in ka.relaxed_shuffles(model):
        n = layer.matrix.shape[0]
        layer.harden(rng.permutation(n) if perm_fn is None else perm_fn(layer, n))


V1_CASES = [(1, 0.25), (2, 0.25), (3, 0.25), (4, 0.25), (8, 0.5)]


def _balanced_permutation(n, groups, rng):
    """Manual block counts with random within-group orders on both sides."""
    size = n // groups
    sigma, tau = (
        np.concatenate([rng.permutation(size) + k * size for k in range(groups)]) for _ in "st"
    )
    return sigma[permutations.group_shuffle_permutation(n, groups)[tau]]


@pytest.mark.slow
@pytest.mark.parametrize("groups,width", V1_CASES)
def test_v1_folding_exact(groups, width):
    common = dict(groups=groups, width=width, input_shape=(8, 8, 3), classes=7)
    manual = ShuffleNetV1(shuffle="manual", classifier_activation=None, **common)
    folded = _assert_folds_exactly(manual, groups, 8)
    # The manual shuffle stays the manual reshape-transpose, once per unit (g > 1).
    assert _layer_counts(folded).get("ChannelShuffle", 0) == (15 if groups > 1 else 0)
    assert _layer_counts(folded).get("ChannelSlice", 0) == 0

    # Learned: every other shuffle random, the others balanced (manual block counts).
    learned = ShuffleNetV1(shuffle="auto", classifier_activation=None, **common)
    rng = np.random.default_rng(groups)
    balanced = 0
    for k, layer in enumerate(ka.relaxed_shuffles(learned)):
        n, g = layer.matrix.shape[0], folding.shuffle_groups(learned)[layer.name]
        if k % 2 and g:
            perm = layer.harden(_balanced_permutation(n, g, rng))
        else:
            perm = layer.harden(rng.permutation(n))
        # (A random permutation may have the manual block counts by chance, for g = 2.)
        manual_counts = g and permutations.block_counts(
            permutations.group_shuffle_permutation(n, g), g
        )
        balanced += bool(g) and np.array_equal(permutations.block_counts(perm, g), manual_counts)
    folded = _assert_folds_exactly(learned, groups + 10, 8)
    # Stage 2 unit 1 (ungrouped conv1) folds away completely; balanced shuffles become
    # the manual reshape-transpose; random ones slices.
    assert _layer_counts(folded).get("ChannelShuffle", 0) == balanced
    assert (_layer_counts(folded).get("ChannelSlice", 0) > 0) == (groups > 1)


@pytest.mark.slow
@pytest.mark.parametrize("width", [0.5, 1.0, 1.5, 2.0])
def test_v2_folding_exact(width):
    common = dict(width=width, input_shape=(8, 8, 3), stem="cifar", classes=5)
    manual = ShuffleNetV2(shuffle="manual", classifier_activation=None, **common)
    folded = _assert_folds_exactly(manual, 1, 8)
    assert _layer_counts(folded).get("ChannelShuffle", 0) == 0
    learned = ShuffleNetV2(shuffle="auto", classifier_activation=None, **common)
    _harden_randomly(learned, np.random.default_rng(int(width * 10)))
    _assert_folds_exactly(learned, 2, 8)


def test_fold_refuses_relaxed_and_other_models():
    model = ShuffleNetV2(width=0.5, shuffle="auto", input_shape=(8, 8, 3), classes=3)
    with pytest.raises(ValueError, match="relaxed"):
        folding.fold_model(model)
    inputs = keras.Input((4, 4, 3))
    with pytest.raises(ValueError, match="ShuffleNet"):
        folding.fold_model(keras.Model(inputs, keras.layers.Conv2D(2, 1)(inputs)))


def test_folded_litert_has_no_gather_and_matches(tmp_path):
    model = ShuffleNetV2(
        width=0.5, shuffle="auto", input_shape=(8, 8, 3), classes=4, classifier_activation=None
    )
    _harden_randomly(model, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    _randomize_batch_norm(model, rng)
    x = rng.normal(size=(2, 8, 8, 3)).astype("float32")

    def ops_of(path):
        interpreter = export.litert_interpreter(path)
        return {op["op_name"] for op in interpreter._get_ops_details()}

    folded = folding.fold_model(model)
    result = export.export_model(folded, str(tmp_path), x, formats=("litert",))
    ops = ops_of(result["litert"]["path"])
    assert "GATHER" not in ops
    assert "CONCATENATION" in ops
    litert = export.litert_outputs(result["litert"]["path"], x)
    np.testing.assert_allclose(litert, export.keras_outputs(model, x), atol=1e-4)


def test_folded_model_round_trips_safe_mode(tmp_path):
    model = ShuffleNetV1(groups=3, width=0.25, shuffle="auto", input_shape=(8, 8, 3), classes=3)
    _harden_randomly(model, np.random.default_rng(0))
    folded = folding.fold_model(model)
    assert _layer_counts(folded).get("ChannelSlice", 0) > 0
    x = np.random.default_rng(2).normal(size=(2, 8, 8, 3)).astype("float32")
    result = export.export_model(folded, str(tmp_path), x, formats=("keras",))
    assert result["keras"]["max_abs_diff"] <= 1e-6


# ---------------------------------------------------------------- balanced hardening


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


def test_block_counts_independent_numpy():
    perm = permutations.group_shuffle_permutation(6, 3)  # [0, 2, 4, 1, 3, 5]
    # Outputs 0-1 (target group 0) read inputs 0, 2 (source groups 0, 1); outputs 2-3
    # read 4, 1 (groups 2, 0); outputs 4-5 read 3, 5 (groups 1, 2).
    np.testing.assert_array_equal(
        permutations.block_counts(perm, 3), [[1, 1, 0], [1, 0, 1], [0, 1, 1]]
    )
    np.testing.assert_array_equal(permutations.block_counts(np.arange(6), 2), [[3, 0], [0, 3]])
    with pytest.raises(ValueError, match="groups"):
        permutations.block_counts(np.arange(6), 4)


@pytest.mark.parametrize("n,groups,seed", [(6, 2, 0), (6, 3, 1), (8, 2, 2), (6, 3, 3), (8, 4, 4)])
def test_balanced_is_optimal_by_brute_force(n, groups, seed):
    rng = np.random.default_rng(seed)
    matrix = rng.random((n, n))
    counts = permutations.block_counts(permutations.group_shuffle_permutation(n, groups), groups)
    perm, info = permutations.nearest_balanced_permutation(matrix, groups, return_info=True)
    np.testing.assert_array_equal(permutations.block_counts(perm, groups), counts)
    best, _ = _brute_force_balanced(matrix, groups, counts)
    assert info["optimal"]
    assert info["mass"] == pytest.approx(best, abs=1e-9)
    assert permutations.matched_mass(matrix, perm) == pytest.approx(best, abs=1e-9)
    # The constraint binds: never more mass than the unconstrained assignment.
    plain = permutations.nearest_permutation(matrix)
    assert best <= permutations.matched_mass(matrix, plain) + 1e-12


def test_balanced_with_prescribed_counts_and_bad_counts():
    rng = np.random.default_rng(5)
    matrix = rng.random((6, 6))
    counts = np.array([[2, 1], [1, 2]])
    perm = permutations.nearest_balanced_permutation(matrix, 2, counts=counts)
    np.testing.assert_array_equal(permutations.block_counts(perm, 2), counts)
    assert permutations.matched_mass(matrix, perm) == pytest.approx(
        _brute_force_balanced(matrix, 2, counts)[0]
    )
    with pytest.raises(ValueError, match="counts"):
        permutations.nearest_balanced_permutation(matrix, 2, counts=[[2, 2], [1, 1]])
    with pytest.raises(ValueError, match="groups"):
        permutations.nearest_balanced_permutation(matrix, 4)


def test_decompose_recovers_perm():
    rng = np.random.default_rng(0)
    n, g = 12, 3
    manual = permutations.group_shuffle_permutation(n, g)
    perm = permutations.nearest_balanced_permutation(rng.random((n, n)), g)
    sigma, tau = folding.decompose(perm, manual, g)
    np.testing.assert_array_equal(sigma[manual[tau]], perm)
    for p in (sigma, tau):
        np.testing.assert_array_equal(p // (n // g), np.arange(n) // (n // g))


def test_harden_model_balanced_report():
    model = ShuffleNetV1(groups=3, width=0.25, shuffle="auto", input_shape=(8, 8, 3), classes=3)
    report = ka.harden_model(model, balanced=True)
    groups = folding.shuffle_groups(model)
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
    assert _layer_counts(folded)["ChannelShuffle"] == 15


# ---------------------------------------------------------------- balanced v2 hardening


def _brute_force_best(matrix, keep):
    """Max matched mass over all permutations with keep(perm) True."""
    n = matrix.shape[0]
    masses = [
        matrix[np.arange(n), perm].sum()
        for perm in map(np.asarray, itertools.permutations(range(n)))
        if keep(perm)
    ]
    return max(masses) if masses else None


def test_nearest_permutation_with_allowed_mask_by_brute_force():
    rng = np.random.default_rng(7)
    matrix = rng.random((7, 7))
    allowed = rng.random((7, 7)) < 0.6
    perm = permutations.nearest_permutation(matrix, allowed=allowed)
    assert allowed[np.arange(7), perm].all()
    best = _brute_force_best(matrix, lambda p: allowed[np.arange(7), p].all())
    assert permutations.matched_mass(matrix, perm) == pytest.approx(best, abs=1e-12)
    with pytest.raises(ValueError, match="infeasible.*Received: allowed with 6 True"):
        permutations.nearest_permutation(matrix, allowed=np.eye(7, k=1, dtype=bool))
    with pytest.raises(ValueError, match="allowed"):
        permutations.nearest_permutation(matrix, allowed=np.ones((6, 6), dtype=bool))


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
    perm, bound = permutations._two_group_lagrangian(matrix, 2)
    np.testing.assert_array_equal(permutations.block_counts(perm, 2), counts)
    mass = permutations.matched_mass(matrix, perm)
    assert bound >= best - 1e-9 and mass <= best + 1e-9
    if mass >= bound - 1e-9:  # certified: must be the brute-force optimum
        assert mass == pytest.approx(best, abs=1e-9)
    full, info = permutations.nearest_balanced_permutation(matrix, 2, return_info=True)
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


@pytest.mark.parametrize(
    "blocks",
    [[], [np.arange(0, 2), np.arange(2, 4)], [np.arange(4)], [np.array([0, 3]), np.array([1, 2])]],
    ids=["down_unit", "two_quarters", "one_half", "scattered_quarters"],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_v2_routed_hardening_is_optimal_by_brute_force(blocks, seed):
    rng = np.random.default_rng(seed)
    matrix = rng.random((8, 8))
    perm, optimal = folding._nearest_v2_routed(matrix, blocks)
    keep = _v2_family(blocks, 4)
    assert optimal and keep(perm)
    best = _brute_force_best(matrix, keep)
    assert permutations.matched_mass(matrix, perm) == pytest.approx(best, abs=1e-9)


def test_harden_model_balanced_v2_folds_into_splits_and_concats():
    common = dict(width=0.5, input_shape=(8, 8, 3), stem="cifar", classes=5)
    model = ShuffleNetV2(shuffle="auto", classifier_activation=None, **common)
    report = ka.harden_model(model, balanced=True)
    assert len(report) == 16
    for entry in report:
        assert entry["groups"] == 2 and entry["optimal"]
        assert entry["mass"] <= entry["plain_mass"] + 1e-9
    folded = _assert_folds_exactly(model, 3, 8)
    counts = _layer_counts(folded)
    # Each unit's output cut at most once into two halves, each unit input (and stage
    # end) one concat of whole pieces: no slices, at most 16 SPLIT + 16 CONCAT for the
    # 16 units (the net without shuffles has 13 + 16, copying twice the channels).
    assert counts.get("ChannelSlice", 0) == 0
    assert counts.get("ChannelSplit", 0) <= 16 and counts.get("Concatenate", 0) <= 16
    # Plain hardening of the same kind of matrices needs slices.
    plain = ShuffleNetV2(shuffle="auto", classifier_activation=None, **common)
    ka.harden_model(plain)
    assert _layer_counts(folding.fold_model(plain)).get("ChannelSlice", 0) > 20


def test_balanced_v2_rejects_bad_arguments():
    model = ShuffleNetV2(width=0.5, shuffle="auto", input_shape=(8, 8, 3), classes=3)
    ok = np.full((48, 48), 1 / 48)
    for name in ("head_conv", "stage2_unit0_shuffle", "stage2_unit7_shuffle", None):
        with pytest.raises(ValueError, match=f"Received: shuffle_name={name!r}"):
            folding.nearest_balanced_v2_permutation(model, name, ok)
    with pytest.raises(ValueError, match=r"Received: matrix.shape=\(4, 4\)"):
        folding.nearest_balanced_v2_permutation(model, "stage2_unit1_shuffle", np.eye(4))
    with pytest.raises(ValueError, match="Received: time_limit=-1"):
        folding.nearest_balanced_v2_permutation(model, "stage2_unit1_shuffle", ok, time_limit=-1)
    v1 = ShuffleNetV1(groups=3, width=0.25, shuffle="auto", input_shape=(8, 8, 3), classes=3)
    with pytest.raises(ValueError, match="needs a ShuffleNet v2"):
        folding.nearest_balanced_v2_permutation(v1, "stage2_unit1_shuffle", ok)


def test_hardening_arguments_are_checked_up_front():
    with pytest.raises(ValueError, match="Received: time_limit=-1"):
        ka.HardenShuffles(balanced=True, time_limit=-1)
    with pytest.raises(ValueError, match="Received: balanced='yes'"):
        ka.HardenShuffles(balanced="yes")
    with pytest.raises(ValueError, match="`allowed`"):
        permutations.nearest_permutation(np.ones((3, 3)), allowed=np.eye(3, k=1, dtype=bool))
