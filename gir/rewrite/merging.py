"""gOperator merging.

- read-after-write: a load from a tensor that one Move wrote reads the Move's source instead
  (the two patterns compose by an offset shift); when the load then only copies a whole
  register buffer in the same lane order, it disappears and its readers use the source. Where
  other units read the intermediate, the source must be one they can all read, unless each
  unit reads back exactly the elements it wrote (a softmax's exponentials, per row block).
- read-after-read: two identical loads with no write of their source in between become one.
- elementwise: an Elementwise whose only reader is another Elementwise of the same shape is
  substituted into it (one expression, one register buffer fewer).
- dead gOperators (results nobody reads, syncs nobody needs) are removed.
"""
from __future__ import annotations

import numpy as np

from gir.ir import DRAM, LANE, REGISTER, SHARED, Elementwise, Move, Slice, Sync, required_scope
from gir.ir.expr import MAX_OPS, Call, Input, count_ops, substitute

from .query import moves_from_sole_writers, position, readers, redirect, slices_of, sole_writer, syncs, whole, writers


# -- read after write -------------------------------------------------------------------------
def find_raw(g) -> list[int]:
    """Loads of what one Move stored, except a DRAM value's on-chip copy: reading DRAM again
    instead always adds DRAM bytes (the store's own load stays), which the driver refuses, so
    trying it only costs a trial per copied piece (a Concat of 500 inputs: 500 per pass)."""
    return [n for n, op, w in moves_from_sole_writers(g) if isinstance(g.op(w), Move) and position(g, w) < position(g, n)
            and not (g.buffers[g.op(w).src.buffer].level == DRAM and g.buffers[op.src.buffer].level != DRAM)]


def apply_raw(g, reader: int) -> str | None:
    r = g.op(reader)
    w_node = writers(g, r.src.buffer)[0]
    w = g.op(w_node)
    src_buf, mid_buf = g.buffers[w.src.buffer], g.buffers[r.src.buffer]
    if w.src.buffer == r.src.buffer or src_buf.dtype != mid_buf.dtype:
        return None
    if w.fill is not None and w.src.is_masked:
        return None  # the fill values exist only in the intermediate
    if not np.array_equal(w.src.pattern, w.dst.pattern):
        return None
    prim = g.prim
    shift = prim.normalize(w.src.offset) - prim.normalize(w.dst.offset)
    own = r.src.same_pattern(w.dst)  # each unit reads back exactly what it wrote itself
    if mid_buf.level != REGISTER and not shift.is_const and not own:
        return None  # other units read the intermediate: the shift must not depend on the unit
    if not own and not _reachable(src_buf.level, src_buf.role, mid_buf.level):
        return None
    if not _covered(g, w, r) or len(writers(g, w.src.buffer)) > 1:
        return None
    composed = Slice(w.src.buffer, prim.normalize(r.src.offset) + shift, r.src.shape, r.src.strides, r.src.limits, r.src.starts)
    g.replace(reader, Move(src=composed, dst=r.dst, fill=r.fill, vec=r.vec, uniform=r.uniform))
    source_writers = writers(g, w.src.buffer)
    if src_buf.level == REGISTER and source_writers and required_scope(g, source_writers[0], reader) > LANE:
        return None  # would read another lane's register without a shuffle
    return f"#{reader} reads {w.src.buffer} instead of {r.src.buffer} (store #{w_node} then load)"


def _reachable(src_level: str, src_role: str, mid_level: str) -> bool:
    """Can every unit that read the intermediate read the source directly?"""
    if src_level == REGISTER:
        return mid_level == REGISTER
    if src_level == SHARED:
        return mid_level in (REGISTER, SHARED)
    return src_role in ("input", "const") or mid_level != DRAM


def _covered(g, w: Move, r: Move) -> bool:
    """Every element the reader takes was written by this writer for the same unit's view."""
    if r.src.same_pattern(w.dst):
        return True
    if g.buffers[r.src.buffer].level == REGISTER and not (w.dst.is_masked or r.src.is_masked) \
            and w.dst.offset.is_const and r.src.offset.is_const:
        written = w.dst.offset.const + w.dst.pattern
        return bool(np.isin(r.src.offset.const + r.src.pattern, written).all())  # one unit stands for all
    env = g.prim.env()
    buf = g.buffers[r.src.buffer]
    key = _keys(g, buf.level, env)
    wa, wv = w.dst.addresses(env), w.dst.valid(env)
    ra, rv = r.src.addresses(env), r.src.valid(env)
    written = np.unique((key[:, None] * buf.size + wa)[wv])
    wanted = (key[:, None] * buf.size + ra)[rv]
    return bool(np.isin(wanted, written).all())


def _keys(g, level, env):
    if level == REGISTER:
        return env["u"]
    if level == SHARED:
        return env["b"]
    return np.zeros_like(env["u"])


def find_copies(g) -> list[int]:
    return [n for n, op in g.ops() if isinstance(op, Move) and g.buffers[op.src.buffer].level == REGISTER
            and g.buffers[op.dst.buffer].level == REGISTER and op.fill is None]


def apply_copy(g, node: int) -> str | None:
    """A Move of a whole register buffer into another of the same shape and lanes: drop it."""
    m = g.op(node)
    src, dst = g.buffers[m.src.buffer], g.buffers[m.dst.buffer]
    if not (whole(g, m.src) and whole(g, m.dst)) or src.dtype != dst.dtype or src.size != dst.size:
        return None
    if writers(g, m.dst.buffer) != [node] or len(writers(g, m.src.buffer)) != 1 or dst.role != "temp":
        return None
    producer = g.op(writers(g, m.src.buffer)[0])
    if (producer.vec, producer.uniform) != (m.vec, m.uniform) and not producer.uniform:
        return None
    redirect(g, node, m.dst.buffer, m.src.buffer)
    return f"#{node} copy {m.src.buffer} -> {m.dst.buffer} removed; readers use {m.src.buffer}"


# -- read after read --------------------------------------------------------------------------
def find_rar(g) -> list[tuple[int, int]]:
    loads: dict = {}
    out = []
    for n, op in g.ops():
        if isinstance(op, Move) and g.buffers[op.dst.buffer].level == REGISTER:
            key = (op.src, op.fill, op.vec, op.uniform, g.buffers[op.dst.buffer].dtype, op.dst.size)
            if key in loads:
                out.append((loads[key], n))
            else:
                loads[key] = n
    return out


def apply_rar(g, pair: tuple[int, int]) -> str | None:
    first, second = pair
    a, b = g.op(first), g.op(second)
    if not (whole(g, a.dst) and whole(g, b.dst)) or writers(g, b.dst.buffer) != [second]:
        return None
    between = [n for n in writers(g, a.src.buffer) if position(g, first) < position(g, n) < position(g, second)]
    if between or writers(g, a.dst.buffer) != [first]:
        return None
    redirect(g, second, b.dst.buffer, a.dst.buffer)
    return f"#{second} loads {b.src} again: uses #{first}'s {a.dst.buffer}"


# -- elementwise ------------------------------------------------------------------------------
def find_elementwise(g) -> list[int]:
    return [n for n, op in g.ops() if isinstance(op, Elementwise)]


def apply_elementwise(g, node: int) -> str | None:
    """Substitute Elementwise `node` into its only reader, another Elementwise."""
    e1 = g.op(node)
    out = e1.out.buffer
    rs = readers(g, out)
    if len(rs) != 1 or writers(g, out) != [node] or g.buffers[out].role != "temp" or syncs(g, out):
        return None
    e2 = g.op(rs[0])
    if not isinstance(e2, Elementwise) or (e1.vec, e1.uniform) != (e2.vec, e2.uniform) or e1.out.size != e2.out.size:
        return None
    if not all(s.same_pattern(e1.out) for s in e2.inputs if s.buffer == out):
        return None
    inputs: list = []
    remap = {}
    for i, s in enumerate(e2.inputs):
        if s.buffer != out:
            remap[i] = _index_of(inputs, s)
    base = {j: _index_of(inputs, s) for j, s in enumerate(e1.inputs)}
    inner = substitute(e1.expr, {j: Input(k) for j, k in base.items()})
    if g.buffers[out].dtype != e1.compute_dtype:
        inner = Call("cast", (inner,), g.buffers[out].dtype)
    expr = substitute(e2.expr, {i: (inner if s.buffer == out else Input(remap[i])) for i, s in enumerate(e2.inputs)})
    if count_ops(expr) > MAX_OPS:
        return None  # kept apart: a compiler's time grows faster than a basic block's length
    g.replace(rs[0], Elementwise(expr=expr, inputs=tuple(inputs), out=e2.out, compute_dtype=e2.compute_dtype,
                                 vec=e2.vec, uniform=e2.uniform))
    g.remove(node)
    del g.buffers[out]
    return f"#{node} substituted into #{rs[0]}"


def _index_of(items: list, s) -> int:
    if s not in items:
        items.append(s)
    return items.index(s)


# -- dead code --------------------------------------------------------------------------------
def find_dead(g) -> list[int]:
    """Results nobody reads, and every Sync: the driver keeps a Sync's removal only when every
    read stays covered (a sync on a replicated value, or one a later sync subsumes)."""
    out = []
    for n, op in g.ops():
        if isinstance(op, Sync):
            out.append(n)
        elif all(g.buffers[s.buffer].role == "temp" and not readers(g, s.buffer) for s in op.writes()):
            out.append(n)
    return out


def apply_dead(g, node: int) -> str | None:
    op = g.op(node)
    g.remove(node)
    used = {s.buffer for _, o in g.ops() for s in slices_of(o)}
    for name in [b for b in g.buffers if b not in used and g.buffers[b].role == "temp"]:
        del g.buffers[name]
    reason = "no read needs it" if isinstance(op, Sync) else "nothing reads its result"
    return f"#{node} {op.kind} removed: {reason}"
