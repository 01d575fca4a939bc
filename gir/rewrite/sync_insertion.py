"""Sync insertion: narrow a device sync to the scope the data really needs and lift the
tensor to the fastest memory level that carries that scope.

For a DRAM temporary guarded by a device sync, the scope over every (writer, reader) pair is
computed by enumeration. Lane or unit scope lifts it into registers (per unit), block scope
into shared memory (per block); device scope leaves it in DRAM. Lifting rebases every slice
of the tensor by the part of its offset that names the block (shared) or the unit (registers),
which must be the same function for every slice — otherwise the data would land in another
block's or unit's copy, and the rule does not apply.
"""
from __future__ import annotations

from gir.ir import BLOCK, DEVICE, DRAM, LANE, REGISTER, Gather, Slice, Sync, required_scope
from gir.ir.affine import Affine
from gir.ir.target import SCOPE_NAMES

from .query import readers, slices_of, syncs, writers


def find(g) -> list[str]:
    return [name for name, b in g.buffers.items()
            if b.level == DRAM and b.role == "temp" and syncs(g, name)]


def apply(g, name: str) -> str | None:
    ws, rs = writers(g, name), readers(g, name)
    if not ws or not rs:
        return None
    scope = LANE
    for w in ws:
        for r in rs:
            scope = max(scope, required_scope(g, w, r))
            if scope >= DEVICE:  # nothing narrower can come of the other pairs (each is an enumeration)
                return None
    if g.target.lanes_per_unit > 1 and any(isinstance(g.op(r), Gather) and g.op(r).src.buffer == name for r in rs):
        scope = max(scope, BLOCK)  # a data-dependent read cannot index registers spread over lanes: shared memory
    level = g.target.level_for_scope(scope)
    if level == DRAM:  # no faster level carries this scope (block scope on cpu): nothing to lift, and
        return None    # "lifting" DRAM into DRAM again would repeat forever (a Gather's source on cpu)
    owner = g.prim.block_variables() | ({"w"} if level == REGISTER else set())
    nodes = ws + rs + syncs(g, name)
    offsets = [g.prim.normalize(s.offset) for n in nodes for s in slices_of(g.op(n)) if s.buffer == name]
    bases = {o.split(owner)[0] for o in offsets}
    if len(bases) != 1:
        return None
    base = bases.pop()
    lo, hi = _extent(g, name, nodes, base)
    new = f"{name}@{level}"
    old = g.buffers.pop(name)
    g.buffer(new, level, hi - lo + 1, old.dtype)
    shift = Affine(-lo) - base
    for n in nodes:
        op = g.op(n)
        if isinstance(op, Sync):
            moved = _move_slice(g, op.slice, new, shift)
            if scope == LANE:
                g.remove(n)
            else:
                g.replace(n, Sync(scope=scope, slice=moved))
            continue
        g.replace(n, op.with_slices({s: _move_slice(g, s, new, shift) for s in slices_of(op) if s.buffer == name}))
    return f"{name}: device sync -> {SCOPE_NAMES[scope]} scope, lifted to {level} ({hi - lo + 1} elements)"


def _move_slice(g, s: Slice, buffer: str, shift: Affine) -> Slice:
    return Slice(buffer, g.prim.normalize(s.offset) + shift, s.shape, s.strides, s.limits, s.starts)


def _extent(g, name, nodes, base) -> tuple[int, int]:
    """Lowest and highest rebased address any unit touches (from each unit's box of valid
    indices, without listing the elements)."""
    env = g.prim.env()
    ranges = [_move_slice(g, s, name, -base).address_range(env)
              for n in nodes for s in slices_of(g.op(n)) if s.buffer == name]
    ranges = [r for r in ranges if r is not None]
    if not ranges:
        return 0, 0
    return min(lo for lo, _ in ranges), max(hi for _, hi in ranges)
