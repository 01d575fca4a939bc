"""Graph queries the rewrite rules share: who writes, reads and syncs a buffer, and slice
substitution over whole gOperators."""
from __future__ import annotations

import numpy as np

from gir.ir import GIRGraph, Move, Slice, Sync
from gir.ir.gops import GOp


def slices_of(op: GOp) -> list[Slice]:
    return [op.slice] if isinstance(op, Sync) else [*op.reads(), *op.writes()]


def writers(g: GIRGraph, buffer: str) -> list[int]:
    return g.accesses(buffer)[0]


def sole_writer(g: GIRGraph, buffer: str) -> int | None:
    """The node that writes `buffer`, when exactly one does."""
    ws = writers(g, buffer)
    return ws[0] if len(ws) == 1 else None


def moves_from_sole_writers(g: GIRGraph):
    """(node, Move, writer node) for every Move whose source one gOperator writes: the loads
    read-after-write merging and relane look at."""
    for n, op in g.ops():
        if isinstance(op, Move) and (w := sole_writer(g, op.src.buffer)) is not None:
            yield n, op, w


def readers(g: GIRGraph, buffer: str) -> list[int]:
    return g.accesses(buffer)[1]


def syncs(g: GIRGraph, buffer: str) -> list[int]:
    return g.accesses(buffer)[2]


def retarget(op: GOp, old: str, new: str, shift=None) -> GOp:
    """`op` with every slice of buffer `old` moved to `new` (offsets shifted by `shift`)."""
    mapping = {}
    for s in slices_of(op):
        if s.buffer == old:
            offset = s.offset if shift is None else s.offset + shift
            mapping[s] = Slice(new, offset, s.shape, s.strides, s.limits, s.starts)
    return op.with_slices(mapping)


def is_dense(s: Slice) -> bool:
    """Elements in order at offsets 0..size-1 from the slice offset, unmasked."""
    return not s.is_masked and np.array_equal(s.pattern, np.arange(s.size))


def whole(g: GIRGraph, s: Slice) -> bool:
    """The slice is its whole register buffer, in order."""
    return is_dense(s) and s.offset.is_const and s.offset.const == 0 and g.buffers[s.buffer].size == s.size


def position(g: GIRGraph, node: int) -> float:
    return g.graph.nodes[node]["order"]


def redirect(g, node: int, old: str, new: str) -> None:
    """Remove `node` (the only writer of `old`) and let every reader and sync of `old` use `new`."""
    for n in readers(g, old) + syncs(g, old):
        g.replace(n, retarget(g.op(n), old, new))
    g.remove(node)
    del g.buffers[old]
