"""RedNet-50 at 224x224 (mmcls ``RedNet`` layout: ResNet-50 with involution replacing the 3x3 convs).

Input ``input`` float [B, 3, 224, 224]; output ``logits`` [B, 1000].  Deep stem (3x3/2 conv,
3x3 involution, 3x3 conv) + 3x3/2 MaxPool, bottleneck stages [3, 4, 6, 3] whose middle layer is a
7x7 involution (stride in the involution, v1.5 style), GlobalAveragePool, Flatten, Gemm.  BN is
folded into the convs; the involution's BN+ReLU that follow it stay as BatchNormalization + Relu.

Involution (channels C, kernel K, stride s, group_channels 16, G = C / 16 groups, reduction 4):
kernel generation  w = conv2(relu(conv1(x or AveragePool_s(x))))      -> [B, K*K*G, h, w]
                   Reshape                                              -> [B, G, 1, K*K, h, w]
unfold             Pad(x, (K-1)/2), K*K strided Slice + Unsqueeze, Concat -> [B, C, K*K, h, w]
                   Reshape                                              -> [B, G, 16, K*K, h, w]
out              = Reshape(ReduceSum(w * unfold, axis=3), [B, C, h, w])
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

from ._builder import GraphBuilder

FULL = dict(batch=1, image=224, stem=64, planes=[64, 128, 256, 512], layers=[3, 4, 6, 3], kernel=7, classes=1000)
TINY = dict(batch=1, image=32, stem=32, planes=[16, 32], layers=[1, 1], kernel=7, classes=10)

GROUP_CHANNELS = 16
REDUCTION = 4
EXPANSION = 4


def involution(b: GraphBuilder, x: str, B: int, C: int, hw_in: int, K: int, stride: int) -> str:
    G = C // GROUP_CHANNELS
    KK = K * K
    hw = hw_in // stride
    src = x
    if stride > 1:
        src = b.op("AveragePool", [x], kernel_shape=[stride, stride], strides=[stride, stride])
    with b.scope("conv1"):
        w = b.op("Relu", [b.conv(src, C, C // REDUCTION, 1, "conv")])
    with b.scope("conv2"):
        # keep the generated kernels ~1/K so that random weights give bounded activations
        w = b.conv(w, C // REDUCTION, KK * G, 1, "conv", gain=float(1.0 / K / 1.4142))
    w = b.op("Reshape", [w, b.const([B, G, 1, KK, hw, hw])])

    with b.scope("unfold"):
        p = (K - 1) // 2
        xp = b.op("Pad", [x, b.const([0, 0, p, p, 0, 0, p, p])], mode="constant")
        axes = b.const([2, 3])
        steps = b.const([stride, stride])
        u_axis = b.const([2])
        cols = []
        for i in range(K):
            for j in range(K):
                ends = [i + stride * (hw - 1) + 1, j + stride * (hw - 1) + 1]
                s = b.op("Slice", [xp, b.const([i, j]), b.const(ends), axes, steps])
                cols.append(b.op("Unsqueeze", [s, u_axis]))
        u = b.op("Concat", cols, axis=2)
        u = b.op("Reshape", [u, b.const([B, G, GROUP_CHANNELS, KK, hw, hw])])
    y = b.op("Mul", [w, u])
    y = b.op("ReduceSum", [y, b.const([3])], keepdims=0)
    return b.op("Reshape", [y, b.const([B, C, hw, hw])])


def bottleneck(b: GraphBuilder, x: str, B: int, cin: int, planes: int, hw: int, K: int, stride: int) -> str:
    cout = planes * EXPANSION
    h = b.op("Relu", [b.conv(x, cin, planes, 1, "conv1")])
    with b.scope("conv2"):
        h = involution(b, h, B, planes, hw, K, stride)
    h = b.op("Relu", [b.batch_norm(h, planes, "bn2")])
    h = b.conv(h, planes, cout, 1, "conv3", gain=0.2)  # small residual branch (like zero-init BN)
    if stride != 1 or cin != cout:
        idn = b.conv(x, cin, cout, 1, "downsample/0", stride=stride)
    else:
        idn = x
    return b.op("Relu", [b.op("Add", [h, idn])])


def build(tiny: bool = False) -> onnx.ModelProto:
    cfg = TINY if tiny else FULL
    B, I, K, S = cfg["batch"], cfg["image"], cfg["kernel"], cfg["stem"]
    b = GraphBuilder("rednet50_tiny" if tiny else "rednet50", seed=6)
    x = b.input("input", TensorProto.FLOAT, [B, 3, I, I])
    hw = I // 2
    with b.scope("backbone/stem"):
        x = b.op("Relu", [b.conv(x, 3, S // 2, 3, "0", stride=2)])
        with b.scope("1"):
            x = involution(b, x, B, S // 2, hw, 3, 1)
        x = b.op("Relu", [b.batch_norm(x, S // 2, "2")])
        x = b.op("Relu", [b.conv(x, S // 2, S, 3, "4")])
    with b.scope("backbone/maxpool"):
        x = b.op("MaxPool", [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    hw //= 2
    c = S
    for li, (planes, n) in enumerate(zip(cfg["planes"], cfg["layers"]), start=1):
        for j in range(n):
            stride = 2 if (j == 0 and li > 1) else 1
            with b.scope(f"backbone/layer{li}/{j}"):
                x = bottleneck(b, x, B, c, planes, hw, K, stride)
            hw //= stride
            c = planes * EXPANSION
    with b.scope("neck/gap"):
        x = b.op("GlobalAveragePool", [x])
        x = b.op("Flatten", [x], axis=1)
    logits = b.gemm(x, c, cfg["classes"], "head/fc")
    b.output(logits, "logits", TensorProto.FLOAT, [B, cfg["classes"]])
    return b.build("RedNet tiny" if tiny else "RedNet-50 (random weights), 224x224, batch 1")
