"""`experiments/int8_qat.py`: the per-channel int8 rounding of the kernels against an
independent NumPy one, where the activations are rounded, the phase's result (same
architecture, other weights) and its argument checks."""

import keras
import numpy as np
import pytest

from experiments import int8_qat
from keras_autoshuffle import folding
from keras_autoshuffle.data.pipeline import ArrayData
from tests.helpers import TINY_SHAPE, tiny_v2

pytestmark = pytest.mark.tensorflow_only


def _numpy_per_channel(kernel, bits=8):
    """Symmetric per-output-channel quantize/dequantize, output channels on the last axis."""
    top = 2 ** (bits - 1) - 1
    flat = kernel.reshape(-1, kernel.shape[-1])
    scale = np.abs(flat).max(axis=0) / top
    return (np.clip(np.round(flat / scale), -top, top) * scale).reshape(kernel.shape)


@pytest.mark.parametrize("bits", [8, 7])
def test_kernel_rounding_is_per_output_channel_symmetric_int(bits):
    rng = np.random.default_rng(0)
    # Channels of very different magnitudes: one per-tensor scale would zero the small ones.
    kernel = (rng.normal(size=(3, 3, 4, 6)) * np.logspace(-3, 0, 6)).astype("float32")
    got = keras.ops.convert_to_numpy(int8_qat.fake_quantize_kernel(kernel, bits=bits))
    np.testing.assert_allclose(got, _numpy_per_channel(kernel, bits), rtol=0, atol=1e-6 * 1e-3)
    assert not np.allclose(got, kernel, rtol=0, atol=1e-7)
    # A depthwise kernel (kh, kw, channels, multiplier): one scale per channel x multiplier.
    depthwise = kernel[:, :, :, :2]
    got = keras.ops.convert_to_numpy(int8_qat.fake_quantize_kernel(depthwise, True, bits))
    expected = _numpy_per_channel(depthwise.reshape(3, 3, 1, 8), bits).reshape(depthwise.shape)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


def _tiny_folded():
    return folding.fold_model(tiny_v2(classes=3, classifier_activation="softmax"))


def test_activations_are_rounded_where_the_converters_keep_an_int8_tensor():
    folded = _tiny_folded()
    chosen = set(int8_qat.quantized_activations(folded))
    kinds = {type(folded.get_layer(n)).__name__ for n in chosen}
    assert {"ReLU", "Concatenate", "GlobalAveragePooling2D"} <= kinds
    # The depthwise BN (no ReLU after it) is kept; a BN before a ReLU and the convs are fused.
    assert any("dwbn" in n for n in chosen)
    assert not any(n.endswith("_bn1") or "conv" in n for n in chosen)


@pytest.mark.lab
@pytest.mark.slow
def test_the_phase_changes_the_weights_not_the_architecture():
    rng = np.random.default_rng(0)
    folded = _tiny_folded()
    images = rng.normal(size=(16, *TINY_SHAPE)).astype("float32")
    train = ArrayData(images, rng.integers(0, 3, 16), 3)
    trained = int8_qat.quantization_aware(folded, train, images[:8], epochs=1, batch_size=8)
    assert trained.get_config() == folded.get_config()
    before, after = folded.get_weights(), trained.get_weights()
    assert [w.shape for w in before] == [w.shape for w in after]
    assert any(not np.array_equal(b, a) for b, a in zip(before, after, strict=True))
    # The rounding is in the training: the same phase without it ends elsewhere.
    plain = int8_qat.quantization_aware(
        folded, train, images[:8], epochs=1, batch_size=8, rounded=False
    ).get_weights()
    assert any(not np.allclose(p, a, atol=1e-7) for p, a in zip(plain, after, strict=True))


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"epochs": 0}, "Received: epochs=0"),
        ({"epochs": 1.5}, "Received: epochs=1.5"),
        ({"learning_rate": float("nan")}, "Received: learning_rate=nan"),
        ({"learning_rate": -0.1}, "Received: learning_rate=-0.1"),
        ({"learning_rate": "0.1"}, "Received: learning_rate='0.1'"),
        ({"weight_bits": 4}, "Received: weight_bits=4"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(arguments, message):
    values = {"epochs": 1, "learning_rate": 0.001, "weight_bits": 8, **arguments}
    with pytest.raises(ValueError, match=message) as error:
        int8_qat.check_arguments(**values)
    assert "\n" not in str(error.value)


def test_the_page_pairs_qat_with_the_same_runs_defaults_and_states_the_float_change():
    from experiments import transfer_int8

    rows = []
    for k, (base, gain, change) in enumerate(
        [(0.95, 0.01, -0.2), (0.96, 0.02, 0.0), (0.97, 0.03, 0.2)]
    ):
        common = {"net": f"n{k}", "seed": f"n{k}", "runtime": "litert", "accuracy_drop": 0.0}
        rows.append({**common, "setting": "default", "top1_agreement": base})
        rows.append(
            {
                **common,
                "setting": "qat",
                "top1_agreement": base + gain,
                "float_accuracy_change": change,
                "float_agreement": 0.99,
                "qat": {"epochs": 3},
                "drop_from_original_float": 0.0,
            }
        )
    lines = "\n".join(transfer_int8.render_qat(rows)).splitlines()
    qat_line = next(line for line in lines if line.startswith("| litert | qat |"))
    # Paired by net: the change is +2 points [2 -/+ t(0.975, 2) * 1 / sqrt(3)].
    assert "| 3 | 98.00 [" in qat_line and "| +2.00 [-0.48, +4.48] |" in qat_line
    change = next(line for line in lines if line.startswith("`qat`: the float nets after"))
    assert "accuracy change +0.00 [-0.50, +0.50] points" in change and "99.00" in change
    # A control measured on one net has no interval: stated in words, not as NaN in the table.
    common = {"net": "n0", "seed": "n0", "runtime": "litert", "accuracy_drop": 0.0}
    control = {
        **common,
        "setting": "float_phase",
        "top1_agreement": 0.97,
        "float_accuracy_change": 0.01,
        "float_agreement": 0.98,
        "qat": {"epochs": 3, "rounded": False},
        "drop_from_original_float": 0.0,
    }
    page = "\n".join(transfer_int8.render_qat([*rows, control]))
    assert "nan" not in page.lower() and "| litert | float_phase |" not in page
    assert "against before (1 net): accuracy change +0.01 [-] points" in page


def test_a_fashion_mnist_control_run_is_not_skipped_by_the_qat_rows(tmp_path, monkeypatch):
    # Rows of both settings share one file (as the transfer study's): a seed measured with
    # "qat" still needs its "float_phase" rows, and the other way round.
    import json
    import types

    from experiments import int8_levers
    from keras_autoshuffle import data

    train = types.SimpleNamespace(images=np.zeros((4, 2)), num_examples=4)
    study = (None, train, None, None, "folded")
    monkeypatch.setattr(int8_levers, "study_net", lambda path, count: study)
    augmented = types.SimpleNamespace(subset=lambda count: train)
    monkeypatch.setattr(data, "fashion_mnist", lambda seed, augment: (augmented, None))
    monkeypatch.setattr(int8_qat, "quantization_aware", lambda *args, **kwargs: "trained")
    measured = []

    def measure_net(name, *args):
        measured.append((name, args[-1]))
        return [{"net": name, "setting": args[-1]}]

    monkeypatch.setattr(int8_qat, "measure_net", measure_net)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"net": "seed0", "seed": 0, "setting": "qat"}) + "\n")
    args = types.SimpleNamespace(
        model="m.keras", test_images=4, rows=str(rows), seeds=[0], calibration=2,
        train_images=4, machine={},
    )  # fmt: skip
    qat = {"epochs": 1, "learning_rate": 0.01, "weight_bits": 8, "rounded": False}
    int8_qat.run_fashion_mnist(args, qat)
    assert measured == [("seed0", "float_phase")]
    int8_qat.run_fashion_mnist(args, qat)  # a rerun skips what it holds
    assert measured == [("seed0", "float_phase")]
