"""`read_torch_checkpoint`: PyTorch's two formats read bit for bit as torch reads them, and
every hostile or damaged file refused with an error naming it, without running its code.

The good files under `fixtures/torch_checkpoints/` were written by torch 2.13.0 itself
(`scripts/make_torch_checkpoints.py`), together with torch's own reading of them
(`tiny_expected.npz`). The hostile and damaged files are made here: by truncating torch's
files, or with `write_zip` / `write_legacy` below, which lay out PyTorch's two formats
around any pickle, so a test can put in what torch would never write.
"""

import io
import json
import os
import pickle
import pickletools
import struct
import threading
import zipfile

import numpy as np
import pytest

from keras_autoshuffle.applications import CheckpointError, read_torch_checkpoint
from keras_autoshuffle.applications.weights.torch_checkpoint import (
    LEGACY_MAGIC_NUMBER,
    LEGACY_PROTOCOL_VERSION,
)

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
CHECKPOINTS = os.path.join(FIXTURES, "torch_checkpoints")


def fixture(name):
    return os.path.join(CHECKPOINTS, name)


# --- A writer of PyTorch's layouts around any pickle (for files torch would not write) ---


class Global:
    """A global by name, written as GLOBAL `module name` (the module need not exist)."""

    def __init__(self, module, name):
        self.module, self.name = module, name

    def __call__(self, *args):  # pickle's save_reduce wants a callable; never called
        raise AssertionError("a test stand-in is never called")


class Call:
    """Pickled as `func(*args)` (REDUCE)."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


class Storage:
    """A storage reference: pickled as a persistent id, its bytes written beside."""

    def __init__(self, key, kind, data, view=None, numel=None):
        self.key, self.kind, self.data, self.view = key, kind, data, view
        self.numel = numel


class _Pickler(pickle._Pickler):  # the pure-Python pickler lets `save` be extended
    def __init__(self, file, legacy):
        super().__init__(file, protocol=2)
        self.legacy = legacy

    def persistent_id(self, obj):
        if not isinstance(obj, Storage):
            return None
        numel = obj.numel if obj.numel is not None else obj.data.size
        pid = ("storage", Global("torch", obj.kind), obj.key, "cpu", numel)
        return pid + (obj.view,) if self.legacy else pid

    def save(self, obj, save_persistent_id=True):
        if isinstance(obj, Global):
            self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())
            return
        super().save(obj, save_persistent_id)


def ordered_dict(items=()):
    return Call(Global("collections", "OrderedDict"), list(items))


def tensor(storage, offset, size, stride, *extra):
    hooks = ordered_dict()
    rebuild = Global("torch._utils", "_rebuild_tensor_v2")
    return Call(rebuild, storage, offset, size, stride, False, hooks, *extra)


def dumps(obj, legacy):
    buffer = io.BytesIO()
    _Pickler(buffer, legacy).dump(obj)
    return buffer.getvalue()


def write_zip(path, obj, storages):
    """PyTorch's zip layout: `archive/data.pkl` and one `archive/data/<key>` per storage."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", dumps(obj, legacy=False))
        archive.writestr("archive/byteorder", "little")
        for storage in storages:
            archive.writestr(f"archive/data/{storage.key}", storage.data.tobytes())
    return str(path)


def write_legacy(path, obj, storages):
    """PyTorch's legacy stream: magic, protocol, sys info, object, keys, raw storages."""
    info = {"protocol_version": 1001, "little_endian": True, "type_sizes": {"int": 4}}
    parts = [pickle.dumps(v, protocol=2) for v in (LEGACY_MAGIC_NUMBER, 1001, info)]
    parts.append(dumps(obj, legacy=True))
    parts.append(pickle.dumps([s.key for s in storages], protocol=2))
    for storage in storages:
        parts.append(struct.pack("<q", len(storage.data)) + storage.data.tobytes())
    with open(path, "wb") as handle:
        handle.write(b"".join(parts))
    return str(path)


WRITERS = {"zip": write_zip, "legacy": write_legacy}


def refused(path, *fragments):
    """Reads `path`, expecting a CheckpointError that names it and contains `fragments`."""
    with pytest.raises(CheckpointError) as info:
        read_torch_checkpoint(path)
    message = str(info.value)
    assert str(path) in message and message.endswith(f"Received: path={str(path)!r}")
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


# --- Files written by torch ---


@pytest.mark.parametrize("name", ["tiny_zip.pth", "tiny_legacy.pth"])
def test_both_formats_read_as_torch_reads_them_bit_for_bit(name):
    with np.load(fixture("tiny_expected.npz")) as data:
        meta = json.loads(str(data["meta"]))
        expected = {key: data[key] for key in meta["keys"]}
    arrays = read_torch_checkpoint(fixture(name))
    assert list(arrays) == meta["keys"]  # the file's order
    for key, want in expected.items():
        got = arrays[key]
        assert (got.dtype, got.shape) == (want.dtype, want.shape), key
        assert got.tobytes() == want.tobytes(), key  # NaN payloads and -0.0 included
        assert got.flags.c_contiguous and got.flags.writeable, key  # a copy, not a view
    # The views of one storage, the transposed tensor and the 0-d ones, as torch has them.
    np.testing.assert_array_equal(arrays["shared_column"], [8.0, 14.0, 20.0])
    np.testing.assert_array_equal(arrays["shared_block"], [[15, 16, 17], [21, 22, 23]])
    assert arrays["transposed"].shape == (4, 3) and arrays["double_scalar"] == 3.25
    assert arrays["1.num_batches_tracked"].dtype == np.int64
    assert arrays["bfloat16"].dtype == np.float32  # widened exactly


def test_torchvision_state_dict_in_the_legacy_format():
    # torchvision's x0.5 / x1.0 files are legacy streams; this one has the parity
    # fixture's weights, saved by torch in that format.
    arrays = read_torch_checkpoint(fixture("torchvision_shufflenet_v2_x0_5_legacy.pth"))
    with np.load(os.path.join(FIXTURES, "torchvision_shufflenet_v2_x0_5.npz")) as data:
        expected = {k.removeprefix("weights/"): data[k] for k in data.files if "weights/" in k}
    assert list(arrays) == list(expected)
    for key, want in expected.items():
        assert arrays[key].dtype == want.dtype and arrays[key].tobytes() == want.tobytes()


def test_written_layouts_read_back(tmp_path):
    # The writer above lays out what torch does: a well-formed file reads back.
    data = np.arange(6, dtype="<f4")
    storage = Storage("0", "FloatStorage", data)
    obj = ordered_dict([("w", tensor(storage, 1, (2, 2), (1, 2)))])
    for kind, write in WRITERS.items():
        arrays = read_torch_checkpoint(write(tmp_path / f"{kind}.pth", obj, [storage]))
        np.testing.assert_array_equal(arrays["w"], [[1, 3], [2, 4]])


def test_legacy_storage_views(tmp_path):
    # torch < 0.4 wrote storage views: (view key, element offset, elements) of a root.
    data = np.arange(10, dtype="<f8")
    root = Storage("root", "DoubleStorage", data)
    view = Storage("root", "DoubleStorage", data, view=("v", 4, 3), numel=10)
    obj = ordered_dict([("a", tensor(root, 0, (2,), (1,))), ("b", tensor(view, 1, (2,), (1,)))])
    arrays = read_torch_checkpoint(write_legacy(tmp_path / "views.pth", obj, [root]))
    np.testing.assert_array_equal(arrays["a"], [0, 1])
    np.testing.assert_array_equal(arrays["b"], [5, 6])
    beyond = Storage("root", "DoubleStorage", data, view=("v", 8, 3), numel=10)
    obj = ordered_dict([("a", tensor(beyond, 0, (1,), (1,)))])
    refused(write_legacy(tmp_path / "beyond.pth", obj, [root]), "storage view")


# --- Hostile files: code is never run ---


@pytest.mark.parametrize("kind", ["zip", "legacy"])
@pytest.mark.parametrize("where", ["top", "in a tensor"])
def test_a_pickle_that_would_run_code_is_refused(tmp_path, kind, where):
    marker = tmp_path / "marker"
    attack = Call(os.system, f"touch {marker}")
    data = np.ones(2, "<f4")
    storage = Storage("0", "FloatStorage", data)
    if where == "top":
        obj = attack
    else:  # hidden where the backward hooks go
        rebuild = Global("torch._utils", "_rebuild_tensor_v2")
        hostile = Call(rebuild, storage, 0, (2,), (1,), False, attack)
        obj = ordered_dict([("w", hostile)])
    path = WRITERS[kind](tmp_path / "evil.pth", obj, [storage])
    # The file really asks pickle to call os.system.
    with open(path, "rb") as handle:
        content = handle.read()
    if kind == "zip":
        content = zipfile.ZipFile(path).read("archive/data.pkl")
        ops = [(op.name, arg) for op, arg, _ in pickletools.genops(content)]
        assert ("GLOBAL", f"{os.system.__module__} system") in ops and ("REDUCE", None) in ops
    else:
        assert f"{os.system.__module__}\nsystem".encode() in content
    refused(path, f"{os.system.__module__}.system", "nothing from the file was run")
    assert not marker.exists()


@pytest.mark.parametrize(
    "module, name",
    [
        ("builtins", "eval"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("torch", "load"),
        ("torch._utils", "_rebuild_device_tensor_from_numpy"),
        ("collections", "defaultdict"),
    ],
)
def test_every_other_global_is_refused(tmp_path, module, name):
    obj = ordered_dict([("w", Call(Global(module, name), "1"))])
    refused(write_zip(tmp_path / "other.pth", obj, []), f"{module}.{name}")


def test_stand_ins_cannot_be_called_or_changed(tmp_path):
    data = np.ones(2, "<f4")
    storage = Storage("0", "FloatStorage", data)
    # A storage class is not callable (torch's is; its constructor reads memory).
    obj = ordered_dict([("w", Call(Global("torch", "FloatStorage"), 10))])
    refused(write_zip(tmp_path / "call.pth", obj, []), "not a readable PyTorch checkpoint")

    class Build:  # BUILD on a tensor: pickle would set its attributes
        def __reduce__(self):
            return tensor(storage, 0, (2,), (1,)).__reduce__() + ({"shape": (10**9,)},)

    obj = ordered_dict([("w", Build())])
    refused(write_zip(tmp_path / "build.pth", obj, [storage]), "state set on a Tensor")


# --- Damaged files ---


@pytest.mark.parametrize("name", ["tiny_zip.pth", "tiny_legacy.pth"])
def test_truncated_files_are_refused(tmp_path, name):
    with open(fixture(name), "rb") as handle:
        content = handle.read()
    for size in (0, 10, len(content) // 3, len(content) // 2, len(content) - 1):
        path = tmp_path / f"cut_{size}.pth"
        path.write_bytes(content[:size])
        refused(path)


def test_not_checkpoints_are_refused(tmp_path):
    text = tmp_path / "text.pth"
    text.write_text("not a checkpoint")
    refused(text, "not a readable PyTorch checkpoint")
    plain = tmp_path / "plain.pth"
    plain.write_bytes(pickle.dumps({"w": 1}))  # a pickle, but no PyTorch magic number
    refused(plain, "magic number")
    with pytest.raises(CheckpointError, match="Cannot read the checkpoint .*missing.pth"):
        read_torch_checkpoint(tmp_path / "missing.pth")


@pytest.mark.parametrize("kind", ["zip", "legacy"])
def test_tensors_that_do_not_fit_their_storage_are_refused(tmp_path, kind):
    write = WRITERS[kind]
    storage = Storage("0", "FloatStorage", np.ones(4, "<f4"))
    cases = {
        "past_end": (tensor(storage, 0, (5,), (1,)), "reaches element 5 of a storage of 4"),
        "offset": (tensor(storage, 3, (2,), (1,)), "reaches element 5"),
        "strides": (tensor(storage, 0, (2, 2), (3, 1)), "reaches element 5"),
        "rank": (tensor(storage, 0, (2, 2), (1,)), "with strides"),
        "negative": (tensor(storage, 0, (2,), (-1,)), "stride"),
        "shape_type": (tensor(storage, 0, [2], (1,)), "shape"),
        "huge": (tensor(storage, 0, (2**20, 2**20), (0, 0)), "elements"),
        "hooks": (
            Call(
                Global("torch._utils", "_rebuild_tensor_v2"),
                storage,
                0,
                (2,),
                (1,),
                False,
                ordered_dict([("hook", 1)]),
            ),
            "backward hooks",
        ),
        "metadata": (tensor(storage, 0, (2,), (1,), {"neg": True}), "metadata"),
    }
    for label, (value, fragment) in cases.items():
        path = write(tmp_path / f"{label}.pth", ordered_dict([("w", value)]), [storage])
        refused(path, fragment)


def test_storage_bytes_that_do_not_match_the_declared_size_are_refused(tmp_path):
    short = Storage("0", "FloatStorage", np.ones(3, "<f4"), numel=4)
    obj = ordered_dict([("w", tensor(short, 0, (3,), (1,)))])
    refused(write_zip(tmp_path / "short.pth", obj, [short]), "4 elements (16 bytes) stored in 12")
    refused(write_legacy(tmp_path / "short_legacy.pth", obj, [short]), "declared as 4 elements")
    missing = Storage("1", "FloatStorage", np.ones(3, "<f4"))
    obj = ordered_dict([("w", tensor(missing, 0, (3,), (1,)))])
    refused(write_zip(tmp_path / "missing.pth", obj, []), "no data for storage '1'")
    refused(write_legacy(tmp_path / "missing_legacy.pth", obj, []), "storage keys")
    # One key declared with two dtypes.
    a = Storage("0", "FloatStorage", np.ones(2, "<f4"))
    b = Storage("0", "IntStorage", np.ones(2, "<i4"))
    obj = ordered_dict([("a", tensor(a, 0, (2,), (1,))), ("b", tensor(b, 0, (2,), (1,)))])
    refused(write_zip(tmp_path / "two_dtypes.pth", obj, [a]), "declared as 2 elements")


def test_wrong_dtypes_are_refused(tmp_path):
    # Written by torch: a complex64 tensor.
    refused(fixture("complex.pth"), "torch.ComplexFloatStorage", "real and integer")
    storage = Storage("0", "QInt8Storage", np.ones(2, "i1"))
    obj = ordered_dict([("w", tensor(storage, 0, (2,), (1,)))])
    refused(write_zip(tmp_path / "qint8.pth", obj, [storage]), "torch.QInt8Storage")


def test_keys_and_values_that_are_not_a_state_dict_are_refused(tmp_path):
    # Written by torch: {1: tensor}.
    refused(fixture("int_key.pth"), "the key 1 (int)", "keys are strings")
    storage = Storage("0", "FloatStorage", np.ones(2, "<f4"))
    good = tensor(storage, 0, (2,), (1,))
    cases = {
        "list": ([good], "a list, not a state dict"),
        "int_value": (ordered_dict([("w", good), ("epoch", 3)]), "int at key 'epoch'"),
        "tuple_key": (ordered_dict([(("a", "b"), good)]), "the key ('a', 'b') (tuple)"),
    }
    for label, (obj, fragment) in cases.items():
        for kind, write in WRITERS.items():
            refused(write(tmp_path / f"{label}_{kind}.pth", obj, [storage]), fragment)
    # A training checkpoint: its "state_dict" entry is read, the rest ignored.
    wrapped = {"state_dict": ordered_dict([("w", good)]), "epoch": 3}
    arrays = read_torch_checkpoint(write_zip(tmp_path / "wrapped.pth", wrapped, [storage]))
    assert list(arrays) == ["w"]


def test_constants_are_torchs():
    # torch/serialization.py: MAGIC_NUMBER, PROTOCOL_VERSION.
    assert (LEGACY_MAGIC_NUMBER, LEGACY_PROTOCOL_VERSION) == (0x1950A86A20F9469CFC6C, 1001)


# --- What a file can make the reader allocate, and what it can make it wait for ---


def test_a_storage_inflating_past_the_bound_is_refused_without_allocating_it(tmp_path):
    # 2^27 float64 zeros (1 GiB) deflate to about 1 MB; the tensor asks for one element.
    import tracemalloc

    numel = 2**27
    obj = ordered_dict(
        [("w", tensor(Storage("0", "DoubleStorage", None, numel=numel), 0, (1,), (1,)))]
    )
    path = tmp_path / "bomb.pth"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", dumps(obj, legacy=False))
        with archive.open("archive/data/0", "w", force_zip64=True) as entry:
            block = bytes(1 << 20)
            for _ in range(numel * 8 // len(block)):
                entry.write(block)
    assert os.path.getsize(path) < 2 * 2**20
    tracemalloc.start()
    try:
        refused(path, "storage '0' of 1073741824 bytes", "max_bytes=1073741824")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, peak
    # Under a larger bound it reads, and the one element comes back.
    small = tmp_path / "small.pth"
    storage = Storage("0", "DoubleStorage", np.zeros(1000, "<f8"))
    write_zip(small, ordered_dict([("w", tensor(storage, 0, (1,), (1,)))]), [storage])
    assert read_torch_checkpoint(small)["w"].tolist() == [0.0]
    with pytest.raises(CheckpointError, match="past the reader's bound max_bytes=7000"):
        read_torch_checkpoint(small, max_bytes=7000)


@pytest.mark.parametrize("kind", ["zip", "legacy"])
def test_a_view_larger_than_its_storage_is_refused(tmp_path, kind):
    # shape (2^31,) with stride 0 over one float64: a 16 GiB copy from a tiny file.
    storage = Storage("0", "DoubleStorage", np.ones(1, "<f8"))
    obj = ordered_dict([("w", tensor(storage, 0, (2**31,), (0,)))])
    path = WRITERS[kind](tmp_path / "stride0.pth", obj, [storage])
    assert os.path.getsize(path) < 1000
    refused(path, "(2147483648 elements) over a storage of 1 elements")
    # The views a state dict holds (shared storages, transposes) still read.
    storage = Storage("0", "FloatStorage", np.arange(4, dtype="<f4"))
    obj = ordered_dict(
        [("a", tensor(storage, 0, (2, 2), (1, 2))), ("b", tensor(storage, 0, (4,), (1,)))]
    )
    arrays = read_torch_checkpoint(WRITERS[kind](tmp_path / "views.pth", obj, [storage]))
    np.testing.assert_array_equal(arrays["a"], [[0, 2], [1, 3]])


def test_many_tensors_over_one_storage_are_bounded_in_total(tmp_path):
    storage = Storage("0", "FloatStorage", np.ones(1000, "<f4"))
    obj = ordered_dict([(f"w{i}", tensor(storage, 0, (1000,), (1,))) for i in range(50)])
    path = write_zip(tmp_path / "many.pth", obj, [storage])
    assert len(read_torch_checkpoint(path)) == 50
    with pytest.raises(CheckpointError, match="a tensor of shape \\(1000,\\)"):
        read_torch_checkpoint(path, max_bytes=100_000)


def test_only_regular_files_are_read(tmp_path):
    fifo = tmp_path / "fifo.pth"
    os.mkfifo(fifo)  # nobody writes: open() for reading would block for ever

    def unblock():  # a reader still blocked after 10 s is let go, to fail, not hang
        if not done.wait(10):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    done = threading.Event()
    watchdog = threading.Thread(target=unblock, daemon=True)
    watchdog.start()
    try:
        for path in (str(fifo), "/dev/zero", str(tmp_path)):
            with pytest.raises(CheckpointError, match="is not a regular file") as info:
                read_torch_checkpoint(path)
            assert f"Received: path={path!r}" in str(info.value)
    finally:
        done.set()
        watchdog.join()


def test_a_negative_storage_size_is_refused_by_name(tmp_path):
    for kind, write in WRITERS.items():
        storage = Storage("0", "FloatStorage", np.ones(2, "<f4"), numel=-1)
        path = write(
            tmp_path / f"negative_{kind}.pth",
            ordered_dict([("w", tensor(storage, 0, (0,), (1,)))]),
            [],
        )
        refused(path, "storage '0' declared as -1 elements")


# --- Issue 39: a file cannot change the reader for the reads after it ---


def _build_on_global(module, name, state):
    """A pickle whose BUILD sets `state` on the global `module.name` itself, then holds an
    empty state dict (BUILD on a global: what torch never writes)."""
    return (
        b"\x80\x02"
        + pickle.GLOBAL
        + f"{module}\n{name}\n".encode()
        + pickle.dumps(state, 2)[2:-1]  # the state, without PROTO and STOP
        + pickle.BUILD
        + pickle.POP
        + pickle.EMPTY_DICT
        + pickle.STOP
    )


@pytest.mark.parametrize(
    "module, name",
    [
        ("torch._utils", "_rebuild_tensor_v2"),
        ("torch._utils", "_rebuild_tensor"),
        ("torch._utils", "_rebuild_parameter"),
        ("collections", "OrderedDict"),
        ("torch", "FloatStorage"),
    ],
)
def test_a_build_on_an_allowed_global_is_refused_and_poisons_nothing(tmp_path, module, name):
    # Setting `__defaults__` of the stand-in of _rebuild_tensor_v2 (metadata="poison")
    # made every later read in the process fail ("a tensor with metadata 'poison'").
    with np.load(fixture("tiny_expected.npz")) as data:
        keys = json.loads(str(data["meta"]))["keys"]
    for i, state in enumerate(
        [
            (None, {"__defaults__": ("poison",), "__kwdefaults__": {"x": 1}}),
            {"__defaults__": ("poison",), "poisoned": True},
        ]
    ):
        path = tmp_path / f"build_{i}.pth"
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("archive/data.pkl", _build_on_global(module, name, state))
        refused(path, f"state set on the global {module}.{name}")
        legacy = tmp_path / f"build_{i}_legacy.pth"
        head = [pickle.dumps(v, protocol=2) for v in (LEGACY_MAGIC_NUMBER, 1001, {})]
        legacy.write_bytes(b"".join([*head, _build_on_global(module, name, state)]))
        refused(legacy, f"state set on the global {module}.{name}")
        # The same process reads good files as before.
        for good in ("tiny_zip.pth", "tiny_legacy.pth"):
            assert list(read_torch_checkpoint(fixture(good))) == keys
