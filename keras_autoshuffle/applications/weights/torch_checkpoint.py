"""PyTorch checkpoints (`.pth` state dicts) read with NumPy alone, running no code from them.

A `.pth` file is a pickle, and unpickling runs whatever callables the file names
(`os.system` included). `read_torch_checkpoint` unpickles with a `pickle.Unpickler`
whose `find_class` returns only this module's own stand-ins for the few names a state
dict uses (`collections.OrderedDict`, `torch._utils._rebuild_tensor_v2`,
`torch._utils._rebuild_parameter`, the storage classes `torch.FloatStorage`, ...): none
of them imports or calls anything, and every other name is refused before it is looked
up. Tensors come back as NumPy arrays copied out of their storages after every offset,
shape and stride has been checked against the storage's size.

What a file can make the reader allocate is bounded (`max_bytes`, 1 GiB by default): the
file, its pickle and storages at their declared sizes (zipfile never inflates an entry
past it, and each must be the storage's), and every tensor copied out, never more
elements than its storage (a stride-0 view could ask for any amount). Only regular files
are read: a FIFO would block and a device such as /dev/zero never ends.

Both of PyTorch's formats are read:
- the zip archive of torch >= 1.6: `<root>/data.pkl` (the pickled object; tensors refer
  to storages by key) and `<root>/data/<key>` (each storage's raw bytes, little-endian
  unless `<root>/byteorder` says otherwise);
- the legacy stream of torch < 1.6 (`torch.save(..., _use_new_zipfile_serialization=False)`;
  torchvision's ShuffleNetV2 x0.5 and x1.0 files): the pickles of a magic number, the
  protocol version and a sys-info dict, then the pickled object, then the pickled list
  of storage keys, then for each key an int64 element count and the raw bytes.
The older tar format (torch < 0.4) is not read.

The module imports nothing but the standard library and NumPy (not Keras), so a script
can load it by path where TensorFlow is not installed (the repository's checkpoint-making script).
"""

import io
import os
import pickle
import stat
import struct
import zipfile
import zlib

import numpy as np

LEGACY_MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL_VERSION = 1001

# torch storage class -> NumPy dtype of its elements (byte order added on reading).
# bfloat16 has no NumPy type: it is read as uint16 and widened exactly to float32.
STORAGE_DTYPES = {
    "FloatStorage": "f4",
    "DoubleStorage": "f8",
    "HalfStorage": "f2",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "i8",
    "IntStorage": "i4",
    "ShortStorage": "i2",
    "CharStorage": "i1",
    "ByteStorage": "u1",
    "BoolStorage": "b1",
}
# What one file may make the reader allocate, in bytes (the file, its pickle, its storages
# and the tensors copied out). torchvision's largest ShuffleNetV2 file (x2.0, 29 MB)
# needs under 100 MB.
MAX_BYTES = 2**30


# What reading a damaged or truncated file raises (UnicodeDecodeError is a ValueError).
_DAMAGED_FILE = (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, struct.error, zlib.error)
_MALFORMED_OBJECT = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError)


class CheckpointError(ValueError):
    """A file is not a PyTorch state dict this reader accepts (damaged, or asks for more)."""


class _Refused(Exception):
    """Raised while unpickling; `read_torch_checkpoint` adds the file's name."""


class _Budget:
    """The bytes a file may still make the reader allocate; `take` refuses past it."""

    def __init__(self, limit):
        self.limit, self.used = limit, 0

    def take(self, size, what):
        self.used += size
        if self.used > self.limit:
            raise _Refused(
                f"{what}, which brings what reading it takes to {self.used} bytes, past "
                f"the reader's bound max_bytes={self.limit}"
            )


class _StateDict(dict):
    """Stands in for `collections.OrderedDict` (a dict keeps insertion order).

    `__setstate__` drops the state a state dict carries (its `_metadata` of module
    versions), so a pickle's BUILD can set no attribute on it.
    """

    __slots__ = ()

    def __setstate__(self, state):
        if state is not None and not isinstance(state, dict):
            raise _Refused(f"an OrderedDict with the state {type(state).__name__}")


class _Sealed:
    """Objects that a pickle's BUILD must not change: only a `_StateDict` the pickle
    itself made may receive a BUILD (and keeps nothing of it)."""

    __slots__ = ()

    def __setstate__(self, state):
        raise _Refused(f"state set on a {type(self).__name__.strip('_')}")


class _StorageType(_Sealed):
    """Stands in for a torch storage class such as `torch.FloatStorage` (not callable)."""

    __slots__ = ("name", "dtype", "module")

    def __init__(self, name, module="torch"):
        self.name, self.module = name, module
        self.dtype = STORAGE_DTYPES[name]

    def __setstate__(self, state):
        raise _Refused(f"state set on the global {self.module}.{self.name}")


class _Storage(_Sealed):
    """A storage a tensor refers to: `numel` elements from element `offset` of the root
    storage `key` (offset > 0 only for the legacy format's storage views)."""

    __slots__ = ("key", "dtype", "offset", "numel")

    def __init__(self, key, dtype, offset, numel):
        self.key, self.dtype, self.offset, self.numel = key, dtype, offset, numel


class _Tensor(_Sealed):
    """A tensor to copy out of its storage once the storages are read."""

    __slots__ = ("storage", "offset", "shape", "strides")

    def __init__(self, storage, offset, shape, strides):
        self.storage, self.offset, self.shape, self.strides = storage, offset, shape, strides


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _int_tuple(value, what):
    if not isinstance(value, tuple) or not all(_is_int(v) and v >= 0 for v in value):
        raise _Refused(f"a tensor {what} that is not a tuple of integers >= 0: {value!r}")
    return value


def _rebuild_tensor(storage, offset, size, stride):
    """`torch._utils._rebuild_tensor`: a strided view of `storage`, checked to fit it."""
    if not isinstance(storage, _Storage):
        raise _Refused(f"a tensor over a {type(storage).__name__}, not a storage")
    if not _is_int(offset) or offset < 0:
        raise _Refused(f"a tensor at storage offset {offset!r}")
    size, stride = _int_tuple(size, "shape"), _int_tuple(stride, "stride")
    if len(size) != len(stride):
        raise _Refused(f"a tensor of shape {size} with strides {stride}")
    elements = int(np.prod(size, dtype=object))
    if elements:
        end = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) + 1
        if end > storage.numel:
            raise _Refused(
                f"a tensor of shape {size}, strides {stride} at offset {offset} that "
                f"reaches element {end} of a storage of {storage.numel} elements"
            )
    if elements > storage.numel:  # only zero strides get there; its copy would be larger
        raise _Refused(
            f"a tensor of shape {size} ({elements} elements) over a storage of "
            f"{storage.numel} elements"
        )
    return _Tensor(storage, offset, size, stride)


def _check_flags(what, requires_grad, backward_hooks):
    """A tensor's or parameter's autograd flags: a bool and no hooks (dropped when read)."""
    if not isinstance(requires_grad, bool):
        raise _Refused(f"{what} with requires_grad={requires_grad!r}")
    if not isinstance(backward_hooks, dict) or backward_hooks:
        raise _Refused(f"{what} with backward hooks {backward_hooks!r}")


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, backward_hooks, metadata=None):
    """`torch._utils._rebuild_tensor_v2`; gradient flags and empty hooks are dropped."""
    _check_flags("a tensor", requires_grad, backward_hooks)
    if metadata:  # the conjugate / negative bits of complex views
        raise _Refused(f"a tensor with metadata {metadata!r}")
    return _rebuild_tensor(storage, offset, size, stride)


def _rebuild_parameter(data, requires_grad, backward_hooks):
    """`torch._utils._rebuild_parameter`: an `nn.Parameter` is read as its tensor."""
    if not isinstance(data, _Tensor):
        raise _Refused(f"a parameter holding a {type(data).__name__}")
    _check_flags("a parameter", requires_grad, backward_hooks)
    return data


class _Global(_Sealed):
    """An allowed global as `find_class` returns it: calls its stand-in, and refuses a
    pickle's BUILD. Handing out the stand-in functions themselves would let BUILD set
    their attributes (`__defaults__`, `__kwdefaults__`, ...) for the rest of the process,
    failing or changing every later read; the reader's objects are shared by all reads,
    so none that a pickle can reach may change."""

    __slots__ = ("name", "function")

    def __init__(self, name, function):
        self.name, self.function = name, function

    def __call__(self, *args):
        return self.function(*args)

    def __setstate__(self, state):
        raise _Refused(f"state set on the global {self.name} (a BUILD a state dict never has)")


def _globals(names):
    return {tuple(name.rsplit(".", 1)): _Global(name, function) for name, function in names}


_ALLOWED = {
    **_globals(
        [
            ("collections.OrderedDict", _StateDict),
            ("torch._utils._rebuild_tensor", _rebuild_tensor),
            ("torch._utils._rebuild_tensor_v2", _rebuild_tensor_v2),
            ("torch._utils._rebuild_parameter", _rebuild_parameter),
        ]
    ),
    # Storages saved from a GPU (`torch.cuda.FloatStorage`) hold the same bytes.
    **{
        (module, name): _StorageType(name, module)
        for module in ("torch", "torch.cuda")
        for name in STORAGE_DTYPES
    },
}


def _ascii(value):
    return value.decode("ascii") if isinstance(value, bytes) else value


class _Unpickler(pickle.Unpickler):
    """Unpickles a state dict: only `_ALLOWED` globals; storages through `persistent_load`.

    `legacy`: persistent ids carry a view (torch < 1.6), else they do not (zip).
    """

    def __init__(self, file, legacy):
        super().__init__(file, encoding="utf-8")
        self.legacy = legacy
        self.roots = {}  # storage key -> (dtype, numel) as first declared

    def find_class(self, module, name):
        allowed = _ALLOWED.get((module, name))
        if allowed is None:
            if module in ("torch", "torch.cuda") and name.endswith("Storage"):
                raise _Refused(
                    f"a tensor of storage type torch.{name}: only {sorted(STORAGE_DTYPES)} "
                    "are read (real and integer dtypes)"
                )
            raise _Refused(
                f"the global {module}.{name}, which a state dict does not need (nothing "
                "from the file was run)"
            )
        return allowed

    def persistent_load(self, pid):
        fields = 6 if self.legacy else 5
        if not isinstance(pid, tuple) or len(pid) != fields or _ascii(pid[0]) != "storage":
            raise _Refused(f"a reference {pid!r} that is not a storage")
        storage_type, key, location, numel = pid[1:5]
        if not isinstance(storage_type, _StorageType):
            raise _Refused(f"a storage of type {storage_type!r}")
        key, location = _ascii(key), _ascii(location)
        if not isinstance(key, str) or not isinstance(location, str) or not _is_int(numel):
            raise _Refused(f"a storage reference {pid!r}")
        if numel < 0:
            raise _Refused(f"storage {key!r} declared as {numel} elements")
        first = self.roots.setdefault(key, (storage_type.dtype, numel))
        if first != (storage_type.dtype, numel):
            raise _Refused(
                f"storage {key!r} declared as {numel} elements of {storage_type.name} "
                f"(first declared: {first})"
            )
        view = pid[5] if self.legacy else None
        if view is None:
            return _Storage(key, storage_type.dtype, 0, numel)
        if (
            not isinstance(view, tuple)
            or len(view) != 3
            or not all(_is_int(v) and v >= 0 for v in view[1:])
            or view[1] + view[2] > numel
        ):
            raise _Refused(f"a storage view {view!r} of storage {key!r} ({numel} elements)")
        return _Storage(key, storage_type.dtype, view[1], view[2])


def _element_dtype(code, byteorder):
    """The NumPy dtype a storage's bytes are read as."""
    if code == "bfloat16":
        return np.dtype(f"{byteorder}u2")
    return np.dtype(code if code in ("i1", "u1", "b1") else f"{byteorder}{code}")


def _to_array(tensor, data, byteorder, budget):
    """Copies `tensor` out of its root storage's bytes `data` (native byte order)."""
    storage = tensor.storage
    dtype = _element_dtype(storage.dtype, byteorder)
    elements = int(np.prod(tensor.shape, dtype=object))
    widened = 4 if storage.dtype == "bfloat16" else 0  # the float32 it becomes
    budget.take(elements * (dtype.itemsize + widened), f"a tensor of shape {tensor.shape}")
    flat = np.frombuffer(data, dtype=dtype)
    flat = flat[storage.offset : storage.offset + storage.numel]
    if 0 in tensor.shape:
        array = np.empty(tensor.shape, dtype)
    else:
        array = np.lib.stride_tricks.as_strided(
            flat[tensor.offset :],
            shape=tensor.shape,
            strides=tuple(s * dtype.itemsize for s in tensor.strides),
            writeable=False,
        )
    array = np.array(array, dtype=dtype.newbyteorder("="), order="C")
    if storage.dtype == "bfloat16":  # bfloat16 = the high half of a float32: exact
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return array


def _state_dict(obj):
    """The mapping of names to tensors in an unpickled object, checked."""
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        if not all(isinstance(v, _Tensor) for v in obj.values()):
            obj = obj["state_dict"]  # a training checkpoint {"state_dict": ..., "epoch": ...}
    if not isinstance(obj, dict):
        raise _Refused(f"a {type(obj).__name__}, not a state dict (a dict of tensors)")
    for key, value in obj.items():
        if not isinstance(key, str):
            raise _Refused(f"the key {key!r} ({type(key).__name__}); state dict keys are strings")
        if not isinstance(value, _Tensor):
            raise _Refused(f"{type(value).__name__} at key {key!r}, not a tensor")
    return obj


def _read_zip(archive, budget):
    """`(object, {storage key: bytes}, byteorder)` of a zip-format checkpoint."""
    pickles = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith("/data.pkl")]
    if len(pickles) != 1:
        raise _Refused(f"a zip archive with {len(pickles)} `<root>/data.pkl` entries, not 1")
    root = pickles[0][: -len("data.pkl")]
    byteorder = "<"
    if f"{root}byteorder" in archive.namelist():
        order = archive.read(f"{root}byteorder").decode("ascii", "replace").strip()
        if order not in ("little", "big"):
            raise _Refused(f"the byte order {order!r}")
        byteorder = "<" if order == "little" else ">"
    budget.take(archive.getinfo(pickles[0]).file_size, f"a pickle {pickles[0]}")
    unpickler = _Unpickler(io.BytesIO(archive.read(pickles[0])), legacy=False)
    obj = _state_dict(unpickler.load())
    data = {}
    for key, (code, numel) in unpickler.roots.items():
        name = f"{root}data/{key}"
        need = numel * _element_dtype(code, byteorder).itemsize
        try:
            size = archive.getinfo(name).file_size
        except KeyError:
            raise _Refused(f"no data for storage {key!r} ({name} is missing)") from None
        if size != need:
            raise _Refused(
                f"storage {key!r} of {numel} elements ({need} bytes) stored in {size} bytes"
            )
        budget.take(size, f"storage {key!r} of {size} bytes")
        data[key] = archive.read(name)
    return obj, data, byteorder


def _read_legacy(stream, total, budget):
    """`(object, {storage key: bytes}, "<")` of a legacy-format checkpoint."""
    header = _Unpickler(stream, legacy=True)
    if header.load() != LEGACY_MAGIC_NUMBER:
        raise _Refused("no PyTorch magic number at the start (not a checkpoint)")
    protocol = header.load()
    if protocol != LEGACY_PROTOCOL_VERSION:
        raise _Refused(f"the legacy protocol version {protocol!r}, not 1001")
    header.load()  # sys info: byte order and C type sizes; torch ignores it too
    unpickler = _Unpickler(stream, legacy=True)
    obj = _state_dict(unpickler.load())
    keys = _Unpickler(stream, legacy=True).load()
    if (
        not isinstance(keys, list)
        or not all(isinstance(key, str) for key in keys)
        or sorted(keys) != sorted(unpickler.roots)
    ):
        raise _Refused(f"the storage keys {keys!r} where the tensors use {sorted(unpickler.roots)}")
    data = {}
    for key in keys:
        code, numel = unpickler.roots[key]
        itemsize = _element_dtype(code, "<").itemsize
        prefix = stream.read(8)
        if len(prefix) != 8:
            raise _Refused(f"the file ends before storage {key!r}: truncated")
        (count,) = struct.unpack("<q", prefix)
        if count != numel:
            raise _Refused(f"storage {key!r} declared as {numel} elements, stored as {count}")
        if numel * itemsize > total - stream.tell():
            raise _Refused(
                f"storage {key!r} needs {numel * itemsize} bytes, the file has "
                f"{total - stream.tell()} left: truncated"
            )
        budget.take(numel * itemsize, f"storage {key!r} of {numel * itemsize} bytes")
        data[key] = stream.read(numel * itemsize)
    return obj, data, "<"


def _read_regular_file(path, budget):
    """The bytes of `path`, a regular file of at most the budget's size.

    Opened without blocking (a FIFO would wait for a writer) and checked on the open
    descriptor, so what is checked is what is read.
    """
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise CheckpointError(
                f"{path} is not a regular file (a device, FIFO, socket or folder), so not a "
                f"checkpoint; it was not read. Received: path={path!r}"
            )
        budget.take(status.st_size, f"{status.st_size} bytes of file")
        handle = os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise
    with handle:
        return handle.read(status.st_size)  # what it had when checked, no more


def read_torch_checkpoint(
    path: str | os.PathLike, max_bytes: int = MAX_BYTES
) -> dict[str, np.ndarray]:
    """Reads a PyTorch state dict (`.pth`, either format: see the module) into NumPy arrays
    without torch, running no code from it. A training checkpoint whose "state_dict" entry
    holds the tensors gives that entry.

    Args:
        path: the checkpoint file, a regular file.
        max_bytes: the most bytes the file may make the reader allocate; 1 GiB by default.

    Returns:
        A dict {name: NumPy array} in the file's order: C-contiguous copies in native byte
            order with torch's dtype, bfloat16 widened exactly to float32.

    Raises:
        CheckpointError: (a ValueError) naming the file: not a checkpoint, truncated, a
            global or storage type not allowed (e.g. `os.system`), a tensor that does not
            fit its storage, not a dict of tensors by string keys, not a regular file, or
            more than `max_bytes`.
    """
    path = os.fspath(path)
    budget = _Budget(max_bytes)
    try:
        content = _read_regular_file(path, budget)
        if zipfile.is_zipfile(io.BytesIO(content)):
            with zipfile.ZipFile(io.BytesIO(content)) as archive:
                obj, data, byteorder = _read_zip(archive, budget)
        else:
            obj, data, byteorder = _read_legacy(io.BytesIO(content), len(content), budget)
        return {
            key: _to_array(tensor, data[tensor.storage.key], byteorder, budget)
            for key, tensor in obj.items()
        }
    except CheckpointError:
        raise
    except OSError as error:
        raise CheckpointError(
            f"Cannot read the checkpoint {path} ({type(error).__name__}: {error}). "
            f"Received: path={path!r}"
        ) from None
    except _Refused as error:
        raise CheckpointError(
            f"Refused to read {path} as a PyTorch state dict: it holds {error}. Received: "
            f"path={path!r}"
        ) from None
    except (*_DAMAGED_FILE, *_MALFORMED_OBJECT, RecursionError, MemoryError) as error:
        raise CheckpointError(
            f"{path} is not a readable PyTorch checkpoint (damaged or truncated: "
            f"{type(error).__name__}: {error}). Received: path={path!r}"
        ) from None
