"""SAR-DRN (Zhang et al., "Learning a Dilated Residual Network for SAR Image Despeckling", 2018).

Input ``input`` float [1, 1, 256, 256] (a speckled SAR image); output ``output`` of the same shape.
Seven dilated 3x3 convs with dilations 1, 2, 3, 4, 3, 2, 1 (64 channels, padding = dilation);
layers 2-6 are Conv -> BatchNormalization -> Relu (BN kept as BatchNormalization nodes, the way this
network is usually exported), layer 1 is Conv -> Relu and layer 7 maps back to one channel.  Two skip
connections (Add) join the outputs of layers 1 and 3 and of layers 4 and 6, and residual learning
subtracts the predicted speckle from the input.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

from ._builder import GraphBuilder

DILATIONS = [1, 2, 3, 4, 3, 2, 1]
FULL = dict(batch=1, image=256, channels=64)
TINY = dict(batch=1, image=16, channels=8)


def build(tiny: bool = False) -> onnx.ModelProto:
    cfg = TINY if tiny else FULL
    B, I, C = cfg["batch"], cfg["image"], cfg["channels"]
    b = GraphBuilder("sardrn_tiny" if tiny else "sardrn", seed=7)
    inp = b.input("input", TensorProto.FLOAT, [B, 1, I, I])
    x = inp
    skip = None
    for li, d in enumerate(DILATIONS, start=1):
        with b.scope(f"layer{li}"):
            cin = 1 if li == 1 else C
            cout = 1 if li == len(DILATIONS) else C
            x = b.conv(x, cin, cout, 3, "conv", dilation=d, bias=li in (1, len(DILATIONS)),
                       gain=0.1 if li == len(DILATIONS) else 1.0)
            if li == len(DILATIONS):
                break
            if li != 1:
                x = b.batch_norm(x, C, "bn")
            x = b.op("Relu", [x])
            if li in (1, 4):
                skip = x
            elif li in (3, 6):
                x = b.op("Add", [x, skip])
    out = b.op("Sub", [inp, x])
    b.output(out, "output", TensorProto.FLOAT, [B, 1, I, I])
    return b.build("SAR-DRN tiny" if tiny else "SAR-DRN (random weights), 1x1x256x256")
