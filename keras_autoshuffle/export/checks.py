"""What is checked before anything is written: the formats asked for and whether this
backend, these packages and the model's dtypes can give them, the model's shuffles
(relaxed ones are refused: see the package docstring), the input batches, and the output
folder."""

import importlib.util
import os
import zipfile
from collections.abc import Collection, Sequence

import keras
import numpy as np

from keras_autoshuffle.export import onnx_runtimes
from keras_autoshuffle.export.files import FILENAMES, FORMATS, INT8_FILES
from keras_autoshuffle.layers import relaxed_shuffles


def check_formats(formats: str | Sequence[str]) -> tuple[str, ...]:
    """`formats` as a tuple: a non-empty subset of FORMATS (a string is one format)."""
    try:
        checked = (formats,) if isinstance(formats, str) else tuple(formats)
    except TypeError:
        checked = ()
    if not checked or any(not isinstance(f, str) or f not in FORMATS for f in checked):
        raise ValueError(
            f"`formats` must be a non-empty subset of {FORMATS}. Received: formats={formats!r}"
        )
    return checked


# The extra (pyproject.toml) that installs each format's runtime.
EXTRAS = {
    "litert": "keras-autoshuffle[litert]",
    "onnx": "keras-autoshuffle[onnx]",
    "openvino": "keras-autoshuffle[openvino]",
}


def is_installed(module: str) -> bool:
    """Whether the Python module `module` can be imported here (found, not imported)."""
    return importlib.util.find_spec(module) is not None


def unsupported_formats(
    formats: Collection[str], dtypes: Collection[str] = ("float32",)
) -> dict[str, str]:
    """{format: why it cannot be written and checked here} for the formats of `formats`
    this backend, these installed packages and these compute dtypes cannot export.

    Known before any training: SavedModel needs TensorFlow installed (any backend);
    LiteRT needs Keras's TensorFlow backend (its JAX backend refuses), the
    `ai_edge_litert` package for the parity check, and float32 layers (a model
    computing in bfloat16 or float16 converts to TensorFlow "Flex" ops, which LiteRT's
    builtin interpreter lacks: measured with both mixed precision policies). ONNX and
    OpenVINO need their extras (`pip install keras-autoshuffle[onnx]` / `[openvino]`) and
    float32 layers (Keras's exporters refuse other dtype policies).

    Args:
        formats: formats of FORMATS.
        dtypes: the compute dtypes of the model's layers (`compute_dtypes(model)`).
    """
    reasons = {}
    if "saved_model" in formats and not is_installed("tensorflow"):
        reasons["saved_model"] = "SavedModel export needs TensorFlow (pip install tensorflow)"
    if "litert" in formats:
        half = sorted(set(dtypes) & {"bfloat16", "float16"})
        if keras.backend.backend() != "tensorflow":
            reasons["litert"] = (
                "LiteRT export needs Keras's TensorFlow backend; this is "
                f"KERAS_BACKEND={keras.backend.backend()}"
            )
        elif not is_installed("ai_edge_litert"):
            reasons["litert"] = (
                f"the LiteRT check needs ai_edge_litert (pip install '{EXTRAS['litert']}')"
            )
        elif half:
            reasons["litert"] = (
                f"a model computing in {half[0]} (mixed precision) converts to TensorFlow Flex "
                "ops, which the LiteRT interpreter lacks; train in float32 to export LiteRT"
            )
    for name in ("onnx", "openvino"):
        if name not in formats:
            continue
        missing = [m for m in onnx_runtimes.MODULES[name] if not is_installed(m)]
        if missing:
            reasons[name] = (
                f"the {name} export needs {', '.join(missing)} (pip install '{EXTRAS[name]}')"
            )
        elif set(dtypes) != {"float32"}:
            reasons[name] = f"the {name} export needs float32 layers; the model computes in " + (
                ", ".join(sorted(set(dtypes) - {"float32"}))
            )
    return reasons


# The float formats an int8 file is quantized from, and the modules each quantizer needs
# beyond its float format's ({format: (modules, extra)}).
INT8_QUANTIZERS = {
    "litert": ((), None),  # the TensorFlow converter
    "onnx": (("onnxruntime",), EXTRAS["onnx"]),  # onnxruntime.quantization
    "openvino": (("nncf",), "keras-autoshuffle[openvino-int8]"),
}


def unsupported_int8(formats: Collection[str]) -> dict[str, str]:
    """{format: why} for the formats of `formats` whose int8 file cannot be written here
    for want of its quantizer (NNCF for OpenVINO); the float format's own needs are
    `unsupported_formats`'."""
    reasons = {}
    for name in formats:
        modules, extra = INT8_QUANTIZERS.get(name, ((), None))
        missing = [m for m in modules if not is_installed(m)]
        if missing:
            needs = ", ".join(missing)
            reasons[name] = f"the int8 {name} file needs {needs} (pip install '{extra}')"
    return reasons


def compute_dtypes(model: keras.Model) -> set[str]:
    """The set of compute dtypes of `model`'s layers (e.g. {"float32", "bfloat16"})."""
    dtypes, layers = set(), [model]
    while layers:
        layer = layers.pop()
        dtypes.add(keras.backend.standardize_dtype(layer.compute_dtype))
        layers.extend(getattr(layer, "layers", []))
    return dtypes


def check_exportable(model: keras.Model, allow_relaxed: bool = False) -> None:
    """Raises ValueError if `model` still holds relaxed shuffles (unless allowed)."""
    relaxed = [layer.name for layer in relaxed_shuffles(model)]
    if relaxed and not allow_relaxed:
        raise ValueError(
            f"The model holds {len(relaxed)} relaxed (un-hardened) RelaxedShuffle layers, "
            "whose shuffles are dense matrices, not permutations. Harden them first "
            "(keras_autoshuffle.harden_model or the HardenShuffles callback), or pass "
            f"allow_relaxed=True to export them as they are. Received: relaxed layers={relaxed}"
        )


def _single_input(model, sample_inputs, name="sample_inputs", purpose="the parity check"):
    if len(model.inputs) != 1:
        raise ValueError(
            f"Export checks support single-input models. Received: {len(model.inputs)} inputs"
        )
    try:
        x = np.asarray(sample_inputs, dtype="float32")
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"`{name}` must be an array of numbers. Received: {str(error)[:200]}"
        ) from None
    expected = tuple(model.inputs[0].shape[1:])
    if x.ndim != len(expected) + 1 or any(
        e is not None and e != s for e, s in zip(expected, x.shape[1:], strict=True)
    ):
        raise ValueError(
            f"`{name}` must be a batch of shape (batch, *{expected}). "
            f"Received: {name}.shape={x.shape}"
        )
    if x.shape[0] == 0:
        # No outputs to compare: every format would pass with max_abs_diff 0.0.
        raise ValueError(
            f"`{name}` must hold at least one example for {purpose}. "
            f"Received: {name}.shape={x.shape}"
        )
    if not np.all(np.isfinite(x)):
        # NaN outputs compare as NaN: the parity check could not tell a broken file.
        raise ValueError(
            f"`{name}` must hold only finite values for {purpose}. Received: "
            f"{int(np.size(x) - np.isfinite(x).sum())} non-finite values of {np.size(x)}"
        )
    return x


def make_folder(path: str | os.PathLike, name: str) -> str | os.PathLike:
    """Creates the folder `path` (and its parents); a clear error naming `name` when it is
    a file or cannot be created."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"`{name}` must be a folder, not a file. Received: {name}={path!r}")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise ValueError(
            f"`{name}` cannot be created ({error.strerror}). Received: {name}={path!r}"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"`{name}` is not writable. Received: {name}={path!r}")
    return path


def _looks_exported(name, path):
    """Whether `path`, at the name `export_model` writes format `name` (or "int8") under,
    holds what that writer writes (and may be replaced or removed)."""
    try:
        name = INT8_FILES[name][0] if name in INT8_FILES else name
        if name == "litert":
            with open(path, "rb") as f:
                return os.path.isfile(path) and f.read(8)[4:8] == b"TFL3"
        if name == "keras":
            with zipfile.ZipFile(path) as archive:
                return "metadata.json" in archive.namelist()
        if name == "onnx":  # the producer name, the file's second field
            with open(path, "rb") as f:
                head = f.read(64)
            # "onnx.quantize": ONNX Runtime's quantizer, of the int8 file.
            producers = (b"keras_autoshuffle", b"tf2onnx", b"onnx.quantize")
            return os.path.isfile(path) and any(p in head for p in producers)
        if name == "saved_model":
            entries = set(os.listdir(path))
            return "saved_model.pb" in entries and entries <= _SAVED_MODEL_ENTRIES
        if name == "openvino":
            entries = set(os.listdir(path))
            return onnx_runtimes.OPENVINO_XML in entries and entries <= _OPENVINO_ENTRIES
    except (OSError, zipfile.BadZipFile):
        return False
    return False


_SAVED_MODEL_ENTRIES = {"saved_model.pb", "variables", "assets", "fingerprint.pb"}
_OPENVINO_ENTRIES = {onnx_runtimes.OPENVINO_XML, "model.bin"}


def foreign_files(output_dir: str | os.PathLike, names: dict[str, str]) -> list[str]:
    """The entries of `output_dir` at the names `export_model` writes (`names`: {format or
    "int8": file name}) that do not hold what it writes there: a user's own files, never
    replaced or removed."""
    return [
        filename
        for name, filename in names.items()
        if os.path.lexists(os.path.join(output_dir, filename))
        and not _looks_exported(name, os.path.join(output_dir, filename))
    ]


def export_names() -> dict[str, str]:
    """{format or int8 key ("int8", "onnx_int8", "openvino_int8"): the name
    `export_model` writes it under in its folder}."""
    return {**FILENAMES, **{key: name for key, (_, name) in INT8_FILES.items()}}
