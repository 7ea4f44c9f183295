"""Write the PyTorch checkpoints that the checkpoint reader's and the download path's tests read.

Every file is written by torch itself (`torch.save`), so the tests check the reader
against PyTorch's real formats:

- ``tiny_zip.pth`` / ``tiny_legacy.pth``: one small state dict in the zip format and in
  the legacy stream (``_use_new_zipfile_serialization=False``, the format of torchvision's
  x0.5 / x1.0 files): a conv + BatchNorm module's state dict (float32, an int64 0-d
  ``num_batches_tracked``, the state dict's ``_metadata``), then float16, float64 (0-d),
  bfloat16, int32, int8, uint8 and bool tensors, float32 specials (-0.0, inf, nan), a
  transposed (non-contiguous) tensor, two views at offsets into one shared storage and an
  empty tensor;
- ``tiny_expected.npz``: what ``torch.load(..., weights_only=True)`` gives for each entry
  of both files (``.numpy()``; bfloat16 through ``.float()``), the reference the reader
  must equal bit for bit;
- ``complex.pth`` (a complex64 tensor) and ``int_key.pth`` (a key that is not a string):
  files torch writes that the reader must refuse;
- ``torchvision_shufflenet_v2_x0_5_legacy.pth``: the state dict of
  ``fixtures/torchvision_shufflenet_v2_x0_5.npz`` (torchvision's x0.5, 10 classes, seeded
  weights; see scripts/make_torchvision_fixture.py) in the legacy format, for the
  ``weights="imagenet"`` download tests (1.4 MB).

Needs torch and NumPy only (not Keras: the reader is loaded from its file). After writing,
it reads every file back with the reader and with torch and checks that they agree bit
for bit. The committed files were made with torch 2.13.0 (CPU) by::

    python scripts/make_torch_checkpoints.py --output tests/fixtures/torch_checkpoints
"""

import argparse
import collections
import importlib.util
import json
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
READER = ROOT / "keras_autoshuffle" / "applications" / "weights" / "torch_checkpoint.py"
TORCHVISION_FIXTURE = ROOT / "tests" / "fixtures" / "torchvision_shufflenet_v2_x0_5.npz"


def load_reader():
    """The checkpoint reader module, loaded from its file (no Keras import)."""
    spec = importlib.util.spec_from_file_location("torch_checkpoint", READER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_state_dict():
    """A small state dict with one tensor of each kind the reader must handle."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 1, bias=False), torch.nn.BatchNorm2d(3))
    module.train()
    module(torch.randn(4, 2, 5, 5))  # non-trivial running statistics, num_batches_tracked 1
    state = module.state_dict()  # an OrderedDict with `_metadata`
    shared = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state["half"] = torch.randn(5).half()
    state["double_scalar"] = torch.tensor(3.25, dtype=torch.float64)
    state["bfloat16"] = torch.randn(4).bfloat16()
    state["int32"] = torch.tensor([[1, -2], [3, 2**31 - 1]], dtype=torch.int32)
    state["int8"] = torch.tensor([-128, 0, 127], dtype=torch.int8)
    state["uint8"] = torch.tensor([0, 7, 255], dtype=torch.uint8)
    state["bool"] = torch.tensor([True, False, True])
    state["specials"] = torch.tensor([-0.0, float("inf"), float("-inf"), float("nan"), 1e-45])
    state["transposed"] = torch.randn(3, 4).t()  # strides (1, 4): not contiguous
    state["shared_column"] = shared[1:4, 2]  # offset 8, stride 6 into `shared`'s storage
    state["shared_block"] = shared[2:, 3:]  # offset 15, another view of the same storage
    state["empty"] = torch.empty(0, 3)
    return state


def as_numpy(tensor):
    """torch's own NumPy view of a tensor (bfloat16 widened to float32)."""
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.numpy()


def torchvision_state_dict():
    """The torchvision fixture's state dict as torch tensors, in torchvision's order."""
    with np.load(TORCHVISION_FIXTURE) as data:
        names = [k for k in data.files if k.startswith("weights/")]
        return collections.OrderedDict(
            (k.removeprefix("weights/"), torch.from_numpy(data[k].copy())) for k in names
        )


def check_agreement(reader, path):
    """The reader and `torch.load(weights_only=True)` give the same arrays, bit for bit."""
    ours = reader.read_torch_checkpoint(path)
    theirs = {k: as_numpy(v) for k, v in torch.load(path, weights_only=True).items()}
    assert list(ours) == list(theirs), (path, list(ours), list(theirs))
    for key, expected in theirs.items():
        got = ours[key]
        assert got.dtype == expected.dtype and got.shape == expected.shape, (path, key)
        assert got.tobytes() == np.ascontiguousarray(expected).tobytes(), (path, key)
    return theirs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, required=True, help="folder to write into")
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    reader = load_reader()

    state = tiny_state_dict()
    torch.save(state, args.output / "tiny_zip.pth")
    torch.save(state, args.output / "tiny_legacy.pth", _use_new_zipfile_serialization=False)
    expected = check_agreement(reader, args.output / "tiny_zip.pth")
    legacy = check_agreement(reader, args.output / "tiny_legacy.pth")
    for key, array in expected.items():
        assert array.tobytes() == legacy[key].tobytes(), key
    meta = {"torch": torch.__version__, "keys": list(expected)}
    np.savez(args.output / "tiny_expected.npz", meta=np.array(json.dumps(meta)), **expected)

    torch.save({"weight": torch.ones(2, dtype=torch.complex64)}, args.output / "complex.pth")
    torch.save({1: torch.ones(2)}, args.output / "int_key.pth")

    path = args.output / "torchvision_shufflenet_v2_x0_5_legacy.pth"
    torch.save(torchvision_state_dict(), path, _use_new_zipfile_serialization=False)
    check_agreement(reader, path)
    for file in sorted(args.output.iterdir()):
        print(f"wrote {file} ({file.stat().st_size:,} bytes)")
    print(f"the reader and torch {torch.__version__} agree bit for bit on every file read")


if __name__ == "__main__":
    main()
