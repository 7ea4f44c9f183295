"""Exported files that describe themselves: class names and input normalisation in LiteRT
metadata, ONNX `metadata_props` and OpenVINO `rt_info`.

MediaPipe Tasks' `ImageClassifier` runs a described `.tflite` file as is. It takes one mean
and one std for all channels: ImageNet's per-channel normalisation goes inside the net
(`with_input_normalization`), the file takes RGB in [0, 1] and says mean 0, std 255 on
pixels, as MediaPipe Model Maker's files do. The metadata is built with MediaPipe's
`metadata_info` classes (the `mediapipe` extra) and attached as its writer does (the
flatbuffer in the "TFLITE_METADATA" entry, the label file in a zip appended to the model):
its `MetadataWriter` does not import in mediapipe 0.10.32 and 1.2.x (no
`_pywrap_metadata_version` in the wheels).
"""

import io
import json
import os
import pathlib
import zipfile
from collections.abc import Sequence

import keras
import numpy as np

from keras_autoshuffle._atomic import write_atomically
from keras_autoshuffle._class_names import check_class_names
from keras_autoshuffle.applications.architecture import IMAGENET_MEAN, IMAGENET_STD

# Model Maker's image classifier convention: the file takes pixel / 255.
MEDIAPIPE_MEAN, MEDIAPIPE_STD = (0.0,), (255.0,)
# ImageNet's per-channel normalisation on pixel values in [0, 255]: what a file of a net
# taking normalised images is described with (MediaPipe refuses per-channel values).
IMAGENET_PIXEL_MEAN = tuple(255 * m for m in IMAGENET_MEAN)
IMAGENET_PIXEL_STD = tuple(255 * s for s in IMAGENET_STD)
LABEL_FILE = "labels.txt"
# The most bytes of a label file read from a `.tflite` file (a million short class names).
MAX_LABEL_FILE_BYTES = 16 * 2**20
_METADATA_NAME = "TFLITE_METADATA"
_METADATA_IDENTIFIER = b"M001"
# The oldest metadata parser that reads what is written here (image input, label file).
_MIN_PARSER_VERSION = "1.0.0"


def with_input_normalization(
    model: keras.Model,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> keras.Model:
    """`model` behind a per-channel normalisation, `(x - mean) / std`: a model taking RGB
    values in [0, 1] where `model` takes normalised images.

    Keras's own `Rescaling` layer ("input_normalization", `x / std - mean / std`: loads
    with `safe_mode=True`) at the new input: an exported file takes plain RGB, described by
    one mean and one std; its int8 file keeps most of the input's levels (about 170 of 256
    per channel; `x - mean` first kept about 55, twice the int8 file's mean output error:
    tests/test_export_metadata.py).

    Args:
        model: a single-input Keras model taking channels-last normalised images.
        mean: the per-channel mean `model`'s inputs were normalised with.
        std: the per-channel standard deviation, each > 0.
    """
    mean, std = _check_normalization(mean, std, channels=(1, 3))
    mean, std = np.asarray(mean), np.asarray(std)
    inputs = keras.Input(model.input_shape[1:], name="image")
    normalize = keras.layers.Rescaling(
        scale=list(1 / std), offset=list(-mean / std), name="input_normalization"
    )
    return keras.Model(inputs, model(normalize(inputs)), name=model.name)


def describe_litert(
    path: str | os.PathLike,
    labels: Sequence[str],
    mean: Sequence[float] = MEDIAPIPE_MEAN,
    std: Sequence[float] = MEDIAPIPE_STD,
    description: str = "Classifies the image into one of the classes of its label file.",
) -> str | os.PathLike:
    """Writes LiteRT metadata into the `.tflite` file at `path` (atomically): its class
    names (a label file on the output, `TENSOR_AXIS_LABELS`) and its input (an RGB image,
    normalised as `(pixel - mean) / std` with pixel values in [0, 255]).

    The defaults describe a file taking RGB in [0, 1] (`with_input_normalization`), as
    MediaPipe Tasks' `ImageClassifier` runs it. Metadata already in the file is replaced.

    Args:
        path: a single-input, single-output classifier `.tflite` file (float or int8).
        labels: one class name per output, in output order; no name blank or holding a
            line break, control or text-direction character.
        mean: the normalisation's mean, one value or one per channel (MediaPipe: one).
        std: its standard deviation, as many values as `mean`, each > 0.
        description: the model's description in the metadata.

    Returns:
        `path`.

    Raises:
        ValueError: `labels` not one name per output, or a bad `mean` / `std`.
        ImportError: mediapipe is not installed (`pip install keras-autoshuffle[mediapipe]`).
    """
    from ai_edge_litert import schema_py_generated as schema_fb
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(pathlib.Path(path).read_bytes()))
    labels = _check_labels(labels, _output_size(model), path)
    metadata = np.frombuffer(_metadata_buffer(model, labels, mean, std, description), np.uint8)
    entries = [m for m in model.metadata or [] if m.name.decode() == _METADATA_NAME]
    if entries:  # described before: its buffer takes the new metadata (the file keeps its size)
        model.buffers[entries[0].buffer].data = metadata
        model.metadata = [m for m in model.metadata if m not in entries[1:]]
    else:
        buffer = schema_fb.BufferT()
        buffer.data = metadata
        model.buffers.append(buffer)
        entry = schema_fb.MetadataT()
        entry.name, entry.buffer = _METADATA_NAME, len(model.buffers) - 1
        model.metadata = [*(model.metadata or []), entry]
    # The label file in a zip of its own after the model (a zip opened in "a" mode on the
    # model's bytes would take a zip end marker in its weights for its own and cut them).
    archive_bytes = io.BytesIO()
    with zipfile.ZipFile(archive_bytes, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(LABEL_FILE, "".join(f"{name}\n" for name in labels))
    packed = bytes(flatbuffer_utils.convert_object_to_bytearray(model)) + archive_bytes.getvalue()
    return write_atomically(path, lambda partial: pathlib.Path(partial).write_bytes(packed))


def read_litert_metadata(path: str | os.PathLike) -> dict | None:
    """The metadata `describe_litert` wrote into a `.tflite` file: `{"labels": [...],
    "mean": [...], "std": [...]}`, or None for a file without metadata."""
    from ai_edge_litert.tools import flatbuffer_utils
    from mediapipe.tasks.metadata import metadata_schema_py_generated as metadata_fb

    model_bytes = pathlib.Path(path).read_bytes()
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(model_bytes))
    entries = [m for m in model.metadata or [] if m.name.decode() == _METADATA_NAME]
    if not entries:
        return None
    data = bytes(model.buffers[entries[0].buffer].data)
    try:  # another writer's metadata may describe no normalisation or label file
        root = metadata_fb.ModelMetadataT.InitFromObj(
            metadata_fb.ModelMetadata.GetRootAsModelMetadata(data, 0)
        )
        graph = root.subgraphMetadata[0]
        options = graph.inputTensorMetadata[0].processUnits[0].options
        label_file = graph.outputTensorMetadata[0].associatedFiles[0].name.decode()
        mean, std = [float(v) for v in options.mean], [float(v) for v in options.std]
        with zipfile.ZipFile(io.BytesIO(model_bytes)) as archive:
            # A file may come from anyone: its label file is read up to a bound (a deflated
            # entry of a few hundred kB can hold gigabytes).
            if archive.getinfo(label_file).file_size > MAX_LABEL_FILE_BYTES:
                raise ValueError(f"its label file is larger than {MAX_LABEL_FILE_BYTES} bytes")
            with archive.open(label_file) as handle:
                data = handle.read(MAX_LABEL_FILE_BYTES + 1)
            if len(data) > MAX_LABEL_FILE_BYTES:  # the size its header gives may lie
                raise ValueError(f"its label file is larger than {MAX_LABEL_FILE_BYTES} bytes")
            labels = data.decode("utf-8").splitlines()
    except (
        TypeError,
        IndexError,
        KeyError,
        AttributeError,
        ValueError,
        zipfile.BadZipFile,
    ) as error:
        raise ValueError(
            f"The metadata of {os.fspath(path)} does not hold an image classifier's label "
            f"file and normalisation as `describe_litert` writes them. Received: {error!r}"
        ) from None
    return {"labels": labels, "mean": mean, "std": std}


def _output_size(model) -> int:
    """The class count of a single-output classifier file: its output's last dimension."""
    graph = model.subgraphs[0]
    return int(graph.tensors[graph.outputs[0]].shape[-1])


def _check_labels(labels, classes, path):
    """`labels` as a list of class names, one per output of the file at `path`."""
    return check_class_names(labels, classes, "labels", f"of {os.fspath(path)}")


def _check_normalization(mean, std, channels=None):
    """`mean` and `std` as lists of finite floats: equally many (one, or one per channel;
    as many as one of `channels` says, where given), each std > 0."""
    try:
        mean, std = [float(v) for v in mean], [float(v) for v in std]
    except (TypeError, ValueError):
        raise ValueError(
            f"`mean` and `std` must be lists of numbers. Received: mean={mean!r}, std={std!r}"
        ) from None
    count_ok = len(mean) in channels if channels else bool(mean)
    if not count_ok or len(std) != len(mean) or not np.all(np.isfinite(mean + std)):
        raise ValueError(
            "`mean` and `std` must be equally many finite numbers (one, or one per channel), "
            f"each std > 0. Received: mean={mean}, std={std}"
        )
    if not all(v > 0 for v in std):
        raise ValueError(f"`std` must be positive numbers. Received: mean={mean}, std={std}")
    return mean, std


def _metadata_buffer(model, labels, mean, std, description):
    """The ModelMetadata flatbuffer of an image classifier, built with MediaPipe's
    `metadata_info` classes as its image classifier writer builds it."""
    import flatbuffers
    from mediapipe.tasks.metadata import metadata_schema_py_generated as metadata_fb
    from mediapipe.tasks.python.metadata.metadata_writers import metadata_info

    mean, std = _check_normalization(mean, std)
    graph = model.subgraphs[0]
    input_type = graph.tensors[graph.inputs[0]].type
    image = metadata_info.InputImageTensorMd(
        name="image",
        description="RGB image",
        norm_mean=mean,
        norm_std=std,
        color_space_type=metadata_fb.ColorSpaceType.RGB,
        tensor_type=input_type,
    )
    scores = metadata_info.ClassificationTensorMd(
        name="score",
        description="The score of each class, in the order of the label file.",
        label_files=[metadata_info.LabelFileMd(LABEL_FILE)],
        tensor_type=graph.tensors[graph.outputs[0]].type,
    )
    subgraph = metadata_fb.SubGraphMetadataT()
    subgraph.inputTensorMetadata = [image.create_metadata()]
    subgraph.outputTensorMetadata = [scores.create_metadata()]
    root = metadata_info.GeneralMd(name="ImageClassifier", description=description)
    root = root.create_metadata()
    root.subgraphMetadata = [subgraph]
    root.minParserVersion = _MIN_PARSER_VERSION
    builder = flatbuffers.Builder(0)
    builder.Finish(root.Pack(builder), _METADATA_IDENTIFIER)
    return bytes(builder.Output())


def describe_onnx(
    path: str | os.PathLike,
    labels: Sequence[str],
    mean: Sequence[float] = MEDIAPIPE_MEAN,
    std: Sequence[float] = MEDIAPIPE_STD,
) -> str | os.PathLike:
    """Writes the class names and the input's normalisation (as `describe_litert`'s, on
    pixel values in [0, 255]) into the `.onnx` file at `path` (atomically), as its
    `metadata_props`: "labels", "image_mean", "image_std" (JSON lists), "color_space"."""
    import onnx

    model = onnx.load(path)
    classes = model.graph.output[0].type.tensor_type.shape.dim[-1].dim_value
    props = _props(_check_labels(labels, classes, path), mean, std)
    kept = [p for p in model.metadata_props if p.key not in props]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    onnx.helper.set_model_props(model, {**{p.key: p.value for p in kept}, **props})
    return write_atomically(path, lambda partial: onnx.save(model, partial))


def describe_openvino(
    path: str | os.PathLike,
    labels: Sequence[str],
    mean: Sequence[float] = MEDIAPIPE_MEAN,
    std: Sequence[float] = MEDIAPIPE_STD,
) -> str | os.PathLike:
    """Writes what `describe_onnx` writes into the runtime info (`rt_info`, under
    "keras_autoshuffle") of the OpenVINO IR folder at `path` (`model.xml`, `model.bin`),
    saved again as a whole (atomically), its weights as they were (no fp16 compression)."""
    import openvino

    model = openvino.Core().read_model(os.path.join(path, "model.xml"))
    classes = model.outputs[0].get_partial_shape()[-1].get_length()
    for key, value in _props(_check_labels(labels, classes, path), mean, std).items():
        model.set_rt_info(value, [_RT_INFO, key])

    def write(partial):
        os.makedirs(partial)
        openvino.save_model(model, os.path.join(partial, "model.xml"), compress_to_fp16=False)

    return write_atomically(path, write)


def read_onnx_metadata(path: str | os.PathLike) -> dict | None:
    """What `describe_onnx` wrote into an `.onnx` file (as `read_litert_metadata`'s), or
    None."""
    import onnx

    props = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}
    return _from_props(props)


def read_openvino_metadata(path: str | os.PathLike) -> dict | None:
    """What `describe_openvino` wrote into an OpenVINO IR folder, or None."""
    import openvino

    model = openvino.Core().read_model(os.path.join(path, "model.xml"))
    keys = ("labels", "image_mean", "image_std")
    if not model.has_rt_info([_RT_INFO, "labels"]):
        return None
    return _from_props({k: model.get_rt_info([_RT_INFO, k]).astype(str) for k in keys})


_RT_INFO = "keras_autoshuffle"


def _props(labels, mean, std):
    """The ONNX / OpenVINO entries: JSON lists, checked as `describe_litert` checks them."""
    _check_normalization(mean, std)
    return {
        "labels": json.dumps(labels, ensure_ascii=False),
        "image_mean": json.dumps([float(v) for v in mean]),
        "image_std": json.dumps([float(v) for v in std]),
        "color_space": "RGB",
    }


def _from_props(props):
    if "labels" not in props:
        return None
    return {
        "labels": json.loads(props["labels"]),
        "mean": json.loads(props["image_mean"]),
        "std": json.loads(props["image_std"]),
    }
