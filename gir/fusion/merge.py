"""Merging per-operator GIR-Graphs whose parallel structures match into one GIR-Graph.

Paper section 6: after one candidate is chosen per basic operator, graphs with the same
parallel primitive concatenate in operator order; every tensor one of them writes and a later
one reads gets a device sync between the writer and the first reader. The rewrites then decide
which of those syncs can be narrowed (and the tensor lifted out of DRAM).
"""
from __future__ import annotations

from gir.ir import DEVICE, DRAM, GIRGraph, Slice, Sync
from gir.ir.gops import GOp


class MergeError(ValueError):
    pass


def rename_op(op: GOp, rename: dict[str, str]) -> GOp:
    """The same gOperator over renamed buffers."""
    slices = [op.slice] if isinstance(op, Sync) else [*op.reads(), *op.writes()]
    return op.with_slices({s: s.with_buffer(rename.get(s.buffer, s.buffer)) for s in slices})


def merge_graphs(name: str, parts: list[GIRGraph], escaping: set[str]) -> GIRGraph:
    """Concatenate `parts` (in dependence order) into one graph. DRAM tensors keep their names;
    a tensor written by one part becomes an output if it is in `escaping`, else a temp.
    Registers, shared buffers and a part's own DRAM scratch (role temp: a two-phase reduction's
    partials) are private to their part (renamed `<part>.<name>`): two softmax reductions
    each keep their own partials instead of the second overwriting what the first still reads."""
    prim, target = parts[0].prim, parts[0].target
    for p in parts[1:]:
        if p.prim != prim:
            raise MergeError(f"{name}: cannot merge {p.name} ({p.prim}) with {parts[0].name} ({prim})")
    g = GIRGraph(name, prim, target)
    stores: dict[str, list[Slice]] = {}
    synced: set[str] = set()
    for index, part in enumerate(parts):
        rename = {}
        for buf in part.buffers.values():
            if buf.level == DRAM and buf.role != "temp":
                _declare_dram(g, buf, escaping, stores)
                continue
            rename[buf.name] = f"{index}.{buf.name}"
            g.buffer(rename[buf.name], buf.level, buf.shape or buf.size, buf.dtype)
        for _, op in part.ops():
            op = rename_op(op, rename)
            if not isinstance(op, Sync):
                for s in op.reads():
                    if s.buffer in stores and s.buffer not in synced:
                        for store in stores[s.buffer]:
                            g.add(Sync(scope=DEVICE, slice=store))
                        synced.add(s.buffer)
                for s in op.writes():
                    if g.buffers[s.buffer].level == DRAM:
                        if s.buffer in synced:
                            raise MergeError(f"{name}: {s.buffer!r} is written after it was read")
                        stores.setdefault(s.buffer, []).append(s)
            g.add(op)
    return g


def _declare_dram(g: GIRGraph, buf, escaping: set[str], stores) -> None:
    existing = g.buffers.get(buf.name)
    if existing is None:
        role = buf.role
        if role == "output" and buf.name not in escaping:
            role = "temp"
        g.buffer(buf.name, DRAM, buf.shape, buf.dtype, role=role)
    elif buf.role == "output" and existing.role in ("input", "const"):
        raise MergeError(f"{g.name}: {buf.name!r} is both read from outside and written inside")
