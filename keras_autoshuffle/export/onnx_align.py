"""Zero channels that let ONNX Runtime run every convolution in its fast blocked layout.

ONNX Runtime's CPU graph optimizer moves a Conv to its NCHWc kernels (MLAS; channel
blocks of 8 floats on AVX2, 16 on AVX-512) only when the channel counts fit the blocks.
ShuffleNet v2 1.0x's stage-2 branches have 58 channels: their convs stay on the slower
NCHW path (measured with ORT's profiler: 11 of 56 convs). `align_channels` pads a conv's
output with zero channels (zero weights and bias, so zero outputs, also after ReLU) up to
a multiple of `multiple` where every reader of it can take them: a dense conv (zero input
weights for them), a depthwise conv (padded in turn), or a Slice / Split that reads the
real channels only. A dense conv reading a concatenation stays on the NCHW path too when
the concatenation's channels do not fit the blocks (a folded v2's gathers: 58 in stage 2);
such a concatenation takes as many of the zero channels a Split of one of its inputs set
aside (the conv reads them with zero weights). The outputs of the graph do not change.

Measured on a 2-core AVX2 machine, ShuffleNet v2 1.0x folded, ONNX Runtime 1.32: about 10%
faster (docs/lab-notes/inference.md). OpenVINO's CPU plugin was slower on the padded graph, so the
OpenVINO export does not pad.
"""

import collections
from typing import TYPE_CHECKING

import numpy as np

from keras_autoshuffle.export.onnx_input import _attributes

if TYPE_CHECKING:
    import onnx


class _Graph:
    def __init__(self, proto):
        from onnx import numpy_helper

        self.numpy_helper = numpy_helper
        self.initializers = {t.name: t for t in proto.graph.initializer}
        self.readers = collections.defaultdict(list)
        for node in proto.graph.node:
            for name in node.input:
                self.readers[name].append(node)
        self.outputs = {output.name for output in proto.graph.output}
        self.producers = {name: node for node in proto.graph.node for name in node.output}

    def array(self, name):
        return self.numpy_helper.to_array(self.initializers[name])

    def set(self, name, array, dtype="float32"):
        self.initializers[name].CopyFrom(
            self.numpy_helper.from_array(np.asarray(array).astype(dtype), name)
        )

    def users(self, tensor):
        """The nodes reading `tensor`, through Relu nodes (None for a graph output)."""
        found = [None] if tensor in self.outputs else []
        for node in self.readers[tensor]:
            found += self.users(node.output[0]) if node.op_type == "Relu" else [node]
        return found


def _is_conv(node, groups=1):
    return node.op_type == "Conv" and _attributes(node).get("group", 1) == groups


def _paddable(graph, conv, depthwise_ok=True):
    channels = graph.array(conv.input[1]).shape[0]
    for user in graph.users(conv.output[0]):
        if user is None:
            return False
        if user.op_type in ("Slice", "Split") and _attributes(user).get("axis") == 1:
            continue
        if _is_conv(user):
            continue
        if depthwise_ok and _is_conv(user, channels) and _paddable(graph, user, False):
            continue
        return False
    return True


def _pad(graph, conv, extra):
    weights, bias = graph.array(conv.input[1]), graph.array(conv.input[2])
    graph.set(conv.input[1], np.concatenate([weights, np.zeros((extra, *weights.shape[1:]))]))
    graph.set(conv.input[2], np.concatenate([bias, np.zeros(extra)]))
    for user in graph.users(conv.output[0]):
        if _is_conv(user):
            kernel = graph.array(user.input[1])
            zeros = np.zeros((kernel.shape[0], extra, *kernel.shape[2:]))
            graph.set(user.input[1], np.concatenate([kernel, zeros], axis=1))
        elif user.op_type == "Split":  # one more output: the zero channels, unread
            graph.set(user.input[1], np.append(graph.array(user.input[1]), extra), "int64")
            user.output.append(f"{user.output[0]}_zeros")
        elif user.op_type == "Conv":  # depthwise
            for attribute in user.attribute:
                if attribute.name == "group":
                    attribute.i += extra
            _pad(graph, user, extra)


def _zero_outputs(graph, split):
    """{output: channels} of a channel Split's outputs that are zero whatever the input: a
    range of a (Relu of a) conv's outputs whose weights and bias are all zero."""
    conv = graph.producers.get(split.input[0])
    if conv is not None and conv.op_type == "Relu":
        conv = graph.producers.get(conv.input[0])
    if conv is None or conv.op_type != "Conv" or len(conv.input) != 3 or len(split.input) < 2:
        return {}
    if not all(name in graph.initializers for name in (*conv.input[1:], split.input[1])):
        return {}
    if _attributes(split).get("axis") != 1:
        return {}
    weights, bias = graph.array(conv.input[1]), graph.array(conv.input[2])
    bounds = np.cumsum([0, *graph.array(split.input[1])])
    return {
        name: int(stop - start)
        for name, start, stop in zip(split.output, bounds, bounds[1:], strict=False)
        if not weights[start:stop].any() and not bias[start:stop].any()
    }


def _zero_channels(graph, concat, count):
    """The name of `count` zero channels from a Split of one of `concat`'s inputs: a set of
    exactly `count` (read or not), else one carved from a larger unread set; or None."""
    found = []
    for name in concat.input:
        split = graph.producers.get(name)
        if split is not None and split.op_type == "Split":
            found += [(split, zeros, have) for zeros, have in _zero_outputs(graph, split).items()]
    for _, zeros, have in found:
        if have == count:
            return zeros
    for split, zeros, have in found:
        if have > count and not graph.readers[zeros] and zeros not in graph.outputs:
            rest, at = f"{zeros}_rest", list(split.output).index(zeros)
            sizes = list(graph.array(split.input[1]))
            graph.set(split.input[1], [*sizes[:at], count, have - count, *sizes[at + 1 :]], "int64")
            split.output.insert(at + 1, rest)
            graph.producers[rest] = split
            return zeros
    return None


def _pad_concat(graph, concat, channels, multiple):
    """Appends zero channels to a channel Concat read by dense convs only (each with
    weights of its own); True if done."""
    users = list({id(u): u for u in graph.users(concat.output[0])}.values())
    if not users or not all(u is not None and _is_conv(u) for u in users):
        return False
    weights = [u.input[1] for u in users]
    if not all(w in graph.initializers and len(graph.readers[w]) == 1 for w in weights):
        return False
    extra = -channels % multiple
    zeros = _zero_channels(graph, concat, extra)
    if zeros is None:
        return False
    concat.input.append(zeros)
    graph.readers[zeros].append(concat)
    for user in users:
        kernel = graph.array(user.input[1])
        padding = np.zeros((kernel.shape[0], extra, *kernel.shape[2:]))
        graph.set(user.input[1], np.concatenate([kernel, padding], axis=1))
    return True


def _channels(proto):
    """{tensor: its channels (axis 1)} where ONNX's shape inference knows them."""
    from onnx import shape_inference

    inferred = shape_inference.infer_shapes(proto).graph.value_info
    found = {}
    for info in inferred:
        dims = info.type.tensor_type.shape.dim
        if len(dims) > 1 and dims[1].HasField("dim_value"):
            found[info.name] = dims[1].dim_value
    return found


def align_channels(proto: "onnx.ModelProto", multiple: int = 8) -> int:
    """Pads the output channels of the dense convs of `proto` (an onnx.ModelProto, in
    place) with zero channels to a multiple of `multiple` where their readers allow, then
    the channel concatenations that feed dense convs (see the module docstring); returns
    how many convs and concatenations were padded."""
    graph = _Graph(proto)
    padded = 0
    for node in proto.graph.node:
        if _is_conv(node) and node.input[1] in graph.initializers and len(node.input) == 3:
            channels = graph.array(node.input[1]).shape[0]
            if channels % multiple and _paddable(graph, node):
                _pad(graph, node, -channels % multiple)
                padded += 1
    channels = _channels(proto)
    for node in proto.graph.node:
        count = channels.get(node.output[0])
        if node.op_type == "Concat" and _attributes(node).get("axis") == 1 and count:
            if count % multiple and _pad_concat(graph, node, count, multiple):
                padded += 1
    return padded
