"""BERT-base (uncased) encoder, sequence 128, batch 1, as the HF/torch exporter writes it at opset 17.

Inputs ``input_ids``, ``attention_mask``, ``token_type_ids`` (int64 [B, S]); outputs
``last_hidden_state`` [B, S, H] and ``pooler_output`` [B, H].  Post-LN layers with
LayerNormalization ops, Erf GELU, attention as MatMul -> Div(sqrt(d)) -> Add(mask) -> Softmax
-> MatMul with Reshape/Transpose around it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from ._builder import GraphBuilder

FULL = dict(batch=1, seq=128, layers=12, hidden=768, heads=12, ffn=3072, vocab=30522, max_pos=512, type_vocab=2)
TINY = dict(batch=1, seq=8, layers=2, hidden=32, heads=2, ffn=64, vocab=100, max_pos=16, type_vocab=2)


def attention_mask(b: GraphBuilder, mask: str) -> str:
    """int64 [B, S] 0/1 mask -> additive float mask [B, 1, 1, S] (HF ``get_extended_attention_mask``)."""
    u = b.op("Unsqueeze", [mask, b.const([1, 2])])
    c = b.op("Cast", [u], to=TensorProto.FLOAT)
    s = b.op("Sub", [b.fconst(1.0), c])
    return b.op("Mul", [s, b.fconst(np.finfo(np.float32).min)])


def self_attention(b: GraphBuilder, x: str, mask: str | None, cfg: dict, name: str, scale_op: str = "Div") -> str:
    """Multi-head self attention (Q, K, V projections, scores, softmax, context, output projection)."""
    B, S, H, nh = cfg["batch"], cfg["seq"], cfg["hidden"], cfg["heads"]
    d = H // nh
    with b.scope(name):
        q = b.linear(x, H, H, "query")
        k = b.linear(x, H, H, "key")
        v = b.linear(x, H, H, "value")
        heads = b.const([B, S, nh, d])
        with b.scope("q"):
            q = b.op("Transpose", [b.op("Reshape", [q, heads])], perm=[0, 2, 1, 3])
        with b.scope("k"):
            k = b.op("Transpose", [b.op("Reshape", [k, heads])], perm=[0, 2, 3, 1])
        with b.scope("v"):
            v = b.op("Transpose", [b.op("Reshape", [v, heads])], perm=[0, 2, 1, 3])
        s = b.op("MatMul", [q, k])
        if scale_op == "Div":
            s = b.op("Div", [s, b.fconst(float(np.sqrt(d)))])
        else:
            s = b.op("Mul", [s, b.fconst(float(1.0 / np.sqrt(d)))])
        if mask is not None:
            s = b.op("Add", [s, mask])
        p = b.op("Softmax", [s], axis=-1)
        ctx = b.op("MatMul", [p, v])
        ctx = b.op("Transpose", [ctx], perm=[0, 2, 1, 3])
        ctx = b.op("Reshape", [ctx, b.const([B, S, H])])
        return b.linear(ctx, H, H, "output/dense")


def build(tiny: bool = False, layers: int | None = None) -> onnx.ModelProto:
    """`layers` overrides the layer count (the rewrite benchmark uses one full-size layer)."""
    cfg = dict(TINY if tiny else FULL)
    if layers is not None:
        cfg["layers"] = layers
    B, S, H, L, F = cfg["batch"], cfg["seq"], cfg["hidden"], cfg["layers"], cfg["ffn"]
    b = GraphBuilder("bert_tiny" if tiny else "bert_base", seed=1)
    ids = b.input("input_ids", TensorProto.INT64, [B, S])
    mask = b.input("attention_mask", TensorProto.INT64, [B, S])
    tt = b.input("token_type_ids", TensorProto.INT64, [B, S])

    with b.scope("embeddings"):
        we = b.init("embeddings.word_embeddings.weight", b.randn((cfg["vocab"], H)))
        pe = b.init("embeddings.position_embeddings.weight", b.randn((cfg["max_pos"], H)))
        te = b.init("embeddings.token_type_embeddings.weight", b.randn((cfg["type_vocab"], H)))
        with b.scope("word_embeddings"):
            x = b.op("Gather", [we, ids], axis=0)
        with b.scope("token_type_embeddings"):
            t = b.op("Gather", [te, tt], axis=0)
        x = b.op("Add", [x, t])
        with b.scope("position_embeddings"):
            pos = b.init("embeddings.position_ids", np.arange(S, dtype=np.int64)[None, :])
            p = b.op("Gather", [pe, pos], axis=0)
        x = b.op("Add", [x, p])
        x = b.layer_norm(x, H, "LayerNorm", eps=1e-12)

    ext_mask = attention_mask(b, mask)

    for i in range(L):
        with b.scope(f"encoder/layer.{i}"):
            a = self_attention(b, x, ext_mask, cfg, "attention/self")
            with b.scope("attention/output"):
                x = b.layer_norm(b.op("Add", [a, x]), H, "LayerNorm", eps=1e-12)
            h = b.linear(x, H, F, "intermediate/dense")
            with b.scope("intermediate/intermediate_act_fn"):
                h = b.gelu_erf(h)
            with b.scope("output"):
                h = b.linear(h, F, H, "dense")
                x = b.layer_norm(b.op("Add", [h, x]), H, "LayerNorm", eps=1e-12)

    last = b.output(x, "last_hidden_state", TensorProto.FLOAT, [B, S, H])
    with b.scope("pooler"):
        first = b.op("Gather", [last, b.const(0)], axis=1)
        pooled = b.op("Tanh", [b.gemm(first, H, H, "dense")])
    b.output(pooled, "pooler_output", TensorProto.FLOAT, [B, H])
    return b.build("BERT-base encoder (random weights), batch 1, sequence 128" if not tiny else "BERT tiny")
