"""gOperator swapping: an Elementwise moves forward (never backward, so the greedy loop ends).

- past a Reduce it commutes with: sum(c * x) = c * sum(x); max/min(f(x)) = f(max/min(x)) for
  a non-decreasing f. The Elementwise then runs once per output instead of once per input;
- past a Broadcast of its result: the Broadcast moves its inputs instead, and the Elementwise
  lands next to the Elementwise that reads the broadcast, where merging fuses the two;
- past a register-to-register Move of its result (a relayout): the Move carries the inputs;
- past a Sync of its result: the Sync covers the inputs instead and the Elementwise runs on
  every lane (uniform), so readers in other lanes still find their value. The driver keeps it
  only where registers allow.
"""
from __future__ import annotations

from gir.ir import REGISTER, Broadcast, Elementwise, Move, Reduce, Slice, Sync
from gir.ir.expr import Call, Const, Input

from .query import readers, retarget, syncs, writers

MONOTONE = {"exp", "sigmoid", "tanh", "relu", "erf", "log", "sqrt"}


def _scales(expr) -> bool:
    """x * c, c * x or x / c with a constant c: commutes with sum."""
    if isinstance(expr, Call) and expr.op in ("mul", "div") and len(expr.args) == 2:
        a, b = expr.args
        if expr.op == "mul" and isinstance(a, Const):
            a, b = b, a
        return a == Input(0) and isinstance(b, Const)
    return False


def _non_decreasing(expr) -> bool:
    """Walked as a loop (each step has one non-constant operand): chains may be thousands deep."""
    while expr != Input(0):
        if not isinstance(expr, Call):
            return False
        a = expr.args
        if expr.op in MONOTONE:
            expr = a[0]
        elif expr.op in ("add", "sub") and isinstance(a[1], Const):
            expr = a[0]
        elif expr.op == "add" and isinstance(a[0], Const):
            expr = a[1]
        elif expr.op in ("mul", "div") and isinstance(a[1], Const) and a[1].value > 0:
            expr = a[0]
        elif expr.op == "mul" and isinstance(a[0], Const) and a[0].value > 0:
            expr = a[1]
        else:
            return False
    return True


def find(g) -> list[int]:
    return [n for n, op in g.ops() if isinstance(op, Elementwise)]


def apply(g, node: int) -> str | None:
    e = g.op(node)
    out = e.out.buffer
    rs = readers(g, out)
    if len(rs) != 1 or writers(g, out) != [node] or g.buffers[out].role != "temp":
        return None
    nxt = g.op(rs[0])
    after = [n for n in g.graph.successors(node) if isinstance(g.op(n), Sync) and g.op(n).slice.buffer == out]
    if after and (done := _past_sync(g, node, e, after[0], g.op(after[0]))):
        return done
    if isinstance(nxt, Reduce):
        return _past_reduce(g, node, e, rs[0], nxt)
    if isinstance(nxt, Broadcast):
        return _past_broadcast(g, node, e, rs[0], nxt)
    if isinstance(nxt, Move) and g.buffers[nxt.dst.buffer].level == REGISTER and nxt.fill is None:
        return _past_move(g, node, e, rs[0], nxt)
    return None


def _past_reduce(g, node, e: Elementwise, rnode: int, r: Reduce) -> str | None:
    if len(e.inputs) != 1 or not r.src.same_pattern(e.out) or e.inputs[0].size != e.out.size:
        return None
    x = e.inputs[0]
    if g.buffers[x.buffer].dtype != g.buffers[e.out.buffer].dtype:
        return None
    ok = _scales(e.expr) if r.op == "sum" else _non_decreasing(e.expr) if r.op in ("max", "min") else False
    if not ok:
        return None
    reduced = f"{r.dst.buffer}.pre"
    g.buffer(reduced, REGISTER, g.buffers[r.dst.buffer].size, g.buffers[r.dst.buffer].dtype)
    pre = Slice(reduced, r.dst.offset, r.dst.shape, r.dst.strides)
    for s in syncs(g, e.out.buffer):
        g.replace(s, retarget(g.op(s), e.out.buffer, x.buffer))
    g.replace(rnode, Reduce(op=r.op, src=x, dst=pre, vec=r.vec, uniform=r.uniform))
    g.insert_after(rnode, Elementwise(expr=e.expr, inputs=(pre,), out=r.dst, compute_dtype=e.compute_dtype,
                                      vec=r.vec, uniform=r.uniform))
    g.remove(node)
    del g.buffers[e.out.buffer]
    return f"#{node} {e.expr} moved after Reduce({r.op}) #{rnode}"


def _inputs_like_output(g, e: Elementwise) -> bool:
    """Every input is a register slice read element for element like the output is written."""
    return all(g.buffers[s.buffer].level == REGISTER and s.size == e.out.size for s in e.inputs)


def _carry_inputs(g, node: int, e: Elementwise, anchor: int, out: Slice, carry) -> None:
    """The data movement at `anchor` (writing `out`) carries each input of Elementwise `node`
    into a new register buffer (`carry(input, new slice)` builds it); the Elementwise then
    replaces the anchor, computing `out` from the carried inputs."""
    anchor_op = g.op(anchor)
    carried = []
    for i, s in enumerate(e.inputs):
        name = f"{out.buffer}.in{i}"
        g.buffer(name, REGISTER, g.buffers[out.buffer].size, g.buffers[s.buffer].dtype)
        dst = Slice(name, out.offset, out.shape, out.strides, out.limits, out.starts)
        g.insert_before(anchor, carry(s, dst))
        carried.append(dst)
    g.replace(anchor, Elementwise(expr=e.expr, inputs=tuple(carried), out=out, compute_dtype=e.compute_dtype,
                                  vec=anchor_op.vec, uniform=anchor_op.uniform))
    g.remove(node)
    del g.buffers[e.out.buffer]


def _past_move(g, node, e: Elementwise, mnode: int, m: Move) -> str | None:
    if not m.src.same_pattern(e.out) or not _inputs_like_output(g, e) or m.src.is_masked:
        return None
    _carry_inputs(g, node, e, mnode, m.dst, lambda s, dst: Move(
        src=Slice(s.buffer, s.offset, m.src.shape, m.src.strides), dst=dst, vec=m.vec, uniform=m.uniform))
    return f"#{node} {e.expr} moved after Move #{mnode}"


SMALL = 4  # elements a replicated (uniform) Elementwise may compute on every lane


def _past_sync(g, node, e: Elementwise, snode: int, sync: Sync) -> str | None:
    """Only for a handful of values (per-row scalars): replicating more costs a lane's time."""
    if e.uniform or e.out.size > SMALL or not _inputs_like_output(g, e):
        return None
    for s in e.inputs:
        g.insert_before(snode, Sync(scope=sync.scope, slice=s))
    g.remove(node)
    g.replace(snode, Elementwise(expr=e.expr, inputs=e.inputs, out=e.out, compute_dtype=e.compute_dtype, uniform=True))
    return f"#{node} {e.expr} moved after Sync #{snode}, now computed by every lane"


def _past_broadcast(g, node, e: Elementwise, bnode: int, b: Broadcast) -> str | None:
    if not b.src.same_pattern(e.out) or not all(s.size == e.out.size for s in e.inputs):
        return None
    if not any(isinstance(g.op(n), Elementwise) for n in readers(g, b.dst.buffer)):
        return None  # only worth it when a merge with the reader follows
    if syncs(g, e.out.buffer):
        return None
    _carry_inputs(g, node, e, bnode, b.dst, lambda s, dst: Broadcast(src=s, dst=dst, mode=b.mode, vec=b.vec,
                                                                      uniform=b.uniform))
    return f"#{node} {e.expr} moved after Broadcast #{bnode}"
