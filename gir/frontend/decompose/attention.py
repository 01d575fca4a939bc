"""Transformer ops of opset 23: RMSNormalization and Attention, decomposed into reduce,
elementwise, layout, view, concat and matmul like everything else, so the partitioner sends the
two matmuls of Attention to the library and fuses the scale/mask/softmax chain between them.

Grouped-query attention never copies K or V per query head: query heads h*g .. h*g+g-1 share
kv head h, so Q (B, Hq, S, D) is viewed as (B, Hkv, g*S, D) and multiplied with each kv head
once. Fully masked rows give zeros (the opset-23 definition), not NaN: the row maximum is
clamped to the lowest finite value and the sum to at least 1 (a row with any unmasked score
sums to >= 1, since its maximum contributes exp(0)).
"""
from __future__ import annotations

import math

import numpy as np

from gir.ir.dtypes import compute, finfo, is_half
from gir.ir.expr import Call, Const, Input, call

from .context import Builder, Node, normalize_axis
from .normalization import times_reciprocal
from .registry import register

x0, x1, x2 = Input(0), Input(1), Input(2)


# ---- RMSNormalization ---------------------------------------------------------------------------

@register("RMSNormalization")
def rms_norm(b: Builder, n: Node):
    """x / sqrt(mean(x^2 over axis..last) + eps) * scale; the statistics in fp32 for fp16 input
    (stash_type=1, the default), as the operator's function body does."""
    x, scale, out = n.inputs[0], n.inputs[1], n.outputs[0]
    rank = b.rank(x)
    axis = normalize_axis(n.attr("axis", -1), rank, n)
    axes = tuple(range(axis, rank))
    dt = b.dtype(x)
    xs = x
    if is_half(dt) and int(n.attr("stash_type", 1)) == 1:
        xs = b.elementwise(Call("cast", (x0,), "float32"), [x], step="stash", dtype="float32")
    count = math.prod(b.shape(x)[a] for a in axes)
    sq = b.elementwise(call("mul", x0, x0), [xs], step="square")
    s = b.reduce(sq, "sum", axes, True, step="sumsq")
    inv_n = b.c(1 / count if count else math.inf, xs)
    eps = b.c(float(n.attr("epsilon", 1e-5)), xs)  # mean square + eps: normal, or 0 where x is 0 too
    normed = times_reciprocal(x0, call("rsqrt", call("add", call("mul", x1, inv_n), eps)), b.dtype(s))
    if xs != x:
        normed = Call("cast", (normed,), dt)
    b.elementwise(call("mul", normed, x2), [xs, s, scale], step="normalize", out=out, dtype=dt, shape=b.shape(x))


# ---- Attention ----------------------------------------------------------------------------------

def _attention_check(n: Node):
    if n.input(6) is not None and n.input(4) is not None:
        return "nonpad_kv_seqlen cannot be combined with past_key/past_value"
    if n.output(3) is not None and n.attr("qk_matmul_output_mode", 0) not in (0, 1, 2, 3):
        return f"qk_matmul_output_mode={n.attr('qk_matmul_output_mode')} is not defined"
    if min(n.attr("left_window_size", -1), n.attr("right_window_size", -1)) < -1:
        return "left_window_size and right_window_size must be -1 or non-negative"
    if (n.input(4) is None) != (n.input(5) is None):
        return "past_key and past_value must be given together"
    return None


def _heads(b: Builder, t: str, heads: int | None, what: str) -> str:
    """(B, S, H*D) -> (B, H, S, D); 4-D inputs pass through."""
    shape = b.shape(t)
    if len(shape) == 4:
        return t
    if len(shape) != 3:
        raise b.error(f"{what} must be 3-D or 4-D, got {list(shape)}")
    if not heads or shape[2] % heads:
        raise b.error(f"3-D {what} of hidden size {shape[2]} needs q_num_heads/kv_num_heads dividing it")
    bsz, s, d = shape[0], shape[1], shape[2] // heads
    return b.layout(t, 0, (bsz, heads, s, d), (s * heads * d, d, heads * d, 1), step=f"{what}_heads")


def _transpose_last(b: Builder, t: str, step: str) -> str:
    bsz, h, r, c = b.shape(t)
    return b.layout(t, 0, (bsz, h, c, r), (h * r * c, r * c, 1, c), step=step)


def _lowest(dt: str) -> float:
    return float(finfo(dt).min)


@register("Attention", check=_attention_check)
def attention(b: Builder, n: Node):
    q_in, k_in, v_in = n.inputs[0], n.inputs[1], n.inputs[2]
    rank = b.rank(q_in)
    if not b.rank(k_in) == b.rank(v_in) == rank:
        raise b.error(f"Q, K and V ranks differ: {b.shape(q_in)}, {b.shape(k_in)}, {b.shape(v_in)}")
    q = _heads(b, q_in, n.attr("q_num_heads"), "Q")
    k = _heads(b, k_in, n.attr("kv_num_heads"), "K")
    v = _heads(b, v_in, n.attr("kv_num_heads"), "V")
    dt = b.dtype(q)
    past_k, past_v = n.input(4), n.input(5)
    past_len = 0
    if past_k is not None:
        past_len = b.shape(past_k)[2]
        k = b.emit("concat", [past_k, k], {"axis": 2}, step="present_key", out=n.output(1))
        v = b.emit("concat", [past_v, v], {"axis": 2}, step="present_value", out=n.output(2))
    else:
        for i, t in ((1, k), (2, v)):
            if n.output(i) is not None:
                b.copy(t, n.output(i), step="present")
    bsz, hq, s, d = b.shape(q)
    _, hkv, length, _ = b.shape(k)
    dv = b.shape(v)[3]
    if hq % hkv or b.shape(v)[1] != hkv or b.shape(k)[3] != d:
        raise b.error(f"heads do not group: Q {b.shape(q)}, K {b.shape(k)}, V {b.shape(v)}")
    g = hq // hkv
    scale = n.attr("scale")
    scale = 1 / math.sqrt(d) if scale is None else float(scale)

    # scores = Q K^T, grouped query heads sharing one kv head as one taller matrix
    qg = b.view(q, (bsz, hkv, g * s, d), step="q_groups") if g > 1 else q
    qk = b.emit("matmul", [qg, _transpose_last(b, k, "k_t")], {}, step="qk")
    qk = b.view(qk, (bsz, hq, s, length), step="qk_heads") if g > 1 else qk
    work = compute(dt)  # fp16/bf16 scores and softmax in fp32 (as softmax_precision=1)

    expr = Call("cast", (x0,), work) if work != dt else x0
    expr = call("mul", expr, Const(scale, work))
    softcap = float(n.attr("softcap", 0.0) or 0.0)
    if softcap > 0:
        expr = call("mul", call("tanh", call("div", expr, Const(softcap, work))), Const(softcap, work))
    mode, qk_out = int(n.attr("qk_matmul_output_mode", 0)), n.output(3)
    if qk_out is not None and mode in (0, 1):  # scaled (and soft-capped) Q K^T, as onnx's reference has it
        b.elementwise(Call("cast", (expr,), dt) if work != dt else expr, [qk], step="qk_output", dtype=dt,
                      out=qk_out)
    ins = [qk]
    mask = n.input(3)
    if mask is not None:
        mask = _padded_mask(b, mask, length)
        if b.dtype(mask) == "bool":
            expr = Call("where", (Input(len(ins)), expr, Const(-math.inf, work)))
        else:
            m = Input(len(ins))
            expr = call("add", expr, Call("cast", (m,), work) if b.dtype(mask) != work else m)
        ins.append(mask)
    allowed = _position_mask(b, n, bsz, s, length, past_len)
    if allowed is not None:
        expr = Call("where", (Input(len(ins)), expr, Const(-math.inf, work)))
        ins.append(allowed)
    shape = (bsz, hq, s, length)
    scores = b.elementwise(expr, ins, step="scores", dtype=work, shape=shape)
    if qk_out is not None and mode == 2:  # with the mask / causal bias
        b.elementwise(Call("cast", (x0,), dt) if work != dt else x0, [scores], step="qk_output", dtype=dt, out=qk_out)

    m = b.reduce(scores, "max", (3,), True, step="max")
    e = b.elementwise(call("exp", call("sub", x0, call("max", x1, Const(_lowest(work), work)))), [scores, m],
                      step="exp")
    total = b.reduce(e, "sum", (3,), True, step="sum")
    probs = times_reciprocal(x0, call("recip", call("max", x1, Const(1.0, work))), work)
    if work != dt:
        probs = Call("cast", (probs,), dt)
    p = b.elementwise(probs, [e, total], step="softmax", dtype=dt, shape=shape)
    if qk_out is not None and mode == 3:  # the softmax
        b.copy(p, qk_out, step="qk_output")

    pg = b.view(p, (bsz, hkv, g * s, length), step="p_groups") if g > 1 else p
    y = b.emit("matmul", [pg, v], {}, step="pv")
    if rank == 4:
        b.view(y, (bsz, hq, s, dv), step="y", out=n.outputs[0])
    else:  # (B, Hq, S, Dv) -> (B, S, Hq*Dv)
        b.layout(y, 0, (bsz, s, hq, dv), (hq * s * dv, dv, s * dv, 1), step="y", out=n.outputs[0],
                 out_shape=(bsz, s, hq * dv))


def _position_mask(b: Builder, n: Node, bsz: int, s: int, length: int, past_len: int) -> str | None:
    """Which keys each query may see, from is_causal, the sliding window and nonpad_kv_seqlen:
    query i sits at position i + offset, offset = the past length, or per batch
    nonpad_kv_seqlen[b] - S (the external cache of opset 24). A constant (S, L) mask unless
    nonpad_kv_seqlen is a run-time input; then a (B, 1, S, L) bool tensor computed from it."""
    causal = bool(int(n.attr("is_causal", 0)))
    left, right = int(n.attr("left_window_size", -1)), int(n.attr("right_window_size", -1))
    nonpad = n.input(6)
    if not causal and left < 0 and right < 0 and nonpad is None:
        return None
    i, j = np.arange(s)[:, None], np.arange(length)[None, :]
    rel = (j - i + s).astype(np.int64)  # key j is allowed causally iff rel <= offset + S
    if nonpad is None:
        pos = i + past_len
        ok = np.ones((s, length), bool)
        if causal:
            ok &= j <= pos
        if left >= 0:
            ok &= pos - j <= left
        if right >= 0:
            ok &= j - pos <= right
        return b.constant(ok, "bool", step="positions")
    if b.shape(nonpad) != (bsz,):
        raise b.error(f"nonpad_kv_seqlen has shape {list(b.shape(nonpad))}, expected [{bsz}]")
    nb = b.view(nonpad, (bsz, 1, 1, 1), step="nonpad")
    if b.dtype(nb) != "int64":
        nb = b.elementwise(Call("cast", (x0,), "int64"), [nb], step="nonpad64", dtype="int64")
    conds = [call("lt", Input(1), x0)]  # padding: key j < nonpad[b]
    ins = [nb, b.constant(j.astype(np.int64), "int64", step="keys")]
    if causal:  # j <= i + nonpad[b] - S
        conds.append(call("le", Input(len(ins)), x0))
        ins.append(b.constant(rel, "int64", step="causal_rel"))
    if left >= 0:  # i + nonpad[b] - S - j <= left
        conds.append(call("le", x0, Input(len(ins))))
        ins.append(b.constant(rel + left, "int64", step="left_rel"))
    if right >= 0:  # j - (i + nonpad[b] - S) <= right
        conds.append(call("le", Input(len(ins)), x0))
        ins.append(b.constant(rel - right, "int64", step="right_rel"))
    expr = conds[0]
    for c in conds[1:]:
        expr = call("and", expr, c)
    return b.elementwise(expr, ins, step="positions", dtype="bool", shape=(bsz, 1, s, length))


def _padded_mask(b: Builder, mask: str, length: int) -> str:
    """A mask shorter than the kv length is padded with False / -inf (opset 23)."""
    shape = b.shape(mask)
    short = length - shape[-1]
    if short <= 0:
        return mask
    value = False if b.dtype(mask) == "bool" else -math.inf
    pads = tuple((0, 0) for _ in shape[:-1]) + ((0, short),)
    return b.emit("pad", [mask], {"pads": pads, "mode": "constant", "value": value}, step="mask_pad")
