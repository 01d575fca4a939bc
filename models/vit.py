"""ViT-B/16 at 224x224 (HF ``ViTForImageClassification`` as the torch exporter writes it, opset 17).

Input ``pixel_values`` float [B, 3, 224, 224]; output ``logits`` [B, 1000].  Patch embedding as a
16x16 stride-16 Conv, Reshape + Transpose to tokens, class token (Expand + Concat), position
embeddings, 12 pre-LN layers with LayerNormalization, attention scaled by a Mul, Erf GELU,
final LayerNorm and a Gemm head on the class token.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

from ._builder import GraphBuilder
from .bert import self_attention

FULL = dict(batch=1, image=224, patch=16, layers=12, hidden=768, heads=12, ffn=3072, classes=1000)
TINY = dict(batch=1, image=32, patch=8, layers=2, hidden=32, heads=2, ffn=64, classes=10)


def build(tiny: bool = False) -> onnx.ModelProto:
    cfg = dict(TINY if tiny else FULL)
    B, I, Pt, L, H, F = cfg["batch"], cfg["image"], cfg["patch"], cfg["layers"], cfg["hidden"], cfg["ffn"]
    g = I // Pt
    N = g * g
    S = N + 1
    cfg["seq"] = S
    b = GraphBuilder("vit_tiny" if tiny else "vit_b16", seed=3)
    px = b.input("pixel_values", TensorProto.FLOAT, [B, 3, I, I])

    with b.scope("vit/embeddings"):
        with b.scope("patch_embeddings"):
            x = b.conv(px, 3, H, Pt, "projection", stride=Pt, pad=0)
            x = b.op("Reshape", [x, b.const([B, H, N])])
            x = b.op("Transpose", [x], perm=[0, 2, 1])
        cls = b.param("cls_token", b.randn((1, 1, H)))
        cls = b.op("Expand", [cls, b.const([B, 1, H])])
        x = b.op("Concat", [cls, x], axis=1)
        pos = b.param("position_embeddings", b.randn((1, S, H)))
        x = b.op("Add", [x, pos])

    for i in range(L):
        with b.scope(f"vit/encoder/layer.{i}"):
            h = b.layer_norm(x, H, "layernorm_before", eps=1e-12)
            a = self_attention(b, h, None, cfg, "attention/attention", scale_op="Mul")
            x = b.op("Add", [a, x])
            h = b.layer_norm(x, H, "layernorm_after", eps=1e-12)
            h = b.linear(h, H, F, "intermediate/dense")
            with b.scope("intermediate/intermediate_act_fn"):
                h = b.gelu_erf(h)
            h = b.linear(h, F, H, "output/dense")
            x = b.op("Add", [h, x])

    with b.scope("vit"):
        x = b.layer_norm(x, H, "layernorm", eps=1e-12)
    with b.scope("classifier"):
        c = b.op("Gather", [x, b.const(0)], axis=1)
    logits = b.gemm(c, H, cfg["classes"], "classifier")
    b.output(logits, "logits", TensorProto.FLOAT, [B, cfg["classes"]])
    return b.build("ViT tiny" if tiny else "ViT-B/16 (random weights), 224x224, batch 1")
