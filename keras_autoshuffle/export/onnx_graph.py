"""A channels-first ONNX graph written straight from a Keras model's layers and weights.

Keras's own `Model.export(format="onnx")` (tf2onnx) keeps the model's NHWC layout and
wraps the convolutions in transposes; ONNX Runtime and OpenVINO then pay for that layout
(measured: ShuffleNet v2 1.0x without any shuffle tied torchvision's NCHW graph with its
shuffles). `onnx_graph` writes the same network in NCHW, as torchvision's graphs are:
one Transpose of the NHWC input, then each layer as its ONNX op with its weights, every
BatchNormalization after a convolution folded into it, each padding into the op it pads,
and nested concatenations (LiteRT's 4-input limit, `folding._concat`) merged. The inputs
and outputs are those of the Keras model (NHWC images in).

It takes the layers of this package's ShuffleNet v1/v2 nets (manual, hardened, folded:
`onnx_support.LAYERS`); `unsupported_layers` (re-exported here) names any other, for which
the caller falls back to Keras's exporter.
"""

from typing import TYPE_CHECKING

import keras
import numpy as np

from keras_autoshuffle._keras_internals import inbound_nodes, producing_layer
from keras_autoshuffle.export.litert_graph import _readers
from keras_autoshuffle.export.onnx_align import align_channels
from keras_autoshuffle.export.onnx_support import (  # noqa: F401 (re-exported)
    ACTIVATIONS,
    CONVS,
    POOLS,
    activation_name,
    unsupported_layers,
)
from keras_autoshuffle.layers import RelaxedShuffle, shuffle_permutation
from keras_autoshuffle.unit_layers import ChannelShuffle, ChannelSlice, ChannelSplit

if TYPE_CHECKING:
    import onnx

OPSET = 17


def _same_pads(size, kernel, stride):
    """(begin, end) of TensorFlow's 'same' padding along one side."""
    total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


class _Writer:
    """Accumulates nodes and initializers, and what a written layer leaves to the next
    ones (a folded or merged tensor, pads to merge); tensors are named by their Keras
    tensors."""

    def __init__(self, model):
        from onnx import helper

        self.helper, self.nodes, self.weights, self.names = helper, [], [], {}
        self.consumers = _readers(model)
        self.skip = {}  # id(Keras tensor) -> the tensor it stands for (folded BN, merged pad)
        self.pending_pads = {}  # id(padded tensor) -> ((top, bottom), (left, right))
        self.split_done = set()  # tensors whose ChannelSlices are written (one Split each)

    def name(self, tensor):
        return self.names.setdefault(id(tensor), f"t{len(self.names)}")

    def constant(self, name, array):
        from onnx import numpy_helper

        self.weights.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op, inputs, outputs, name, **attributes):
        self.nodes.append(self.helper.make_node(op, inputs, outputs, name=name, **attributes))
        return outputs[0]

    def only_consumer(self, tensor, kind):
        layers = self.consumers.get(id(tensor), [])
        return layers[0] if len(layers) == 1 and isinstance(layers[0], kind) else None


def _conv(w, layer, x, out, pads):
    """Conv (+ folded BatchNormalization, + activation) in NCHW."""
    kernel = keras.ops.convert_to_numpy(layer.kernel).astype(np.float64)
    if isinstance(layer, keras.layers.DepthwiseConv2D):
        # (kh, kw, channels, multiplier) -> (channels * multiplier, 1, kh, kw)
        kh, kw, c, m = kernel.shape
        kernel, groups = kernel.reshape(kh, kw, c * m, 1).transpose(2, 3, 0, 1), c
    else:
        kernel, groups = kernel.transpose(3, 2, 0, 1), layer.groups
    bias = np.zeros(kernel.shape[0])
    if layer.use_bias:
        bias = keras.ops.convert_to_numpy(layer.bias).astype(np.float64)
    output = inbound_nodes(layer)[0].output_tensors[0]
    bn = w.only_consumer(output, keras.layers.BatchNormalization)
    fused = bn is not None and activation_name(layer) == "linear" and bn.axis in (-1, 3)
    if fused:
        scale, shift = _bn_affine(bn)
        kernel, bias = kernel * scale[:, None, None, None], bias * scale + shift
        output = inbound_nodes(bn)[0].output_tensors[0]
    y = w.node(
        "Conv",
        [
            x,
            w.constant(f"{layer.name}_w", kernel.astype("float32")),
            w.constant(f"{layer.name}_b", bias.astype("float32")),
        ],
        [out if activation_name(layer) == "linear" else f"{out}_pre"],
        layer.name,
        kernel_shape=list(kernel.shape[2:]),
        strides=list(layer.strides),
        pads=_onnx_pads(pads),
        group=groups,
    )
    if activation_name(layer) != "linear":
        y = w.node(ACTIVATIONS[activation_name(layer)], [y], [out], f"{layer.name}_act")
    return output if fused else None


def _bn_affine(bn):
    """(scale, shift) with `bn(x) = x * scale + shift`, in float64."""
    values = {v.path.split("/")[-1]: keras.ops.convert_to_numpy(v) for v in bn.weights}
    variance = values["moving_variance"].astype(np.float64)
    scale = values.get("gamma", np.ones_like(variance)) / np.sqrt(variance + bn.epsilon)
    shift = values.get("beta", np.zeros_like(variance)) - values["moving_mean"] * scale
    return scale, shift


def _onnx_pads(pads):
    """ONNX's [top, left, bottom, right] of ((top, bottom), (left, right))."""
    return [pads[0][0], pads[1][0], pads[0][1], pads[1][1]]


def _spatial_pads(layer, shape):
    """((top, bottom), (left, right)) of a conv or pooling layer on NHWC `shape`."""
    if layer.padding == "valid":
        return (0, 0), (0, 0)
    size = layer.kernel_size if hasattr(layer, "kernel_size") else layer.pool_size
    return tuple(_same_pads(shape[1 + i], size[i], layer.strides[i]) for i in range(2))


def onnx_graph(
    model: keras.Model, opset: int = OPSET, align: int | None = None
) -> "onnx.ModelProto":
    """The model as an NCHW `onnx.ModelProto`: NHWC input, one Transpose at the start (and
    one at the end for an image-shaped output), as the Keras model's inputs and outputs.

    Args:
        model: a single-input Keras model of the layers listed in the module docstring.
        opset: the ONNX opset.
        align: None, or a channel multiple (8) to pad convs to with zero channels for
            ONNX Runtime's blocked kernels (`onnx_align.align_channels`).

    Raises:
        ValueError: naming the layers it cannot write (`unsupported_layers`).
    """
    from onnx import TensorProto, checker, helper

    missing = unsupported_layers(model)
    if missing:
        raise ValueError(f"onnx_graph cannot write these layers: {missing}")
    w = _Writer(model)
    source = model.inputs[0]
    graph_input = helper.make_tensor_value_info(
        "input", TensorProto.FLOAT, ["batch", *source.shape[1:]]
    )
    w.node("Transpose", ["input"], [w.name(source)], "to_nchw", perm=[0, 3, 1, 2])
    for layer in model.operations:
        if not isinstance(layer, keras.layers.InputLayer):
            _write_layer(w, layer)
    result = model.outputs[0]
    name = w.name(w.skip.get(id(result), result))
    if result.ndim == 4:  # an image-shaped output goes back to the model's NHWC
        name = w.node("Transpose", [name], ["output"], "to_nhwc", perm=[0, 2, 3, 1])
    shape = ["batch", *result.shape[1:]]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)]
    graph = helper.make_graph(w.nodes, model.name, [graph_input], outputs, w.weights)
    proto = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="keras_autoshuffle"
    )
    _drop_unused(proto)
    if align:
        align_channels(proto, align)
    checker.check_model(proto)
    return proto


class _Call:
    """One layer call being written: its Keras node, its inputs (after `skip`) and the
    ONNX names of its inputs and outputs."""

    def __init__(self, w, layer, node, ins):
        self.layer, self.node, self.ins, self.name = layer, node, ins, layer.name
        self.xs = [w.name(t) for t in ins]
        self.outs = [w.name(t) for t in node.output_tensors]
        self.shape = ins[0].shape  # NHWC


def _write_layer(w, layer):
    """Appends the ONNX nodes of `layer`'s call (none where it is folded into another)."""
    node = inbound_nodes(layer)[0]
    ins = [w.skip.get(id(t), t) for t in node.input_tensors]
    if any(t is None for t in ins):  # folded into the previous op
        return
    write = next(write for kinds, write in _WRITERS if isinstance(layer, kinds))
    write(w, _Call(w, layer, node, ins))


def _write_zero_padding(w, call):
    """Into the consuming conv's or pool's own pads where that is exact, else a Pad."""
    (top, bottom), (left, right) = call.layer.padding
    output = call.node.output_tensors[0]
    consumer = w.only_consumer(output, (*CONVS, *POOLS))
    relu_in = isinstance(producing_layer(call.ins[0]), keras.layers.ReLU)
    if (
        consumer is not None
        and consumer.padding == "valid"
        and (not isinstance(consumer, keras.layers.MaxPooling2D) or relu_in)
    ):
        # Into the op's own pads: an average pool counting them (zeros), a max pool
        # of ReLU outputs (zeros change nothing there).
        w.skip[id(output)] = call.ins[0]
        w.pending_pads[id(output)] = ((top, bottom), (left, right))
        return
    pads = w.constant(f"{call.name}_pads", np.array([0, 0, top, left, 0, 0, bottom, right]))
    w.node("Pad", [call.xs[0], pads], call.outs, call.name)


def _write_conv(w, call):
    """A conv (its BatchNormalization folded in where it can be, `_conv`), padded by a
    ZeroPadding2D merged into it or by its own 'same' padding."""
    explicit = w.pending_pads.get(id(call.node.input_tensors[0]))
    pads = explicit or _spatial_pads(call.layer, call.shape)
    fused_output = _conv(w, call.layer, call.xs[0], call.outs[0], pads)
    if fused_output is not None:
        w.skip[id(fused_output)] = call.node.output_tensors[0]
        bn_layer = producing_layer(fused_output)
        w.skip[id(inbound_nodes(bn_layer)[0].input_tensors[0])] = None


def _write_batch_norm(w, call):
    """A BatchNormalization no conv took: x * scale + shift over the NCHW channels."""
    scale, shift = _bn_affine(call.layer)
    c, name = scale.shape[0], call.name
    s = w.constant(f"{name}_scale", scale.reshape(c, 1, 1).astype("float32"))
    b = w.constant(f"{name}_shift", shift.reshape(c, 1, 1).astype("float32"))
    scaled = w.node("Mul", [call.xs[0], s], [f"{call.outs[0]}_mul"], f"{name}_mul")
    w.node("Add", [scaled, b], call.outs, name)


def _write_relu(w, call):
    w.node("Relu", call.xs, call.outs, call.name)


def _write_pool(w, call):
    layer = call.layer
    explicit = w.pending_pads.get(id(call.node.input_tensors[0]))
    pads = explicit or _spatial_pads(layer, call.shape)
    extra = {}
    if isinstance(layer, keras.layers.AveragePooling2D):
        # Keras's 'same' averages over the pixels inside; ZeroPadding2D's are zeros.
        extra["count_include_pad"] = int(explicit is not None)
    w.node(
        "MaxPool" if isinstance(layer, keras.layers.MaxPooling2D) else "AveragePool",
        call.xs,
        call.outs,
        call.name,
        kernel_shape=list(layer.pool_size),
        strides=list(layer.strides),
        pads=_onnx_pads(pads),
        **extra,
    )


def _write_global_pool(w, call):
    pooled = w.node("GlobalAveragePool", call.xs, [f"{call.outs[0]}_4d"], call.name)
    w.node("Flatten", [pooled], call.outs, f"{call.name}_flatten")


def _write_dense(w, call):
    layer, name = call.layer, call.name
    kernel = keras.ops.convert_to_numpy(layer.kernel)
    bias = (
        keras.ops.convert_to_numpy(layer.bias)
        if layer.use_bias
        else np.zeros(kernel.shape[1], "float32")
    )
    activation = ACTIVATIONS[activation_name(layer)]
    y = w.node(
        "Gemm",
        [call.xs[0], w.constant(f"{name}_w", kernel), w.constant(f"{name}_b", bias)],
        [f"{call.outs[0]}_pre" if activation else call.outs[0]],
        name,
    )
    if activation:
        w.node(activation, [y], call.outs, f"{name}_act", **_axis_of(activation))


def _write_concat(w, call):
    axis = call.layer.axis % call.ins[0].ndim
    if call.ins[0].ndim == 4:  # NHWC axis -> NCHW axis
        axis = (0, 2, 3, 1)[axis]
    inputs = _flatten_concats(w, call.layer, call.xs)
    w.node("Concat", inputs, call.outs, call.name, axis=axis)


def _write_add(w, call):
    y, xs, name = call.xs[0], call.xs, call.name
    for k, other in enumerate(xs[1:]):
        last = k == len(xs) - 2
        y = w.node("Add", [y, other], [call.outs[0] if last else f"{name}{k}"], f"{name}{k}")


def _write_identity(w, call):
    w.skip[id(call.node.output_tensors[0])] = call.ins[0]  # an alias, no node


def _write_activation(w, call):
    activation = ACTIVATIONS[activation_name(call.layer)]
    w.node(activation or "Identity", call.xs, call.outs, call.name, **_axis_of(activation))


def _write_channel_split(w, call):
    half = call.shape[-1] // 2
    sizes = w.constant(f"{call.name}_sizes", np.array([half, half]))
    w.node("Split", [call.xs[0], sizes], call.outs, call.name, axis=1)


def _write_channel_slice(w, call):
    if call.xs[0] not in w.split_done:  # all slices of a tensor: one Split
        w.split_done.add(call.xs[0])
        _split_slices(w, call.node.input_tensors[0], call.xs[0], call.shape[-1])


def _write_gather(w, call):
    """A hardened RelaxedShuffle: a GATHER of the channels, on the NCHW channel axis counted
    from the end (-3 on images, -1 on vectors).

    Not `axis=1`: OpenVINO's "reverse input channels" fusion (`ric_fusion.cpp`, run when the
    CPU plugin compiles a model) takes a Gather of constant indices on a non-negative axis
    for a channel reorder and moves it into the weights of the convs reading it, and with
    OpenVINO 2026.4 computed `Conv2D -> Gather -> two Conv2D -> Concat` wrongly (by about
    the outputs' own size, in float32; ONNX Runtime exact on the same graph). That fusion
    skips negative axes; the same Gather, counted from the end, is then computed as it is.
    `test_export_hostile` checks OpenVINO against Keras on that case.
    """
    perm = w.constant(f"{call.name}_perm", shuffle_permutation(call.layer))
    axis = 1 - call.ins[0].ndim  # the NCHW axis 1
    w.node("Gather", [call.xs[0], perm], call.outs, call.name, axis=axis)


def _write_channel_shuffle(w, call):
    """ShuffleNet's shuffle as torchvision writes it: Reshape, Transpose, Reshape."""
    g, c, name, out = call.layer.groups, call.shape[-1], call.name, call.outs[0]
    grouped = w.node(
        "Reshape",
        [call.xs[0], w.constant(f"{name}_s1", np.array([0, g, c // g, -1]))],
        [f"{out}_g"],
        f"{name}_r1",
    )
    swapped = w.node("Transpose", [grouped], [f"{out}_t"], f"{name}_t", perm=[0, 2, 1, 3])
    sides = np.array([0, c, call.shape[1], call.shape[2]])
    w.node("Reshape", [swapped, w.constant(f"{name}_s2", sides)], call.outs, f"{name}_r2")


# (kinds, writer), tried in order: the first kind a layer is an instance of writes it.
_WRITERS = (
    (keras.layers.ZeroPadding2D, _write_zero_padding),
    (CONVS, _write_conv),
    (keras.layers.BatchNormalization, _write_batch_norm),
    (keras.layers.ReLU, _write_relu),
    (POOLS, _write_pool),
    (keras.layers.GlobalAveragePooling2D, _write_global_pool),
    (keras.layers.Dense, _write_dense),
    (keras.layers.Concatenate, _write_concat),
    (keras.layers.Add, _write_add),
    (keras.layers.Identity, _write_identity),
    (keras.layers.Activation, _write_activation),
    (ChannelSplit, _write_channel_split),
    (ChannelSlice, _write_channel_slice),
    (RelaxedShuffle, _write_gather),
    (ChannelShuffle, _write_channel_shuffle),
)


def _split_slices(w, tensor, name, channels):
    """The ChannelSlices of `tensor` as one Split along the channels (OpenVINO runs a Split
    faster than as many Slices; ONNX Runtime fuses them into one either way)."""
    slices = {}
    for layer in w.consumers[id(tensor)]:
        if isinstance(layer, ChannelSlice):
            slices[layer.start, layer.stop] = w.name(inbound_nodes(layer)[0].output_tensors[0])
    bounds = sorted({0, channels, *(b for pair in slices for b in pair)})
    pieces = list(zip(bounds, bounds[1:], strict=False))
    if len(slices) != sum(piece in slices for piece in pieces):  # overlapping slices
        for (start, stop), out in slices.items():
            consts = [
                w.constant(f"{out}_{k}", np.array([v]))
                for k, v in (("start", start), ("stop", stop), ("axis", 1))
            ]
            w.node("Slice", [name, *consts], [out], f"{out}_slice")
        return
    outs = [slices.get(piece, f"{name}_unused{piece[0]}") for piece in pieces]
    sizes = w.constant(f"{name}_split_sizes", np.diff(bounds))
    w.node("Split", [name, sizes], outs, f"{name}_split", axis=1)


def _axis_of(activation):
    return {"axis": -1} if activation == "Softmax" else {}


def _flatten_concats(w, layer, xs):
    """The inputs of a Concatenate, with those of nested Concatenates feeding only it."""
    flat = []
    for tensor, name in zip(inbound_nodes(layer)[0].input_tensors, xs, strict=True):
        inner = producing_layer(tensor)
        if (
            isinstance(inner, keras.layers.Concatenate)
            and inner.axis == layer.axis
            and len(w.consumers.get(id(tensor), [])) == 1
        ):
            flat.extend(next(n for n in w.nodes if n.output[0] == name).input)
        else:
            flat.append(name)
    return flat


def drop_unread_dequantize(proto: "onnx.ModelProto") -> int:
    """Removes from a quantized graph the DequantizeLinear nodes whose output nothing reads;
    returns how many.

    `onnx_align`'s zero channels leave a Split output that nothing reads. ONNX Runtime's
    quantizer still puts a QuantizeLinear / DequantizeLinear pair on it, and ONNX Runtime
    runs that dead DequantizeLinear (and the Transpose its layout pass puts before it) on
    every call: 10 of each in a folded v2 1.0x. The QuantizeLinear stays: without it ONNX
    Runtime runs the Split in float, between a DequantizeLinear and a QuantizeLinear per
    output.
    """
    graph = proto.graph
    read = _names_read(graph)
    dead = [
        node
        for node in graph.node
        if node.op_type == "DequantizeLinear" and not any(o in read for o in node.output)
    ]
    for node in dead:
        graph.node.remove(node)
    return len(dead)


def _names_read(graph):
    """The names `graph`'s nodes and outputs read, with those of its nodes' subgraphs (an If
    or Loop body reads outer names without listing them as its node's inputs)."""
    read = {o.name for o in graph.output}
    for node in graph.node:
        read.update(node.input)
        for attribute in node.attribute:
            subgraphs = [attribute.g] if attribute.HasField("g") else attribute.graphs
            for subgraph in subgraphs:
                read |= _names_read(subgraph)
    return read


def _drop_unused(proto):
    """Removes nodes whose outputs nothing reads (a merged Concatenate) and their weights."""
    graph = proto.graph
    while True:
        used = _names_read(graph)
        dead = [n for n in graph.node if not any(o in used for o in n.output)]
        if not dead:
            break
        for n in dead:
            graph.node.remove(n)
    used = _names_read(graph)
    for tensor in [t for t in graph.initializer if t.name not in used]:
        graph.initializer.remove(tensor)
