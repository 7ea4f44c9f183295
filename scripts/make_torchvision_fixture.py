"""Write a torchvision ShuffleNet V2 reference fixture for the weight-converter test.

Builds ``torchvision.models.shufflenet_v2_x{0_5,1_0,1_5,2_0}(weights=None)`` with seeded
random weights, gives every BatchNorm non-trivial statistics, runs two images (224x224 and
225x225, an even and an odd side) through it in float32 and saves to one ``.npz``:

- ``weights/<name>``: every ``model.state_dict()`` entry as torch has it (``num_batches_tracked``
  included);
- ``inputs_224``, ``inputs_225``: the images, NHWC ``(1, H, W, 3)`` float32, as a Keras user feeds
  them (transposed to NCHW only for the torch forward pass);
- ``logits_224``, ``logits_225``: the model's outputs, ``(1, classes)`` float32;
- ``meta``: a JSON string with the torch / torchvision versions, width, classes, seed and the
  BN and conv init recipes.

Conv weights are re-drawn He-normal (fan-in; gain for ReLU on the dense convs, which all feed a
BN + ReLU, and linear on the depthwise ones, which feed a BN only). With torch's default conv init
(kaiming-uniform, a=sqrt(5): variance gain 1/3 per conv) and these BN statistics, which do not
renormalise, the input signal died out by stage3: the logits were ~0.1, mostly fc.bias, and the
two images' logits agreed to 5e-4, so stage3/stage4 weights were barely tested.

Needs torch and torchvision (not dependencies of this package). The committed fixture was made with
torch 2.14.1 and torchvision 0.29.1 by::

    python scripts/make_torchvision_fixture.py --width 0.5 --classes 10 \\
        --output tests/fixtures/torchvision_shufflenet_v2_x0_5.npz
"""

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torchvision
from torch import nn

MODELS = {
    0.5: torchvision.models.shufflenet_v2_x0_5,
    1.0: torchvision.models.shufflenet_v2_x1_0,
    1.5: torchvision.models.shufflenet_v2_x1_5,
    2.0: torchvision.models.shufflenet_v2_x2_0,
}
BN_RECIPE = (
    "every BatchNorm2d: weight ~ U(0.5, 1.5), bias ~ N(0, 0.1), running_mean ~ N(0, 0.1), "
    "running_var ~ U(0.5, 1.5); fc.bias ~ N(0, 0.1) (N(0, s): s is the standard deviation)"
)
CONV_INIT = (
    "conv weights kaiming_normal_(mode='fan_in'), nonlinearity 'relu' for dense convs and "
    "'linear' for depthwise ones; fc.weight torch's default init"
)
SIZES = (224, 225)


@torch.no_grad()
def build_model(width: float, classes: int) -> nn.Module:
    """The torchvision model with its convs, BatchNorms and fc bias re-drawn, in eval mode."""
    model = MODELS[width](weights=None, num_classes=classes)
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            gain = "relu" if module.groups == 1 else "linear"  # depthwise convs have no ReLU after
            nn.init.kaiming_normal_(module.weight, mode="fan_in", nonlinearity=gain)
        elif isinstance(module, nn.BatchNorm2d):
            module.weight.uniform_(0.5, 1.5)
            module.bias.normal_(0.0, 0.1)
            module.running_mean.normal_(0.0, 0.1)
            module.running_var.uniform_(0.5, 1.5)
    model.fc.bias.normal_(0.0, 0.1)
    return model.eval()


@torch.no_grad()
def make_fixture(width: float, classes: int, seed: int) -> dict[str, np.ndarray]:
    """All arrays of the fixture, keyed as they are saved."""
    torch.manual_seed(seed)
    model = build_model(width, classes)
    arrays = {f"weights/{name}": t.numpy() for name, t in model.state_dict().items()}
    for size in SIZES:
        images = torch.randn(1, size, size, 3, dtype=torch.float32)  # NHWC
        logits = model(images.permute(0, 3, 1, 2).contiguous()).numpy()
        arrays[f"inputs_{size}"] = images.numpy()
        arrays[f"logits_{size}"] = logits
        print(f"{size}x{size}: max |logit| {np.abs(logits).max():.4g}, std {logits.std():.4g}")
    change = np.abs(arrays["logits_224"] - arrays["logits_225"]).max()
    print(f"max |logits_224 - logits_225| {change:.4g} (the logits depend on the image)")
    meta = {
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "width": width,
        "classes": classes,
        "seed": seed,
        "bn_recipe": BN_RECIPE,
        "conv_init": CONV_INIT,
    }
    arrays["meta"] = np.array(json.dumps(meta))
    return arrays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=float, choices=sorted(MODELS), required=True)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, required=True, help="path of the .npz to write")
    args = parser.parse_args()
    arrays = make_fixture(args.width, args.classes, args.seed)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.output, **arrays)
    print(f"wrote {args.output} ({args.output.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
