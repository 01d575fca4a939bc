"""RedNet as PyTorch writes it: the zoo's RedNet (models/rednet50.py: same stem, stages, 7x7
involutions, group_channels 16, reduction 4) written in torch with mmcls's involution, whose
unfold is nn.Unfold, exported by torch.onnx's TorchScript exporter (opset 17) and its dynamo
exporter (opset 18). The TorchScript exporter writes the unfold as Pad + Gather with constant (windowed) indices + Transpose + Reshape, not
the zoo's K*K Slice + Concat: the form issue 21 measured at 8x the DRAM bytes.

    python scripts/export_involution.py            # the tiny one, both exporters, committed under models/exported/involution/
    python scripts/export_involution.py --full OUT.onnx   # RedNet-50 at 224x224 (not committed: ~60 MB)

Needs torch (scripts/requirements-export.txt), never needed by gir or its tests.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from models.rednet50 import EXPANSION, FULL, GROUP_CHANNELS, REDUCTION, TINY  # noqa: E402

OUT = ROOT / "models" / "exported" / "involution"  # beside, not in, the manifest's files


class Involution(nn.Module):
    """mmcls's involution: kernels generated per pixel, applied to nn.Unfold's K*K windows."""

    def __init__(self, channels: int, kernel: int, stride: int):
        super().__init__()
        self.k, self.stride, self.channels = kernel, stride, channels
        self.groups = channels // GROUP_CHANNELS
        self.avgpool = nn.AvgPool2d(stride, stride) if stride > 1 else nn.Identity()
        self.conv1 = nn.Sequential(nn.Conv2d(channels, channels // REDUCTION, 1), nn.ReLU())
        self.conv2 = nn.Conv2d(channels // REDUCTION, kernel * kernel * self.groups, 1)
        self.unfold = nn.Unfold(kernel, 1, (kernel - 1) // 2, stride)

    def forward(self, x):
        weight = self.conv2(self.conv1(self.avgpool(x)))
        b, _, h, w = weight.shape
        weight = weight.view(b, self.groups, self.k * self.k, h, w).unsqueeze(2)
        out = self.unfold(x).view(b, self.groups, GROUP_CHANNELS, self.k * self.k, h, w)
        return (weight * out).sum(dim=3).view(b, self.channels, h, w)


class Bottleneck(nn.Module):
    def __init__(self, cin: int, planes: int, kernel: int, stride: int):
        super().__init__()
        cout = planes * EXPANSION
        self.conv1 = nn.Sequential(nn.Conv2d(cin, planes, 1), nn.ReLU())
        self.conv2 = nn.Sequential(Involution(planes, kernel, stride), nn.BatchNorm2d(planes), nn.ReLU())
        self.conv3 = nn.Conv2d(planes, cout, 1)
        self.down = nn.Conv2d(cin, cout, 1, stride) if stride != 1 or cin != cout else None
        with torch.no_grad():
            self.conv3.weight.mul_(0.2)  # small residual branch, as the zoo builds it

    def forward(self, x):
        identity = x if self.down is None else self.down(x)
        return torch.relu(self.conv3(self.conv2(self.conv1(x))) + identity)


class RedNet(nn.Module):
    """The zoo's RedNet configuration (models/rednet50.py TINY or FULL) in torch."""

    def __init__(self, cfg: dict):
        super().__init__()
        s, k = cfg["stem"], cfg["kernel"]
        self.stem = nn.Sequential(nn.Conv2d(3, s // 2, 3, 2, 1), nn.ReLU(), Involution(s // 2, 3, 1),
                                  nn.BatchNorm2d(s // 2), nn.ReLU(), nn.Conv2d(s // 2, s, 3, 1, 1), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        blocks, c = [], s
        for li, (planes, n) in enumerate(zip(cfg["planes"], cfg["layers"]), start=1):
            for j in range(n):
                blocks.append(Bottleneck(c, planes, k, 2 if (j == 0 and li > 1) else 1))
                c = planes * EXPANSION
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c, cfg["classes"])

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


def build(cfg: dict, seed: int = 0) -> RedNet:
    torch.manual_seed(seed)
    model = RedNet(cfg).eval()
    with torch.no_grad():  # bounded activations with random weights: BN statistics that normalise
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return model


def export(cfg: dict, path: Path, reference: Path | None, dynamo: bool = False) -> None:
    """TorchScript exporter at opset 17 by default; `dynamo`: the dynamo exporter at opset 18."""
    model = build(cfg)
    x = torch.randn(cfg["batch"], 3, cfg["image"], cfg["image"], generator=torch.Generator().manual_seed(1))
    if dynamo:
        torch.onnx.export(model, (x,), str(path), input_names=["input"], output_names=["logits"], opset_version=18,
                          dynamo=True, external_data=False)
    else:
        torch.onnx.export(model, (x,), str(path), input_names=["input"], output_names=["logits"], opset_version=17,
                          dynamo=False, do_constant_folding=True)
    if reference is not None:
        with torch.no_grad():
            y = model(x)
        np.savez(reference, input=x.numpy(), logits=y.numpy())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", metavar="OUT", help="export RedNet-50 at 224x224 to OUT instead (no reference)")
    args = ap.parse_args(argv)
    if args.full:
        export(FULL, Path(args.full), None)
        print(f"wrote {args.full}")
        return 0
    for name, dynamo in (("torchscript", False), ("dynamo", True)):
        stem = OUT / f"rednet_{name}"
        export(TINY, stem.with_suffix(".onnx"), stem.with_suffix(".npz"), dynamo)
        print(f"wrote {stem}.onnx and its .npz")
    return 0


if __name__ == "__main__":
    sys.exit(main())
