"""The NHWC input read by the first convolution itself, without a Transpose.

`onnx_graph` starts with a Transpose of the NHWC images to NCHW. For a conv reading the
input, that copy is avoidable: an NHWC image of width W and C channels is, in memory, a
one-channel image of width W * C, and a kh x kw window over all C channels is a
kh x (kw * C) window of it. A conv with stride s and pads (left, right) along the width
sums the same products as a one-channel conv with kernel (kh, kw * C), stride s * C and
pads (left * C, right * C) on the (H, W * C) image, which a Reshape gives without moving
any data. Measured with ONNX Runtime 1.32 on ShuffleNet v2 1.0x at 224:
the Transpose was about 2% of the run and the rewritten stem conv as fast as before
(docs/lab-notes/inference.md).
"""

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx


def _attributes(node):
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def read_input_as_columns(proto: "onnx.ModelProto") -> bool:
    """Rewrites `proto` (an onnx.ModelProto from `onnx_graph`, in place) so that its first
    conv reads the NHWC input as columns (see the module docstring) where it can: the
    input Transpose feeds only that conv, the conv's weights are constants of its own, its
    dilations 1 and the input's width and channels known. Returns whether it did."""
    from onnx import helper, numpy_helper

    graph = proto.graph
    nodes = list(graph.node)
    if not nodes or nodes[0].op_type != "Transpose":
        return False
    transpose = nodes[0]
    readers = [n for n in nodes if transpose.output[0] in n.input]
    if len(readers) != 1:
        return False
    conv = readers[0]
    weights = {t.name: t for t in graph.initializer}
    dims = graph.input[0].type.tensor_type.shape.dim
    attributes = _attributes(conv)
    if (
        _attributes(transpose).get("perm") != [0, 3, 1, 2]
        or transpose.input[0] != graph.input[0].name
        or conv.op_type != "Conv"
        or conv.input[0] != transpose.output[0]
        or conv.input[1] not in weights
        or any(conv.input[1] in n.input for n in nodes if n is not conv)  # shared weights
        or attributes.get("group", 1) != 1
        or any(d != 1 for d in attributes.get("dilations", [1, 1]))
        or attributes.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET")
        or len(dims) != 4
        or not all(d.HasField("dim_value") for d in dims[2:])
        or "input_columns" in weights
    ):
        return False
    # The height where it is known: a Reshape of an empty batch cannot infer a -1.
    height = dims[1].dim_value if dims[1].HasField("dim_value") else -1
    width, channels = dims[2].dim_value, dims[3].dim_value
    kernel = numpy_helper.to_array(weights[conv.input[1]])  # (out, channels, kh, kw)
    out, _, kh, kw = kernel.shape
    # columns[o, 0, i, j * channels + c] = kernel[o, c, i, j]
    columns = kernel.transpose(0, 2, 3, 1).reshape(out, 1, kh, kw * channels)
    weights[conv.input[1]].CopyFrom(
        numpy_helper.from_array(np.ascontiguousarray(columns), conv.input[1])
    )
    sh, sw = attributes.get("strides", [1, 1])
    top, left, bottom, right = attributes.get("pads", [0, 0, 0, 0])
    shape = np.array([0, 1, height, width * channels], dtype=np.int64)
    shape = numpy_helper.from_array(shape, "input_columns")
    graph.initializer.append(shape)
    transpose.CopyFrom(
        helper.make_node(
            "Reshape", [transpose.input[0], shape.name], [transpose.output[0]], "to_columns"
        )
    )
    for info in [v for v in graph.value_info if v.name == transpose.output[0]]:
        graph.value_info.remove(info)  # its NCHW shape, no longer true
    del conv.attribute[:]
    conv.attribute.extend(
        [
            helper.make_attribute("group", 1),
            helper.make_attribute("kernel_shape", [kh, kw * channels]),
            helper.make_attribute("strides", [sh, sw * channels]),
            helper.make_attribute("pads", [top, left * channels, bottom, right * channels]),
        ]
    )
    return True
