"""torchvision's ShuffleNet v2 1.0x as a PyTorch user ships it, for `experiments.benchmark
--torchvision DIR`: needs a scratch install of torch and torchvision (not a dependency of
this package, never run in CI).

Writes into DIR `torchvision.onnx` (`torch.onnx.export`, opset 17, TorchScript exporter),
`state_dict.npz` (the seeded weights, with random BatchNorm statistics so that folding
shows) and `check.npz` (a seeded NCHW input `x` and torch's `logits` for it).

Usage:
    python experiments/torchvision_onnx.py DIR
"""

import os
import sys

import numpy as np


def main(argv=None):
    import torch
    import torchvision

    (out,) = argv if argv is not None else sys.argv[1:]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    net = torchvision.models.shufflenet_v2_x1_0(weights=None).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                n = module.num_features
                module.running_mean.copy_(torch.randn(n, generator=generator) * 0.1)
                module.running_var.copy_(torch.rand(n, generator=generator) + 0.5)
                module.weight.copy_(torch.rand(n, generator=generator) + 0.5)
                module.bias.copy_(torch.randn(n, generator=generator) * 0.1)
    x = np.random.default_rng(0).normal(size=(1, 3, 224, 224)).astype("float32")
    with torch.no_grad():
        logits = net(torch.from_numpy(x)).numpy()
    torch.onnx.export(
        net,
        (torch.from_numpy(x),),
        os.path.join(out, "torchvision.onnx"),
        opset_version=17,
        input_names=["input"],
        output_names=["logits"],
        dynamo=False,
    )
    state = {k: v.numpy() for k, v in net.state_dict().items()}
    np.savez(os.path.join(out, "state_dict.npz"), **state)
    np.savez(os.path.join(out, "check.npz"), x=x, logits=logits)
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}: wrote {out}")


if __name__ == "__main__":
    main()
