"""EfficientNet-B0 at 224x224 (torchvision layout, BN folded into the convs as exporters do).

Input ``input`` float [B, 3, 224, 224]; output ``logits`` [B, 1000].  MBConv blocks: expand 1x1
conv + SiLU (Sigmoid then Mul), depthwise kxk conv (group == channels) + SiLU, squeeze-excitation
(GlobalAveragePool, 1x1 conv, SiLU, 1x1 conv, Sigmoid, Mul), project 1x1 conv, residual Add when
the shape is kept.  Head: 1x1 conv + SiLU, GlobalAveragePool, Flatten, Gemm.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

from ._builder import GraphBuilder

# (expand_ratio, kernel, stride, in_channels, out_channels, repeats)
FULL = dict(
    batch=1,
    image=224,
    stem=32,
    stages=[
        (1, 3, 1, 32, 16, 1),
        (6, 3, 2, 16, 24, 2),
        (6, 5, 2, 24, 40, 2),
        (6, 3, 2, 40, 80, 3),
        (6, 5, 1, 80, 112, 3),
        (6, 5, 2, 112, 192, 4),
        (6, 3, 1, 192, 320, 1),
    ],
    head=1280,
    classes=1000,
)
TINY = dict(
    batch=1,
    image=32,
    stem=8,
    stages=[(1, 3, 1, 8, 8, 1), (6, 3, 2, 8, 12, 2), (6, 5, 2, 12, 16, 1)],
    head=32,
    classes=10,
)


def mbconv(b: GraphBuilder, x: str, cin: int, cout: int, expand: int, k: int, stride: int) -> str:
    hidden = cin * expand
    squeeze = max(1, cin // 4)
    with b.scope("block"):
        h = x
        idx = 0
        if expand != 1:
            with b.scope(f"{idx}"):
                h = b.silu(b.conv(h, cin, hidden, 1, "0"))
            idx += 1
        with b.scope(f"{idx}"):
            h = b.silu(b.conv(h, hidden, hidden, k, "0", stride=stride, group=hidden))
        idx += 1
        with b.scope(f"{idx}"):  # squeeze-excitation
            s = b.op("GlobalAveragePool", [h])
            s = b.silu(b.conv(s, hidden, squeeze, 1, "fc1"))
            s = b.op("Sigmoid", [b.conv(s, squeeze, hidden, 1, "fc2")])
            h = b.op("Mul", [s, h])
        idx += 1
        with b.scope(f"{idx}"):
            h = b.conv(h, hidden, cout, 1, "0")
    if stride == 1 and cin == cout:
        h = b.op("Add", [h, x])
    return h


def build(tiny: bool = False) -> onnx.ModelProto:
    cfg = TINY if tiny else FULL
    B, I = cfg["batch"], cfg["image"]
    b = GraphBuilder("efficientnet_b0_tiny" if tiny else "efficientnet_b0", seed=4)
    x = b.input("input", TensorProto.FLOAT, [B, 3, I, I])
    with b.scope("features"):
        with b.scope("0"):
            x = b.silu(b.conv(x, 3, cfg["stem"], 3, "0", stride=2))
        c = cfg["stem"]
        for si, (e, k, s, cin, cout, n) in enumerate(cfg["stages"], start=1):
            assert cin == c
            for j in range(n):
                with b.scope(f"{si}/{j}"):
                    x = mbconv(b, x, c, cout, e, k, s if j == 0 else 1)
                c = cout
        with b.scope(f"{len(cfg['stages']) + 1}"):
            x = b.silu(b.conv(x, c, cfg["head"], 1, "0"))
    with b.scope("avgpool"):
        x = b.op("GlobalAveragePool", [x])
    x = b.op("Flatten", [x], axis=1)
    logits = b.gemm(x, cfg["head"], cfg["classes"], "classifier/1")
    b.output(logits, "logits", TensorProto.FLOAT, [B, cfg["classes"]])
    return b.build("EfficientNet-B0 tiny" if tiny else "EfficientNet-B0 (random weights, BN folded), 224x224, batch 1")
