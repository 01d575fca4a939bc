"""Where a GIR-Graph's kernels begin and end: one kernel per stretch of program order between
device syncs. Shared by kernel formation (gir/backends/kernels.py) and the time model, which
applies the CPU's one-thread rule per kernel as the emitter does."""
from __future__ import annotations

from .gops import Sync
from .graph import GIRGraph
from .target import DEVICE, DRAM


def touched(op) -> list:
    """The slices a gOperator reads or writes (a Sync: the slice it orders)."""
    return [op.slice] if isinstance(op, Sync) else [*op.reads(), *op.writes()]


def kernel_stretches(graph: GIRGraph) -> list[list[tuple]]:
    """(graph node, gOperator) per kernel, in launch order, device syncs left out; empty
    stretches (two device syncs in a row, or only syncs) make no kernel."""
    stretches: list[list[tuple]] = [[]]
    for node, op in graph.ops():
        if isinstance(op, Sync) and op.scope == DEVICE:
            stretches.append([])
        else:
            stretches[-1].append((node, op))
    return [s for s in stretches if any(not isinstance(op, Sync) for _, op in s)]


def kernel_dram_buffers(graph: GIRGraph, stretch: list[tuple]) -> list:
    """The DRAM buffers a kernel's gOperators touch (its parameters), in declaration order."""
    names = {s.buffer for _, op in stretch for s in touched(op)}
    return [b for b in graph.buffers.values() if b.name in names and b.level == DRAM]
