"""ShuffleNetV2 x1.0 at 224x224 (torchvision layout, BN folded into the convs).

Input ``input`` float [B, 3, 224, 224]; output ``logits`` [B, 1000].  Stem 3x3/2 conv + ReLU and a
3x3/2 MaxPool; stages of inverted-residual units: stride-2 units run two branches (depthwise 3x3/2
then 1x1, and 1x1 -> depthwise 3x3/2 -> 1x1) and Concat them, stride-1 units Split the input in two
and transform one half; every unit ends with a channel shuffle written as Reshape -> Transpose ->
Reshape.  conv5 1x1 + ReLU, global mean (ReduceMean over H, W) and a Gemm head.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

from ._builder import GraphBuilder

FULL = dict(batch=1, image=224, stem=24, stages=[(116, 4), (232, 8), (464, 4)], conv5=1024, classes=1000)
TINY = dict(batch=1, image=32, stem=8, stages=[(16, 1), (32, 2), (64, 1)], conv5=64, classes=10)


def channel_shuffle(b: GraphBuilder, x: str, B: int, C: int, HW: int) -> str:
    x = b.op("Reshape", [x, b.const([B, 2, C // 2, HW, HW])])
    x = b.op("Transpose", [x], perm=[0, 2, 1, 3, 4])
    return b.op("Reshape", [x, b.const([B, C, HW, HW])])


def unit(b: GraphBuilder, x: str, B: int, cin: int, cout: int, stride: int, hw_out: int) -> str:
    bf = cout // 2
    if stride == 1:
        x1, x2 = b.op("Split", [x, b.const([bf, bf])], n_out=2, axis=1)
        src, src_c = x2, bf
    else:
        with b.scope("branch1"):
            x1 = b.conv(x, cin, cin, 3, "0", stride=stride, group=cin)
            x1 = b.op("Relu", [b.conv(x1, cin, bf, 1, "2")])
        src, src_c = x, cin
    with b.scope("branch2"):
        h = b.op("Relu", [b.conv(src, src_c, bf, 1, "0")])
        h = b.conv(h, bf, bf, 3, "3", stride=stride, group=bf)
        h = b.op("Relu", [b.conv(h, bf, bf, 1, "5")])
    y = b.op("Concat", [x1, h], axis=1)
    return channel_shuffle(b, y, B, cout, hw_out)


def build(tiny: bool = False) -> onnx.ModelProto:
    cfg = TINY if tiny else FULL
    B, I = cfg["batch"], cfg["image"]
    b = GraphBuilder("shufflenet_v2_tiny" if tiny else "shufflenet_v2_x1_0", seed=5)
    x = b.input("input", TensorProto.FLOAT, [B, 3, I, I])
    with b.scope("conv1"):
        x = b.op("Relu", [b.conv(x, 3, cfg["stem"], 3, "0", stride=2)])
    hw = I // 2
    with b.scope("maxpool"):
        x = b.op("MaxPool", [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2], ceil_mode=0)
    hw //= 2
    c = cfg["stem"]
    for si, (cout, n) in enumerate(cfg["stages"], start=2):
        for j in range(n):
            stride = 2 if j == 0 else 1
            if stride == 2:
                hw //= 2
            with b.scope(f"stage{si}/stage{si}.{j}"):
                x = unit(b, x, B, c, cout, stride, hw)
            c = cout
    with b.scope("conv5"):
        x = b.op("Relu", [b.conv(x, c, cfg["conv5"], 1, "0")])
    x = b.op("ReduceMean", [x], axes=[2, 3], keepdims=0)
    logits = b.gemm(x, cfg["conv5"], cfg["classes"], "fc")
    b.output(logits, "logits", TensorProto.FLOAT, [B, cfg["classes"]])
    return b.build("ShuffleNetV2 tiny" if tiny else "ShuffleNetV2 x1.0 (random weights, BN folded), 224x224, batch 1")
