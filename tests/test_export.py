"""Export round trips (.keras, SavedModel, LiteRT) with parity, and the relaxed refusal."""

import keras
import numpy as np
import pytest
from keras import layers

import keras_autoshuffle as ka
from keras_autoshuffle import export


def _tiny_model(relaxed=True):
    inputs = keras.Input((8, 8, 3))
    x = layers.Conv2D(12, 3, padding="same", use_bias=False)(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU()(x)
    x = ka.ChannelShuffle(3, name="manual_shuffle")(x)
    x = ka.RelaxedShuffle(seed=3, name="learned_shuffle")(x)
    x = layers.Conv2D(12, 1, groups=3)(x)
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(5)(x)
    model = keras.Model(inputs, outputs)
    if not relaxed:
        ka.harden_model(model)
    return model


def _inputs(batch=3):
    return np.random.default_rng(0).normal(size=(batch, 8, 8, 3)).astype("float32")


def test_relaxed_model_is_refused(tmp_path):
    model = _tiny_model(relaxed=True)
    with pytest.raises(ValueError, match="learned_shuffle"):
        export.export_model(model, str(tmp_path), _inputs())
    assert not list(tmp_path.iterdir())


def test_relaxed_model_exports_when_allowed(tmp_path):
    model = _tiny_model(relaxed=True)
    result = export.export_model(
        model, str(tmp_path), _inputs(), formats=("keras",), allow_relaxed=True
    )
    assert set(result) == {"keras"}
    assert result["keras"]["max_abs_diff"] <= 1e-6


def test_round_trips_with_parity(tmp_path):
    model = _tiny_model(relaxed=False)
    inputs = _inputs()
    result = export.export_model(model, str(tmp_path), inputs)
    assert set(result) == {"keras", "saved_model", "litert"}
    scale = np.max(np.abs(export.keras_outputs(model, inputs)))
    assert scale > 1e-3
    for name, entry in result.items():
        assert entry["max_abs_diff"] <= 1e-5 * max(1.0, scale), name
    assert (tmp_path / "model.tflite").is_file()
    assert (tmp_path / "saved_model" / "saved_model.pb").is_file()
    # The parity is not vacuous: with the learned shuffle replaced by the identity
    # (same weights otherwise) the outputs differ.
    hardened = model.get_layer("learned_shuffle").permutation
    assert not np.array_equal(hardened, np.arange(12))
    identity = _tiny_model(relaxed=True)
    identity.get_layer("learned_shuffle").harden(np.arange(12))
    identity.set_weights(model.get_weights())
    interpreter = export.litert_interpreter(result["litert"]["path"])
    assert "GATHER" in {op["op_name"] for op in interpreter._get_ops_details()}
    # The signature Keras's own LiteRT files have (the conversion, frozen, adds it).
    signature = {"inputs": [model.inputs[0].name], "outputs": ["output_0"]}
    assert interpreter.get_signature_list() == {"serving_default": signature}
    by_signature = interpreter.get_signature_runner()(**{model.inputs[0].name: inputs})
    np.testing.assert_array_equal(
        by_signature["output_0"], export.open_runner(result["litert"]["path"]).run(inputs)
    )
    litert = export.open_runner(result["litert"]["path"]).run(inputs)
    assert np.max(np.abs(litert - export.keras_outputs(identity, inputs))) > 1e-3


def test_files_are_checked_against_the_reference_model(tmp_path):
    # The same network with the learned shuffle replaced by the identity: its files match
    # it, but not the hardened model given as the reference.
    model = _tiny_model(relaxed=False)
    identity = _tiny_model(relaxed=True)
    identity.get_layer("learned_shuffle").harden(np.arange(12))
    identity.set_weights(model.get_weights())
    inputs = _inputs()
    same = export.export_model(identity, str(tmp_path / "a"), inputs, formats=("keras",))
    assert same["keras"]["max_abs_diff"] <= 1e-6
    with pytest.raises(ValueError, match="differs from the Keras model"):
        export.export_model(
            identity, str(tmp_path / "b"), inputs, formats=("keras",), reference=model
        )


def test_bad_arguments(tmp_path):
    model = _tiny_model(relaxed=False)
    with pytest.raises(ValueError, match="formats"):
        export.export_model(model, str(tmp_path), _inputs(), formats=("coreml",))
    with pytest.raises(ValueError, match="sample_inputs"):
        export.export_model(model, str(tmp_path), np.zeros((2, 4, 4, 3)))


def test_empty_sample_batch_is_refused(tmp_path):
    # It reported max_abs_diff 0.0 for every format: a parity check of nothing.
    model = _tiny_model(relaxed=False)
    with pytest.raises(ValueError, match=r"at least one example.*\(0, 8, 8, 3\)"):
        export.export_model(model, str(tmp_path), _inputs()[:0])
    assert not list(tmp_path.iterdir())
