"""Static traffic counts of a GIR-Graph (no execution): what the rewrites must not increase and
what reports compare against the compulsory bound."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .affine import ParallelPrimitive
from .dtypes import itemsize
from .gops import Gather, Sync
from .graph import GIRGraph
from .slices import Slice
from .target import DRAM


def accesses(graph: GIRGraph, level: str):
    """(op, "read" or "write", slice, buffer) for every slice at `level`, in program order."""
    for _, op in graph.ops():
        if isinstance(op, Sync):
            continue
        for key, slices in (("read", op.reads()), ("write", op.writes())):
            for s in slices:
                buf = graph.buffers[s.buffer]
                if buf.level == level:
                    yield op, key, s, buf


def level_bytes(graph: GIRGraph, level: str = DRAM) -> dict[str, int]:
    """Bytes read and written at `level`, summed over units (every access counts)."""
    totals = {"read": 0, "write": 0}
    for _, key, s, buf in accesses(graph, level):
        totals[key] += valid_count(s, graph.prim) * itemsize(buf.dtype)
    return totals


def valid_count(s: Slice, prim: ParallelPrimitive) -> int:
    """Valid elements of `s` over all units of `prim`."""
    return s.size * prim.num_units if not s.is_masked else _masked_valid_count(s, prim)


@lru_cache(maxsize=16384)
def _masked_valid_count(s: Slice, prim: ParallelPrimitive) -> int:
    """Cached: the rewrite driver counts the traffic of every trial, mostly unchanged slices."""
    return s.valid_count(prim.env())


def dram_footprint(graph: GIRGraph) -> dict[str, int]:
    """Distinct DRAM bytes read and written: the traffic of a kernel whose repeated reads of
    one element (a broadcast bias, say) hit in cache."""
    out = {"read": 0, "write": 0}
    for (key, _), n in dram_footprint_by_buffer(graph).items():
        out[key] += n
    return out


def dram_footprint_by_buffer(graph: GIRGraph) -> dict[tuple[str, str], int]:
    """`dram_footprint` per ("read" or "write", buffer): what a report attributes to each
    tensor. A Gather's data-dependent reads count once per gathered element (no data here to
    tell repeated indices apart)."""
    env = graph.prim.env()
    touched: dict[tuple[str, str], np.ndarray] = {}
    out: dict[tuple[str, str], int] = {}
    for op, key, s, buf in accesses(graph, DRAM):
        if isinstance(op, Gather) and s is op.src:
            out[key, s.buffer] = out.get((key, s.buffer), 0) + op.dst.valid_count(env) * itemsize(buf.dtype)
            continue
        bitmap = touched.setdefault((key, s.buffer), np.zeros(buf.size, bool))
        bitmap[s.addresses(env)[s.valid(env)] if s.is_masked else s.addresses(env)] = True
    for (key, name), bitmap in touched.items():
        out[key, name] = out.get((key, name), 0) + int(np.count_nonzero(bitmap)) * itemsize(graph.buffers[name].dtype)
    return out


def compulsory_bytes(graph: GIRGraph) -> int:
    """Each external input and constant read once, each output written once."""
    return sum(b.nbytes for b in graph.buffers.values() if b.level == DRAM and b.role in ("input", "const", "output"))
