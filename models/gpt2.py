"""GPT-2 small, ONE decode step with a KV cache of 128 past tokens (HF ``GPT2LMHeadModel`` with
``use_cache=True`` as the torch exporter writes it at opset 17).

Inputs: ``input_ids`` int64 [B, 1] (the new token), ``attention_mask`` int64 [B, P+1] and, per
layer i, ``past_key_values.{i}.key`` / ``.value`` float [B, heads, P, d].  Outputs: ``logits``
[B, 1, vocab] and, per layer, ``present.{i}.key`` / ``.value`` [B, heads, P+1, d] (past Concat
present along the sequence axis).  Pre-LN blocks, tanh-approximation GELU (with Pow(x, 3)),
fused c_attn projection Split into q/k/v, attention MatMul -> Div -> Add(mask) -> Softmax -> MatMul,
LM head tied to the token embedding (Gemm with transB=1).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from ._builder import GraphBuilder

FULL = dict(batch=1, past=128, layers=12, hidden=768, heads=12, vocab=50257, max_pos=1024)
TINY = dict(batch=1, past=8, layers=2, hidden=32, heads=2, vocab=100, max_pos=32)


def build_gpt2(cfg: dict, name: str, doc: str) -> onnx.ModelProto:
    B, P, L, H, nh, V = cfg["batch"], cfg["past"], cfg["layers"], cfg["hidden"], cfg["heads"], cfg["vocab"]
    d = H // nh
    T = P + 1
    b = GraphBuilder(name, seed=2)
    ids = b.input("input_ids", TensorProto.INT64, [B, 1])
    mask = b.input("attention_mask", TensorProto.INT64, [B, T])
    pasts = []
    for i in range(L):
        pk = b.input(f"past_key_values.{i}.key", TensorProto.FLOAT, [B, nh, P, d])
        pv = b.input(f"past_key_values.{i}.value", TensorProto.FLOAT, [B, nh, P, d])
        pasts.append((pk, pv))

    wte = b.init("transformer.wte.weight", b.randn((V, H)))
    wpe = b.init("transformer.wpe.weight", b.randn((cfg["max_pos"], H), 0.01))
    with b.scope("transformer"):
        with b.scope("wte"):
            x = b.op("Gather", [wte, ids], axis=0)
        with b.scope("wpe"):
            pos = b.init("transformer.position_ids", np.full((1, 1), P, dtype=np.int64))
            p = b.op("Gather", [wpe, pos], axis=0)
        x = b.op("Add", [x, p])

        # additive mask [B, 1, 1, T]; the causal mask is trivial for the single new token
        with b.scope("mask"):
            m = b.op("Unsqueeze", [mask, b.const([1, 2])])
            m = b.op("Cast", [m], to=TensorProto.FLOAT)
            m = b.op("Sub", [b.fconst(1.0), m])
            m = b.op("Mul", [m, b.fconst(np.finfo(np.float32).min)])

        split_sizes = b.const([H, H, H])
        heads = b.const([B, 1, nh, d])
        for i in range(L):
            with b.scope(f"h.{i}"):
                h = b.layer_norm(x, H, "ln_1")
                with b.scope("attn"):
                    qkv = b.linear(h, H, 3 * H, "c_attn")
                    q, k, v = b.op("Split", [qkv, split_sizes], n_out=3, axis=2)
                    q = b.op("Transpose", [b.op("Reshape", [q, heads])], perm=[0, 2, 1, 3])
                    k = b.op("Transpose", [b.op("Reshape", [k, heads])], perm=[0, 2, 1, 3])
                    v = b.op("Transpose", [b.op("Reshape", [v, heads])], perm=[0, 2, 1, 3])
                    pk, pv = pasts[i]
                    k = b.op("Concat", [pk, k], axis=-2)
                    v = b.op("Concat", [pv, v], axis=-2)
                    k = b.output(k, f"present.{i}.key", TensorProto.FLOAT, [B, nh, T, d])
                    v = b.output(v, f"present.{i}.value", TensorProto.FLOAT, [B, nh, T, d])
                    kt = b.op("Transpose", [k], perm=[0, 1, 3, 2])
                    s = b.op("MatMul", [q, kt])
                    s = b.op("Div", [s, b.fconst(float(np.sqrt(d)))])
                    s = b.op("Add", [s, m])
                    a = b.op("Softmax", [s], axis=-1)
                    a = b.op("MatMul", [a, v])
                    a = b.op("Transpose", [a], perm=[0, 2, 1, 3])
                    a = b.op("Reshape", [a, b.const([B, 1, H])])
                    a = b.linear(a, H, H, "c_proj")
                x = b.op("Add", [a, x])
                h = b.layer_norm(x, H, "ln_2")
                with b.scope("mlp"):
                    h = b.linear(h, H, 4 * H, "c_fc")
                    with b.scope("act"):
                        h = b.gelu_tanh(h)
                    h = b.linear(h, 4 * H, H, "c_proj")
                x = b.op("Add", [x, h])
        x = b.layer_norm(x, H, "ln_f")

    with b.scope("lm_head"):
        x2 = b.op("Reshape", [x, b.const([B, H])])
        logits = b.op("Gemm", [x2, wte], transB=1)
        logits = b.op("Reshape", [logits, b.const([B, 1, V])])
    b.output(logits, "logits", TensorProto.FLOAT, [B, 1, V])
    b.outputs.insert(0, b.outputs.pop())  # logits first, then present.*, as HF exports
    return b.build(doc)


def build(tiny: bool = False) -> onnx.ModelProto:
    cfg = TINY if tiny else FULL
    return build_gpt2(cfg, "gpt2_tiny" if tiny else "gpt2", "GPT-2 small, one decode step, KV cache 128, batch 1")


def build_b128(tiny: bool = False) -> onnx.ModelProto:
    cfg = dict(TINY if tiny else FULL)
    cfg["batch"] = 4 if tiny else 128
    return build_gpt2(
        cfg, "gpt2_b128_tiny" if tiny else "gpt2_b128", "GPT-2 small, one decode step, KV cache 128, batch 128"
    )
