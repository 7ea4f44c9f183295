"""Tests of the ShuffleNet v1 / v2 and AutoShuffleNet v1 / v2 builders.

Parameter counts and MACs are the published ones (torchvision's model docs, megvii's and
osmr imgclsmob's ShuffleNet v1 tables, kuangliu/pytorch-cifar's ShuffleNetV2); the extra
relaxed-shuffle counts are recomputed here from the published channel tables, not read
from the models. Those checks build the real nets;
the others (names, inputs, gradients, files, layouts) use the tiny nets of
tests/helpers.py, built by the same private builders with fewer units and channels.
The real-size counts depend on the layers' shapes only, not on the backend: the JAX run
skips them (`tensorflow_only`).
"""

import inspect
import json
import os
import pydoc
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import TINY_REPEATS, TINY_SHAPE, TINY_UNITS, TINY_V2_CHANNELS, tiny_v1, tiny_v2
from keras import layers

from keras_autoshuffle import ChannelShuffle, RelaxedShuffle, harden_model
from keras_autoshuffle.applications import (
    V1_WIDTHS,
    Architecture,
    AutoShuffleNetV1,
    AutoShuffleNetV2,
    GroupedConv2D,
    ShuffleNetV1,
    ShuffleNetV2,
    arguments,
    count_macs,
    describe,
    preprocess_input,
    shuffle_layers,
)
from keras_autoshuffle.applications import architecture as arch
from keras_autoshuffle.applications.shufflenet_v1 import MEGVII_CONFIGS
from keras_autoshuffle.applications.weights import pretrained, torchvision

IMAGENET = (224, 224, 3)
CIFAR = (32, 32, 3)

# torchvision's shufflenet_v2_x* docs: width -> (trainable params, MACs at 224x224).
V2_REFERENCE = {
    0.5: (1_366_792, 40.48e6),
    1.0: (2_278_604, 144.91e6),
    1.5: (3_503_624, 295.76e6),
    2.0: (7_393_996, 583.25e6),
}
# ShuffleNet v2 paper, Table 5 (and torchvision): stage widths (stage2, stage3, stage4).
V2_STAGES = {0.5: (48, 96, 192), 1.0: (116, 232, 464), 1.5: (176, 352, 704), 2.0: (244, 488, 976)}
# megvii / osmr imgclsmob: v1 1.0x, 1000 classes, trainable params by groups.
V1_REFERENCE = {1: 1_531_936, 2: 1_733_848, 3: 1_865_728, 4: 1_968_344, 8: 2_434_768}
# megvii README: g3 and g8 at 1.0x both 138M FLOPs (multiply-adds).
V1_MACS = {3: 138e6, 8: 138e6}
# kuangliu/pytorch-cifar ShuffleNetV2: CIFAR stem, 10 classes.
V2_CIFAR_REFERENCE = {0.5: 352_042, 1.0: 1_263_854, 1.5: 2_488_874}


def layer_names(architecture, stem, include_top=True, pooling=None, shuffles=True, pads=True):
    """Every layer name a builder creates for `architecture` (the input layer excluded).

    Args:
        stem: "imagenet" or "cifar".
        shuffles: False for a manual v1 with g = 1 (its units have no shuffle).
        pads: False for `padding="same"` (no ZeroPadding2D layers).
    """
    names = list(arch.IMAGENET_STEM if stem == "imagenet" else arch.STEM)
    for stage, units in architecture.stages():
        for unit in range(1, units + 1):
            for part in arch.unit_parts(architecture.family, unit):
                if part == arch.SHUFFLE and architecture.family == "v1" and not shuffles:
                    continue
                if pads or part not in arch.PADS:
                    names.append(arch.unit_layer(stage, unit, part))
    names = [name for name in names if pads or name not in arch.PADS]
    if architecture.family == "v2":
        names += arch.V2_HEAD
    if include_top:
        names += (arch.AVG_POOL, arch.PREDICTIONS)
    elif pooling:
        names.append({"avg": arch.AVG_POOL, "max": arch.MAX_POOL}[pooling])
    return names


def _trainable(model):
    return sum(int(np.prod(w.shape)) for w in model.trainable_weights)


def _logits(model, x):
    """Outputs with batch statistics: at initialisation the moving statistics let the
    activations of a deep net (more so with doubly stochastic relaxed shuffles) shrink
    toward 0, which would make output comparisons vacuous. The classifier starts at
    N(0, 0.01), so the logits' spread is about 0.05: still 500x the comparisons' atol."""
    out = keras.ops.convert_to_numpy(model(x, training=True))
    assert out.std() > 0.01
    return out


def _images(shape, batch=2, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (batch, *shape)).astype("float32")


# Checks of the real nets against published numbers: the same on every backend.
REAL_SIZE = pytest.mark.tensorflow_only(
    reason="real-size counts depend on the layers' shapes only; the JAX run builds tiny nets"
)


@REAL_SIZE
@pytest.mark.parametrize("width", sorted(V2_REFERENCE))
def test_v2_params_and_macs_match_reference(width):
    params, macs = V2_REFERENCE[width]
    model = ShuffleNetV2(width, input_shape=IMAGENET)
    assert _trainable(model) == params
    assert count_macs(model) == pytest.approx(macs, rel=0.01)


@REAL_SIZE
@pytest.mark.parametrize("groups", sorted(V1_REFERENCE))
def test_v1_params_match_reference(groups):
    model = ShuffleNetV1(1.0, groups, input_shape=IMAGENET)
    assert _trainable(model) == V1_REFERENCE[groups]
    if groups in V1_MACS:
        assert count_macs(model) == pytest.approx(V1_MACS[groups], rel=0.01)


@REAL_SIZE
def test_v1_quarter_width_params_match_osmr():
    model = ShuffleNetV1(0.25, 3, input_shape=IMAGENET)
    assert _trainable(model) == 305_902
    channels = [model.get_layer(f"stage{s}_unit2_conv2").filters for s in (2, 3, 4)]
    assert model.get_layer("stem_conv").filters == 6 and channels == [60, 120, 240]


@REAL_SIZE
@pytest.mark.parametrize("width", sorted(V2_CIFAR_REFERENCE))
def test_v2_cifar_params_match_reference(width):
    model = ShuffleNetV2(width, input_shape=CIFAR, classes=10)
    assert "stem_pool" not in [layer.name for layer in model.layers]
    assert model.get_layer("stem_conv").strides == (1, 1)
    assert _trainable(model) == V2_CIFAR_REFERENCE[width]


def _v2_shuffles(width):
    """(N, pixels) of each v2 shuffle at 224x224: after each unit, stage sides 28, 14, 7."""
    return [
        (n, side * side)
        for n, side, repeats in zip(V2_STAGES[width], (28, 14, 7), (4, 8, 4), strict=True)
        for _ in range(repeats)
    ]


def _v1_g3_shuffles():
    """(N, pixels) of each v1 g3 1.0x shuffle at 224x224: N = stage width // 4, before the
    depthwise conv (unit 1 at the stage's input side 56, 28, 14; the others halved)."""
    out = []
    for width, side, repeats in zip((240, 480, 960), (56, 28, 14), (4, 8, 4), strict=True):
        out += [(width // 4, side * side)] + [(width // 4, (side // 2) ** 2)] * (repeats - 1)
    return out


@REAL_SIZE
@pytest.mark.parametrize(
    "build_manual, build_auto, shuffles",
    [
        (
            lambda: ShuffleNetV2(1.0, input_shape=IMAGENET),
            lambda: AutoShuffleNetV2(1.0, input_shape=IMAGENET),
            _v2_shuffles(1.0),
        ),
        (
            lambda: ShuffleNetV1(1.0, 3, input_shape=IMAGENET),
            lambda: AutoShuffleNetV1(1.0, 3, input_shape=IMAGENET),
            _v1_g3_shuffles(),
        ),
    ],
    ids=["v2_x1_0", "v1_g3_x1_0"],
)
def test_auto_adds_n_squared_then_hardens_to_manual(build_manual, build_auto, shuffles):
    manual, auto = build_manual(), build_auto()
    extra_params = sum(n * n for n, _ in shuffles)
    extra_macs = sum(n * n * pixels for n, pixels in shuffles)
    assert [layer.matrix.shape[0] for layer in shuffle_layers(auto)] == [n for n, _ in shuffles]
    assert _trainable(auto) == _trainable(manual) + extra_params
    assert count_macs(auto) == count_macs(manual) + extra_macs
    assert len(auto.losses) == len(shuffles)  # one l1-2 penalty per relaxed shuffle
    harden_model(auto)
    assert _trainable(auto) == _trainable(manual)
    assert count_macs(auto) == count_macs(manual)
    assert not auto.losses


@pytest.mark.tensorflow_only(
    reason="the builders' names, the same on every backend; the JAX run builds every family below"
)
def test_layer_names_and_shuffle_order():
    model = tiny_v2()
    names = [layer.name for layer in model.layers]
    for name in ("stem_conv", "stem_bn", "stem_relu", "head_conv", "head_bn", "head_relu"):
        assert name in names
    assert names[-2:] == ["avg_pool", "predictions"]
    expected = [
        f"stage{s}_unit{u}_shuffle"
        for s, r in zip((2, 3, 4), TINY_REPEATS, strict=True)
        for u in range(1, r + 1)
    ]
    assert [layer.name for layer in shuffle_layers(model)] == expected
    assert all(layer.groups == 2 for layer in shuffle_layers(model))
    v1 = tiny_v1(groups=8)
    assert [layer.name for layer in shuffle_layers(v1)] == expected
    assert all(layer.groups == 8 for layer in shuffle_layers(v1))
    # megvii: the first pointwise conv of stage 2 is not grouped, all others are.
    assert v1.get_layer("stage2_unit1_conv1").groups == 1
    assert v1.get_layer("stage3_unit2_conv1").groups == 8
    assert v1.get_layer("stage3_unit1_conv1").groups == 8
    assert v1.get_layer("stage2_unit1_concat") and v1.get_layer("stage3_unit2_add")
    # groups=1: no manual shuffle (megvii); "auto" learns one in every unit.
    assert shuffle_layers(tiny_v1(groups=1)) == []
    assert len(shuffle_layers(tiny_v1(groups=1, shuffle="auto"))) == TINY_UNITS


def _real(builder):
    """The real 0.5x net of `builder` (published repeats 4, 8, 4)."""
    return lambda **kwargs: builder(0.5, **kwargs)


@pytest.mark.tensorflow_only(reason="layer names and graph: one functional model on every backend")
@pytest.mark.parametrize(
    "build, repeats, family, stem, kwargs",
    [
        (tiny_v2, TINY_REPEATS, "v2", "cifar", {}),
        (tiny_v2, TINY_REPEATS, "v2", "imagenet", {"shuffle": "auto", "include_top": False,
                                                   "pooling": "avg"}),
        (tiny_v1, TINY_REPEATS, "v1", "cifar", {"groups": 1}),
        (tiny_v1, TINY_REPEATS, "v1", "imagenet", {"groups": 3, "shuffle": "auto",
                                                   "include_top": False}),
        (tiny_v2, TINY_REPEATS, "v2", "imagenet", {"padding": "same"}),
        # The published repeats, from the public builders.
        pytest.param(_real(ShuffleNetV2), (4, 8, 4), "v2", "cifar", {}, marks=REAL_SIZE),
        pytest.param(_real(AutoShuffleNetV1), (4, 8, 4), "v1", "imagenet",
                     {"groups": 3, "include_top": False}, marks=REAL_SIZE),
    ],
    ids=["v2", "auto_v2_avg", "v1_g1", "auto_v1_g3_no_top", "v2_same", "real_v2", "real_v1"],
)  # fmt: skip
def test_builders_name_layers_by_the_architecture_description(build, repeats, family, stem, kwargs):
    # Folding and balanced hardening find layers through this description only.
    shape = {"cifar": TINY_SHAPE, "imagenet": (32, 32, 3)}[stem]
    model = build(input_shape=shape, stem=stem, **kwargs)
    found = describe(model)
    assert found == Architecture(family, repeats)
    expected = layer_names(
        found,
        stem,
        include_top=kwargs.get("include_top", True),
        pooling=kwargs.get("pooling"),
        shuffles=bool(shuffle_layers(model)),
        pads=kwargs.get("padding", "torch") == "torch",
    )
    built = [layer.name for layer in model.layers if not isinstance(layer, layers.InputLayer)]
    assert sorted(built) == sorted(expected)
    assert describe(keras.Sequential([keras.Input((4,)), layers.Dense(2)])) is None


@pytest.mark.tensorflow_only(reason="layer names: the same on every backend (28 s of JAX builds)")
def test_every_name_in_the_naming_table_is_built_where_it_should_be():
    # The names folding, conversion, balanced hardening and the weights checks find
    # layers by are applications/architecture.py's; each must name a layer the builders
    # make (a renamed layer fails here, not in a module that looks it up).
    v2 = tiny_v2(input_shape=(32, 32, 3), stem="imagenet")
    v2_max = tiny_v2(include_top=False, pooling="max")
    v1 = tiny_v1(input_shape=(32, 32, 3), stem="imagenet", groups=3)
    v1_1 = tiny_v1(groups=1)
    names = {model.name: {layer.name for layer in model.layers} for model in (v2, v1)}
    for model in (v2, v1):
        assert set(arch.IMAGENET_STEM) <= names[model.name]
        assert arch.PREDICTIONS in names[model.name] and arch.AVG_POOL in names[model.name]
    assert set(arch.V2_HEAD) <= names[v2.name] and not set(arch.V2_HEAD) & names[v1.name]
    assert arch.MAX_POOL in {layer.name for layer in v2_max.layers}
    # Every unit part, in the family and unit kind that has it.
    for model, family in ((v2, "v2"), (v1, "v1")):
        for stage, units in describe(model).stages():
            for unit in range(1, units + 1):
                for part in arch.unit_parts(family, unit):
                    assert arch.unit_layer(stage, unit, part) in names[model.name]
    used = {p for family in arch.FAMILIES for unit in (1, 2) for p in arch.unit_parts(family, unit)}
    assert used == arch.UNIT_PARTS
    # A manual v1 with g = 1 has no shuffle: the one optional part.
    missing = {arch.unit_layer(2, 2, p) for p in arch.V1_OPTIONAL}
    assert not missing & {layer.name for layer in v1_1.layers}
    # torchvision's map names Keras layers of the table only.
    keras_names = {name for name, _ in torchvision.torchvision_modules().values()}
    real = layer_names(arch.Architecture("v2", arch.REPEATS), "imagenet")
    assert keras_names <= set(real)
    with pytest.raises(ValueError, match="Received: part='conv3'"):
        arch.unit_layer(2, 1, "conv3")


def test_batch_norm_matches_pytorch_defaults():
    model = tiny_v1(shuffle="auto")
    norms = [layer for layer in model.layers if isinstance(layer, layers.BatchNormalization)]
    assert norms and all(n.momentum == 0.9 and n.epsilon == 1e-5 for n in norms)
    convs = [layer for layer in model.layers if isinstance(layer, layers.Conv2D)]
    assert convs and not any(c.use_bias for c in convs)


@pytest.mark.parametrize(
    "build",
    [
        lambda: tiny_v2(classes=10),
        lambda: tiny_v2(shuffle="auto", classes=10),
        lambda: tiny_v1(groups=3, classes=10),
        lambda: tiny_v1(groups=3, shuffle="auto", classes=10),
        lambda: tiny_v1(groups=1, shuffle="auto", classes=10),
    ],
    ids=["v2", "auto_v2", "v1_g3", "auto_v1_g3", "auto_v1_g1"],
)
@pytest.mark.tensorflow_only(reason="tf.GradientTape")
def test_every_weight_gets_a_gradient(build):
    model = build()
    # v1 starts each residual branch at zero (gamma 0), which blocks the branch's gradients
    # at the very first step by design; any other gamma shows every weight is connected.
    for layer in model.layers:
        if isinstance(layer, layers.BatchNormalization):
            layer.gamma.assign(np.ones(layer.gamma.shape))
    x, y = _images(TINY_SHAPE, batch=4), np.array([0, 1, 2, 3])
    with tf.GradientTape() as tape:
        probs = model(x, training=True)
        loss = keras.losses.sparse_categorical_crossentropy(y, probs)
        loss = tf.reduce_mean(loss) + tf.add_n(model.losses or [tf.constant(0.0)])
    grads = tape.gradient(loss, model.trainable_weights)
    assert np.all(np.isfinite(probs)) and np.isfinite(float(loss))
    for weight, grad in zip(model.trainable_weights, grads, strict=True):
        assert grad is not None, weight.path
        grad = np.asarray(grad)
        assert np.all(np.isfinite(grad)) and np.any(grad != 0), weight.path


# Tiny nets: the v2 head's 64 channels on a 2 x 2 map (16 / 8), v1 g3's stage 4 (120).
@pytest.mark.parametrize("pooling, shape", [(None, (2, 2, 64)), ("avg", (64,)), ("max", (64,))])
def test_no_top_with_each_pooling(pooling, shape):
    model = tiny_v2(include_top=False, pooling=pooling)
    assert model.output.shape[1:] == shape
    assert model(_images(TINY_SHAPE)).shape[1:] == shape
    v1 = tiny_v1(include_top=False, pooling=pooling)
    assert v1.output.shape[-1] == 120


def test_no_top_default_input_is_any_size():
    model = tiny_v1(include_top=False, input_shape=None)
    assert tuple(model.input.shape[1:]) == (None, None, 3)
    assert "stem_pool" in [layer.name for layer in model.layers]  # unknown size: imagenet
    assert model(_images((64, 96, 3))).shape == (2, 2, 3, 120)
    assert tiny_v2(input_shape=None).input.shape[1:] == IMAGENET


def test_custom_input_tensor():
    inputs = keras.Input((40, 48, 3))
    x = layers.Rescaling(1 / 255.0)(inputs)
    model = tiny_v2(shuffle="auto", input_tensor=x, classes=7)
    assert model.inputs[0] is inputs and model.output.shape == (None, 7)
    out = keras.ops.convert_to_numpy(model(np.full((2, 40, 48, 3), 255.0, "float32")))
    assert out.shape == (2, 7) and np.allclose(np.sum(out, axis=-1), 1.0, atol=1e-5)


@pytest.mark.parametrize(
    "shape",
    [
        (32, 48, 1),
        # Other sides and channel counts: the same layers (the JAX run checks the first).
        *(
            pytest.param(shape, marks=pytest.mark.tensorflow_only(reason="as (32, 48, 1)"))
            for shape in [(40, 24, 4), (48, 96, 3)]
        ),
    ],
)
def test_channels_and_non_square_inputs(shape):
    for model in (
        tiny_v1(groups=3, input_shape=shape, classes=5),
        tiny_v2(shuffle="auto", input_shape=shape, classes=5),
    ):
        out = keras.ops.convert_to_numpy(model(_images(shape)))
        assert out.shape == (2, 5) and np.all(np.isfinite(out))


@pytest.mark.parametrize(
    "shape, stem, has_pool",
    [
        ((64, 64, 3), "auto", False),
        ((65, 64, 3), "auto", True),
        ((64, 64, 3), "imagenet", True),
        ((224, 224, 3), "cifar", False),
    ],
)
def test_stem_choice(shape, stem, has_pool):
    model = tiny_v2(input_shape=shape, stem=stem)
    assert ("stem_pool" in [layer.name for layer in model.layers]) == has_pool
    assert model.get_layer("stem_conv").strides == ((2, 2) if has_pool else (1, 1))


INVALID = [
    (ShuffleNetV2, {"width": 0.7}, "width=0.7"),
    (ShuffleNetV2, {"width": 0.25}, "width=0.25"),
    (ShuffleNetV2, {"width": True}, "width=True"),
    (ShuffleNetV1, {"width": 3.0}, "width=3.0"),
    (ShuffleNetV1, {"groups": 5}, "groups=5"),
    (ShuffleNetV1, {"groups": "3"}, "groups='3'"),
    (AutoShuffleNetV1, {"groups": 0}, "groups=0"),
    (AutoShuffleNetV2, {"shuffle": "random"}, "shuffle='random'"),
    (AutoShuffleNetV2, {"penalty": -1.0}, "penalty=-1.0"),
    (AutoShuffleNetV2, {"penalty": "high"}, "penalty='high'"),
    (AutoShuffleNetV1, {"penalty": float("nan")}, "penalty=nan"),
    (ShuffleNetV2, {"stem": "tiny"}, "stem='tiny'"),
    (AutoShuffleNetV2, {"sinkhorn_iterations": 0}, "sinkhorn_iterations=0"),
    (AutoShuffleNetV1, {"sinkhorn_iterations": 1001}, "sinkhorn_iterations=1001"),
    (AutoShuffleNetV2, {"sinkhorn_iterations": 2.5}, "sinkhorn_iterations=2.5"),
    (ShuffleNetV2, {"include_top": False, "pooling": "sum"}, "pooling='sum'"),
    (ShuffleNetV2, {"include_top": "yes"}, "include_top='yes'"),
    (ShuffleNetV2, {"classes": 0}, "classes=0"),
    (ShuffleNetV1, {"classes": 2.5}, "classes=2.5"),
    (ShuffleNetV2, {"classifier_activation": "nope"}, "classifier_activation='nope'"),
    (ShuffleNetV2, {"weights": "imagenet"}, "weights='imagenet'"),
    (ShuffleNetV1, {"weights": "/nonexistent/model.weights.h5"}, "weights='/nonexistent"),
    (ShuffleNetV2, {"input_shape": (32, 32)}, "input_shape=(32, 32)"),
    (ShuffleNetV2, {"input_shape": "rgb"}, "input_shape='rgb'"),
    (ShuffleNetV2, {"input_shape": (32, 32, None)}, "input_shape=(32, 32, None)"),
    (ShuffleNetV1, {"input_shape": (16, 16, 3), "stem": "imagenet"}, "input_shape=(16, 16, 3)"),
    (ShuffleNetV2, {"input_shape": (4, 4, 3)}, "input_shape=(4, 4, 3)"),
    (ShuffleNetV2, {"input_tensor": np.zeros((1, 32, 32, 3))}, "input_tensor=ndarray"),
    (
        ShuffleNetV2,
        {"input_tensor": keras.Input((32, 32, 3)), "input_shape": (64, 64, 3)},
        "input_shape=(64, 64, 3)",
    ),
]


@pytest.mark.parametrize("builder, kwargs, received", INVALID, ids=[i[2] for i in INVALID])
def test_invalid_arguments_raise(builder, kwargs, received):
    if "input_shape" not in kwargs and "input_tensor" not in kwargs:
        kwargs = {"input_shape": CIFAR, **kwargs}
    with pytest.raises(ValueError, match="Received: " + re.escape(received)):
        builder(**kwargs)


PUBLIC_BUILDERS = [ShuffleNetV1, AutoShuffleNetV1, ShuffleNetV2, AutoShuffleNetV2]


def _builder_arguments(builder):
    """The arguments a builder takes after its family's own: all of `COMMON_ARGUMENTS` for
    `AutoShuffleNet*`, those but the learned shuffles' for the manual builders."""
    learned_only = () if builder.__name__.startswith("Auto") else arguments.MANUAL_SHUFFLE_ARGUMENTS
    return [name for name in arguments.COMMON_ARGUMENTS if name not in learned_only]


@pytest.mark.parametrize("builder", [ShuffleNetV1, ShuffleNetV2], ids=lambda b: b.__name__)
@pytest.mark.parametrize("name", list(arguments.MANUAL_SHUFFLE_ARGUMENTS))
def test_manual_builders_take_no_learned_shuffle_argument(builder, name):
    # Issue 41: the model-zoo builders take what a user of keras.applications needs; the
    # learned shuffles' knobs are AutoShuffleNetV1/V2's, which also build manual shuffles.
    value = "auto" if name == "shuffle" else arguments.MANUAL_SHUFFLE_ARGUMENTS[name]
    match = rf"takes no `{name}`.*`Auto{builder.__name__}`.*Received: {name}={value!r}"
    with pytest.raises(TypeError, match=match):
        builder(**{name: value})
    assert "AutoShuffleNet" in builder.__doc__


@pytest.mark.parametrize("builder", PUBLIC_BUILDERS, ids=lambda b: b.__name__)
def test_public_builders_show_every_argument(builder):
    # `help()` shows each keyword argument with its default, and the docstring (written in
    # the source, shared text repeated) describes every one and no other.
    signature = inspect.signature(builder)
    own = ["width", "groups"] if "V1" in builder.__name__ else ["width"]
    assert list(signature.parameters) == own + _builder_arguments(builder)
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in signature.parameters.values())
    assert signature.return_annotation is keras.Model
    assert all(p.annotation is not p.empty for p in signature.parameters.values())
    learned = builder.__name__.startswith("Auto")
    if learned:
        assert signature.parameters["shuffle"].default == "auto"
        assert signature.parameters["sinkhorn_iterations"].default == 10
    text = pydoc.render_doc(builder, renderer=pydoc.plaintext)
    assert f"{builder.__name__}(width: float = 1.0, " in text
    arguments_section = inspect.getdoc(builder).split("\nArgs:\n")[1].split("\n\n")[0]
    documented = re.findall(r"^    (\w+): \S", arguments_section, re.MULTILINE)
    assert sorted(documented) == sorted(signature.parameters)
    prefix = ("auto" if learned else "") + ("shufflenet_v1" if own[1:] else "shufflenet_v2")
    assert f"e.g. `{prefix}_" in " ".join(builder.__doc__.split())
    assert "AutoShuffleNet" in builder.__doc__ and "Returns:" in builder.__doc__


def test_public_builders_bind_arguments_as_a_written_out_def():
    with pytest.raises(
        TypeError, match=r"^ShuffleNetV2\(\) got an unexpected keyword argument 'widht'"
    ):
        ShuffleNetV2(widht=1.0)
    with pytest.raises(
        TypeError, match=r"^AutoShuffleNetV1\(\) got multiple values for argument 'width'"
    ):
        AutoShuffleNetV1(1.0, width=0.5)
    with pytest.raises(ValueError, match="Received: groups=5"):
        ShuffleNetV1(1.0, 5, input_shape=CIFAR)  # positional, in the signature's order


def test_public_builders_are_written_out_defs_sharing_their_common_arguments():
    # Explicit `def`s, as keras.applications writes them: IDEs, type checkers and
    # mkdocstrings read the signature from the source, not from a generated one.
    signatures = {}
    for builder in PUBLIC_BUILDERS:
        assert "__signature__" not in vars(builder)
        # The manual builders' one decorator refuses the learned shuffles' arguments by name.
        source = inspect.getsource(builder).removeprefix("@arguments.manual_only\n")
        assert source.startswith(f"def {builder.__name__}(\n")
        code = inspect.unwrap(builder).__code__
        assert code.co_varnames[: code.co_argcount] == tuple(inspect.signature(builder).parameters)
        signatures[builder.__name__] = inspect.signature(builder).parameters
    # The arguments both families take: same order, same defaults (but `shuffle`).
    common_args = {}
    for name, parameters in signatures.items():
        own = 2 if "V1" in name else 1
        builder = next(b for b in PUBLIC_BUILDERS if b.__name__ == name)
        assert list(parameters)[own:] == _builder_arguments(builder), name
        defaults = {k: p.default for k, p in parameters.items() if k in arguments.COMMON_ARGUMENTS}
        if name.startswith("Auto"):
            assert defaults.pop("shuffle") == "auto"
            # The manual builders build with the learned builders' defaults.
            manual = {**arguments.MANUAL_SHUFFLE_ARGUMENTS}
            del manual["shuffle"]
            assert manual.items() <= defaults.items(), name
        common_args[name] = defaults
    assert common_args["AutoShuffleNetV1"] == common_args["AutoShuffleNetV2"]
    shared = {
        k: v for k, v in common_args["AutoShuffleNetV2"].items() if k in common_args["ShuffleNetV2"]
    }
    assert common_args["ShuffleNetV1"] == common_args["ShuffleNetV2"] == shared
    v1, v2 = signatures["ShuffleNetV1"], signatures["ShuffleNetV2"]
    assert (v1["width"].default, v1["groups"].default, v2["width"].default) == (1.0, 3, 1.0)
    # One default for the Sinkhorn passes: the builders', the layer's, the constraint's.
    assert common_args["AutoShuffleNetV2"]["sinkhorn_iterations"] == 10
    assert RelaxedShuffle().sinkhorn_iterations == 10
    assert RelaxedShuffle().constraint.sinkhorn_iterations == 10


@pytest.mark.tensorflow_only(reason="model names: the same on every backend")
def test_default_model_names():
    assert tiny_v1().name == "shufflenet_v1_g3_x1_0"
    assert tiny_v1(shuffle="auto", groups=8).name == "autoshufflenet_v1_g8_x1_0"
    assert tiny_v2(width=0.5).name == "shufflenet_v2_x0_5"
    assert tiny_v2(shuffle="auto").name == "autoshufflenet_v2_x1_0"


def test_v1_docstring_says_what_the_widths_do():
    # The text said widths truncate and that g8 at 0.25x raises; they round (`v1_channels`)
    # and every pair builds (`test_every_rounded_v1_width_and_groups_pair_builds`).
    text = " ".join(ShuffleNetV1.__doc__.split())
    assert "truncat" not in text and "raise" not in text
    assert "round it to the nearest multiple of 4 x groups" in text
    assert "every pair builds" in text


@REAL_SIZE
@pytest.mark.slow
def test_every_rounded_v1_width_and_groups_pair_builds():
    # The pairs outside megvii's tables and the 1.0x rows: widths rounded to 4 * groups.
    for groups in (1, 2, 4, 8):
        for width in V1_WIDTHS:
            if width == 1.0 or (groups, width) in MEGVII_CONFIGS:
                continue
            model = ShuffleNetV1(width, groups, include_top=False, input_shape=CIFAR)
            assert model.output.shape[-1] % (4 * groups) == 0


def test_weights_path_loads(tmp_path):
    kwargs = {"shuffle": "auto", "classes": 10, "classifier_activation": None}
    model = tiny_v2(**kwargs)
    path = str(tmp_path / "v2.weights.h5")
    model.save_weights(path)
    x = _images(TINY_SHAPE)
    keras.utils.set_random_seed(99)  # other initial weights for the next models
    fresh = tiny_v2(**kwargs)
    loaded = tiny_v2(weights=path, **kwargs)
    assert np.abs(_logits(fresh, x) - _logits(model, x)).max() > 0.1
    np.testing.assert_allclose(_logits(loaded, x), _logits(model, x), atol=1e-5)


def test_learned_weights_are_refused_by_a_manual_model(tmp_path):
    # Keras loaded an AutoShuffleNetV2 weights file into ShuffleNetV2 silently, dropping
    # the learned matrices (the manual shuffles have no variables).
    relaxed = str(tmp_path / "auto_v2.weights.h5")
    tiny_v2(shuffle="auto", classes=10).save_weights(relaxed)
    assert pretrained.learned_shuffles_in_file(relaxed) == TINY_UNITS
    # Hardened (no variables left, the permutations are in the config) and .keras files.
    inputs = keras.Input((4, 4, 6))
    tiny = keras.Model(inputs, RelaxedShuffle(seed=0)(inputs))
    harden_model(tiny)
    hardened, whole = str(tmp_path / "hardened.weights.h5"), str(tmp_path / "hardened.keras")
    tiny.save_weights(hardened)
    tiny.save(whole)
    for path in (relaxed, hardened, whole):
        received = "Received: weights=" + re.escape(repr(path))
        with pytest.raises(ValueError, match="learned shuffles.*" + received):
            tiny_v2(weights=path, classes=10)
    manual = keras.Model(inputs, ChannelShuffle(2)(inputs))
    manual.save_weights(str(tmp_path / "manual.weights.h5"))
    assert pretrained.learned_shuffles_in_file(str(tmp_path / "manual.weights.h5")) == 0


def test_weights_file_that_is_not_hdf5_is_named(tmp_path):
    path = tmp_path / "broken.weights.h5"
    path.write_text("not an HDF5 file")
    with pytest.raises(ValueError, match=f"{re.escape(str(path))} cannot be read as one"):
        ShuffleNetV2(0.5, weights=str(path), input_shape=CIFAR)
    with pytest.raises(ValueError, match="Received: weights="):
        AutoShuffleNetV2(0.5, weights=str(path), input_shape=CIFAR)


@pytest.mark.parametrize(
    "build",
    [
        lambda: tiny_v1(groups=3, classes=10, classifier_activation=None),
        lambda: tiny_v2(
            shuffle="auto", classes=10, classifier_activation=None, sinkhorn_iterations=3
        ),
    ],
    ids=["manual_v1", "auto_v2"],
)
def test_keras_file_round_trip_safe_mode(build, tmp_path):
    model = build()
    x = _images(TINY_SHAPE)
    stages = (
        ["relaxed", "hardened"]
        if any(isinstance(s, RelaxedShuffle) for s in shuffle_layers(model))
        else ["manual"]
    )
    for stage in stages:
        if stage == "hardened":
            harden_model(model)
        path = str(tmp_path / f"{stage}.keras")
        model.save(path)
        loaded = keras.saving.load_model(path, safe_mode=True)
        np.testing.assert_allclose(_logits(loaded, x), _logits(model, x), atol=1e-5)
        assert _trainable(loaded) == _trainable(model)
        for mine, theirs in zip(shuffle_layers(model), shuffle_layers(loaded), strict=True):
            assert type(mine) is type(theirs) and mine.name == theirs.name
            np.testing.assert_array_equal(mine.permutation, theirs.permutation)
            if stage == "relaxed":  # the builder's constraint passes per step are kept
                assert (
                    mine.constraint.sinkhorn_iterations
                    == theirs.constraint.sinkhorn_iterations
                    == 3
                )


CHANNELS_FIRST_REFUSED = (
    "channels_first ShuffleNets cannot run here.*Received: image_data_format='channels_first'"
)


def test_channels_first_matches_channels_last():
    x = _images(TINY_SHAPE)
    kwargs = {"classes": 10, "classifier_activation": None}
    channels_first = (3, *TINY_SHAPE[:2])
    last = tiny_v2(shuffle="auto", **kwargs)
    last_v1 = tiny_v1(groups=3, **kwargs)
    keras.config.set_image_data_format("channels_first")
    if not arguments.channels_first_supported():  # TF on a CPU without oneDNN
        with pytest.raises(ValueError, match=CHANNELS_FIRST_REFUSED):
            tiny_v2(shuffle="auto", input_shape=channels_first, **kwargs)
        return
    first = tiny_v2(shuffle="auto", input_shape=channels_first, **kwargs)
    first_v1 = tiny_v1(groups=3, input_shape=channels_first, **kwargs)
    x_first = np.transpose(x, (0, 3, 1, 2))
    for a, b in ((first, last), (first_v1, last_v1)):
        a.set_weights(b.get_weights())  # kernels and matrices do not depend on the layout
        np.testing.assert_allclose(_logits(a, x_first), _logits(b, x), atol=1e-4)
        assert count_macs(a) == count_macs(b)


@pytest.mark.parametrize("builder", [ShuffleNetV1, AutoShuffleNetV2])
def test_channels_first_is_refused_where_the_backend_cannot_run_it(monkeypatch, builder):
    # As on a CPU without AVX-512: TensorFlow runs without oneDNN and its Conv2D kernel
    # fails at call time, deep in TF, on NCHW.
    monkeypatch.setattr(arguments, "channels_first_supported", lambda: False)
    keras.config.set_image_data_format("channels_first")
    with pytest.raises(ValueError, match=CHANNELS_FIRST_REFUSED):
        builder(input_shape=(3, 32, 32), classes=10)
    keras.config.set_image_data_format("channels_last")
    arguments.check_image_data_format()  # channels_last never needs the probe


def test_channels_first_probe_agrees_with_a_real_conv2d():
    arguments.channels_first_supported.cache_clear()
    conv = layers.Conv2D(2, 1, data_format="channels_first")
    try:
        conv(np.ones((1, 2, 3, 3), dtype="float32"))
        runs = True
    except tf.errors.OpError:
        runs = False
    assert arguments.channels_first_supported() is runs


@pytest.mark.slow
@pytest.mark.tensorflow_only(reason="TensorFlow's CPU kernels, in a subprocess")
def test_channels_first_refused_by_tensorflow_without_onednn():
    # TF_ENABLE_ONEDNN_OPTS=0 gives TensorFlow's plain CPU kernels, as on CPUs without
    # AVX-512: a channels_first Conv2D fails there, and the builder says so up front.
    if not arguments.channels_first_supported():  # this process runs them already
        keras.config.set_image_data_format("channels_first")
        with pytest.raises(ValueError, match=CHANNELS_FIRST_REFUSED):  # not TF's error
            ShuffleNetV2(0.5, input_shape=(3, 32, 32), classes=10)
        return  # a child would cost TensorFlow's import (some 11 CPU-s) for the same check
    script = (
        "import keras\n"
        "keras.config.set_image_data_format('channels_first')\n"
        "from keras_autoshuffle.applications import ShuffleNetV2, arguments\n"
        "print('supported:', arguments.channels_first_supported())\n"
        "ShuffleNetV2(0.5, input_shape=(3, 32, 32), classes=10)\n"
    )
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("KERAS_BACKEND", None)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    output = result.stdout + result.stderr
    if "supported: True" in output:
        pytest.skip("channels_first convolutions run here even without oneDNN (a GPU)")
    assert "supported: False" in output, output[-3000:]
    assert result.returncode != 0
    assert re.search(CHANNELS_FIRST_REFUSED, output), output[-3000:]
    assert "UnimplementedError" not in output


@REAL_SIZE
def test_count_macs_on_another_input_size():
    model = ShuffleNetV2(1.0, include_top=False)
    with pytest.raises(ValueError, match="input_shape"):
        count_macs(model)
    # torchvision's 224x224 figure, less the 1024 x 1000 classifier.
    assert count_macs(model, IMAGENET) == pytest.approx(144.91e6 - 1024 * 1000, rel=0.01)


def test_mixed_precision_forward():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = tiny_v2(shuffle="auto", classes=10)
    assert model.get_layer("stage2_unit1_conv1").compute_dtype == "bfloat16"
    out = keras.ops.convert_to_numpy(keras.ops.cast(model(_images(TINY_SHAPE)), "float32"))
    assert np.all(np.isfinite(out))


def test_preprocess_input_matches_torchvision_normalisation():
    images = np.random.default_rng(0).uniform(0, 255, (2, 5, 6, 3)).astype("float32")
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    expected = (images / 255.0 - mean) / std
    np.testing.assert_allclose(preprocess_input(images), expected, rtol=1e-5, atol=1e-5)
    first = preprocess_input(np.transpose(images, (0, 3, 1, 2)), data_format="channels_first")
    np.testing.assert_allclose(np.transpose(first, (0, 2, 3, 1)), expected, rtol=1e-5, atol=1e-5)
    single = preprocess_input(images[0].astype("uint8"))
    np.testing.assert_allclose(single, (images[0].astype("uint8") / 255.0 - mean) / std, atol=1e-5)
    with pytest.raises(ValueError, match="x.shape"):
        preprocess_input(np.zeros((2, 5, 5, 4)))
    with pytest.raises(ValueError, match="data_format='nhwc'"):
        preprocess_input(images, data_format="nhwc")


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(filters=12, kernel_size=1, groups=3),
        dict(filters=8, kernel_size=3, strides=2, groups=4),
        dict(filters=6, kernel_size=3, dilation_rate=2, groups=2, use_bias=True),
    ],
)
@pytest.mark.tensorflow_only(reason="GroupedConv2D's TensorFlow kernels, tf.GradientTape")
def test_grouped_conv_matches_keras_conv2d_and_its_gradients(kwargs):
    # Keras's own Conv2D (XLA on the TF backend) is the reference.
    x = tf.constant(np.random.default_rng(0).normal(size=(2, 9, 9, 12)), tf.float32)
    ours = GroupedConv2D(padding="same", **kwargs)
    reference = layers.Conv2D(padding="same", **kwargs)
    ours.build(x.shape)
    reference.build(x.shape)
    reference.set_weights(
        [np.random.default_rng(1).normal(size=w.shape) for w in ours.get_weights()]
    )
    ours.set_weights(reference.get_weights())
    results = []
    for layer in (ours, reference):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x)
            loss = tf.reduce_sum(y * tf.sin(y))
        results.append([y, *tape.gradient(loss, [x, *layer.trainable_weights])])
    for got, want in zip(*results, strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)
    restored = GroupedConv2D.from_config(ours.get_config())
    assert restored.get_config() == ours.get_config()


def test_v1_basic_units_start_as_the_identity():
    # gamma 0 on the branch's last BN: relu(x + 0) = x for the (non-negative) unit input.
    model = tiny_v1(groups=3, classes=10)
    names = ["stage3_unit1_concat", "stage3_unit2_relu2", "stage4_unit1_concat"]
    probe = keras.Model(model.inputs, [model.get_layer(n).output for n in names])
    before, after, later = probe(_images(TINY_SHAPE, batch=2), training=False)
    before, after, later = (keras.ops.convert_to_numpy(t) for t in (before, after, later))
    np.testing.assert_array_equal(after, before)
    assert float(np.abs(later).max()) > 0
    gammas = [np.asarray(model.get_layer(f"stage3_unit{u}_bn2").gamma) for u in (1, 2)]
    assert np.all(gammas[0] == 1) and np.all(gammas[1] == 0)


def layer_configs(model):
    """Every layer's config as JSON (NumPy scalars would not serialize), the input's aside."""
    return [json.dumps(layer.get_config()) for layer in model.layers[1:]]


@pytest.mark.tensorflow_only(reason="argument checks, not computation")
def test_numpy_numbers_are_accepted_as_python_ones():
    # A value read from an array or a config (`np.int64(3)`) is an integer too.
    i = np.int64
    plain = AutoShuffleNetV1(
        0.5, 3, classes=10, shuffle="auto", sinkhorn_iterations=3, input_shape=CIFAR
    )
    numpy = AutoShuffleNetV1(
        np.float32(0.5),
        i(3),
        classes=i(10),
        shuffle="auto",
        sinkhorn_iterations=i(3),
        input_shape=tuple(i(d) for d in CIFAR),
    )
    assert numpy.name == plain.name == "autoshufflenet_v1_g3_x0_5"
    assert layer_configs(numpy) == layer_configs(plain)  # plain ints all through
    tiny = tiny_v2(
        classes=i(10),
        channels=tuple(i(c) for c in TINY_V2_CHANNELS),
        repeats=tuple(i(r) for r in TINY_REPEATS),
    )
    assert layer_configs(tiny) == layer_configs(tiny_v2(classes=10))
    assert ShuffleNetV2(i(1), input_shape=CIFAR).name == "shufflenet_v2_x1_0"
    with pytest.raises(ValueError, match="Received: groups=np.True_"):
        ShuffleNetV1(groups=np.bool_(True), input_shape=CIFAR)
