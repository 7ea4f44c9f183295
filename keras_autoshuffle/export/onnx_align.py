"""Zero channels that let ONNX Runtime run every convolution in its fast blocked layout.

ONNX Runtime's CPU graph optimizer moves a Conv to its NCHWc kernels (MLAS; channel
blocks of 8 floats on AVX2, 16 on AVX-512) only when the channel counts fit the blocks.
ShuffleNet v2 1.0x's stage-2 branches have 58 channels: their convs stay on the slower
NCHW path (measured with ORT's profiler: 11 of 56 convs). `align_channels` pads a conv's
output with zero channels (zero weights and bias, so zero outputs, also after ReLU) up to
a multiple of `multiple` where every reader of it can take them: a dense conv (zero input
weights for them), a depthwise conv (padded in turn), or a Slice / Split that reads the
real channels only. The outputs of the graph do not change.

Measured on a 2-core AVX2 machine, ShuffleNet v2 1.0x folded, ONNX Runtime 1.32: about 10%
faster (docs/inference.md). OpenVINO's CPU plugin was slower on the padded graph, so the
OpenVINO export does not pad.
"""

import collections

import numpy as np


def _attribute(node, name, default=None):
    from onnx import helper

    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    return default


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
    return node.op_type == "Conv" and _attribute(node, "group", 1) == groups


def _paddable(graph, conv, depthwise_ok=True):
    channels = graph.array(conv.input[1]).shape[0]
    for user in graph.users(conv.output[0]):
        if user is None:
            return False
        if user.op_type in ("Slice", "Split") and _attribute(user, "axis") == 1:
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


def align_channels(proto, multiple=8):
    """Pads the output channels of the dense convs of `proto` (an onnx.ModelProto, in
    place) with zero channels to a multiple of `multiple` where their readers allow
    (see the module docstring); returns how many convs were padded."""
    graph = _Graph(proto)
    padded = 0
    for node in proto.graph.node:
        if _is_conv(node) and node.input[1] in graph.initializers and len(node.input) == 3:
            channels = graph.array(node.input[1]).shape[0]
            if channels % multiple and _paddable(graph, node):
                _pad(graph, node, -channels % multiple)
                padded += 1
    return padded
