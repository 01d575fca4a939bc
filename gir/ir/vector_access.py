"""Which DRAM accesses can be one 8- or 16-byte access per lane instead of several scalar ones:
the emitters issue vector loads and stores where this says so, and the planner prefers, between
structures of equal modelled time, the one whose DRAM bytes move wider.

A Move between DRAM and registers qualifies when each lane's `vec` consecutive elements (lane
ownership: element k belongs to lane (k // vec) % lanes) sit at consecutive DRAM addresses and
the first is a multiple of `vec` for every unit: every coefficient of the slice's affine offset
and its constant are multiples of `vec` (DRAM buffers start 256-byte aligned: arena offsets and
allocations), and the slice's mask, if any, holds for all of a lane's `vec` elements or for none
(`run_uniform_mask`: per unit, or a ragged edge that falls on a multiple of `vec`; any other
ragged edge keeps the scalar path). The register side (consecutive slots of one lane) is the
emitter's to check."""
from __future__ import annotations

from math import prod

import numpy as np

from .dtypes import itemsize
from .gops import Move
from .target import DRAM, REGISTER

# vec -> the widths a dtype is accessed at: 4-byte elements in 8 and 16 bytes (vec 2, 4), fp16
# and bf16 in 8 and 16 bytes too (vec 4, 8: eight halves per 128-bit access where fp32 gets four)
WIDE_DTYPES = {"float32": (2, 4), "int32": (2, 4), "float16": (4, 8), "bfloat16": (4, 8)}


def unit_uniform_mask(s) -> bool:
    """Whether a slice's mask, if any, holds for all of a unit's elements or for none: every
    bounded dimension has extent 1, so the bounds depend on the unit's coordinates alone (a
    ragged last block of whole rows, GPT-2's lm_head: 50,257 rows over 4-unit blocks). The
    emitters then guard the unit's vector accesses with the condition once."""
    bounded = {d for bounds in (s.limits, s.starts) for d, b in enumerate(bounds) if b is not None}
    return all(s.shape[d] == 1 for d in bounded)


def run_uniform_mask(s, vec: int) -> bool:
    """Whether a slice's mask, if any, holds for all of each aligned run of `vec` consecutive
    elements (element k .. k+vec-1, k a multiple of vec) or for none, for every unit. A bounded
    dimension qualifies when a run stays at one index of it (the elements inside it are a
    multiple of vec: a row of 2 x 64 halves masked by rows), or when it is the innermost
    dimension, its extent a multiple of vec and its bound a multiple of vec for every unit (a
    LayerNorm row of 768 split over four units of 256: the fourth unit's lanes all out, each
    lane's eight elements in or out together). The emitter then guards each lane's access with
    the mask at the run's first element."""
    for bounds in (s.limits, s.starts):
        for d, b in enumerate(bounds):
            if b is None or s.shape[d] == 1:
                continue
            inner = prod(s.shape[d + 1:])
            if inner % vec == 0:
                continue
            if inner != 1 or s.shape[d] % vec or b.const % vec or any(c % vec for _, c in b.terms):
                return False
    return True


def vector_width(op, buffers: dict) -> int:
    """Elements per access when `op`'s DRAM side can be accessed several at a time, else 1:
    the op's `vec` (each lane's consecutive elements), or the dtype's widest access within it
    (fp32 placed eight to a lane, for the halves of its group: two 16-byte accesses).
    `buffers`: buffer name -> Buffer (a graph's or a kernel's)."""
    vec = getattr(op, "vec", 1)
    if not isinstance(op, Move) or op.uniform or vec not in (2, 4, 8):  # a fill: where a unit's mask fails
        return 1
    src_dram, dst_dram = buffers[op.src.buffer].level == DRAM, buffers[op.dst.buffer].level == DRAM
    if src_dram == dst_dram:
        return 1
    dram, reg = (op.src, op.dst) if src_dram else (op.dst, op.src)
    n = op.dst.size
    dtype = buffers[dram.buffer].dtype
    width = max((w for w in WIDE_DTYPES.get(dtype, ()) if w <= vec), default=1)
    if (width == 1 or buffers[reg.buffer].level != REGISTER or buffers[reg.buffer].dtype != dtype
            or not run_uniform_mask(dram, vec) or reg.is_masked or n % vec or dram.offset.const % vec
            or any(c % vec for _, c in dram.offset.terms)):
        return 1
    pattern = dram.pattern
    first = np.arange(0, n, vec)
    runs = pattern[first[:, None] + np.arange(vec)]
    if (runs != runs[:, :1] + np.arange(vec)).any() or (runs[:, 0] % vec).any():
        return 1
    return width


def extent_allows(op, buffers: dict, access_bytes: int = 16) -> bool:
    """Whether a DRAM Move's tensor lets `access_bytes`-wide accesses cover what one unit
    touches: the tensor's innermost dimension is a whole number of vectors (every row starts
    aligned), or the unit's DRAM elements happen to form whole aligned vectors anyway (a flat
    run over rows of 49). Where neither holds (ViT's softmax over rows of 197 floats: rows
    start at every 4-byte offset), no structure gets 16-byte accesses without reading past
    its rows; the static reports count those bytes apart."""
    dram = op.src if buffers[op.src.buffer].level == DRAM else op.dst
    buf = buffers[dram.buffer]
    per = access_bytes // itemsize(buf.dtype)
    if per <= 1:
        return True
    shape = buf.shape or (1,)
    if shape[-1] % per == 0:
        return True
    touched = np.unique(dram.pattern + dram.offset.const)
    _, counts = np.unique(touched // per, return_counts=True)  # elements in each aligned vector
    return bool((counts == per).all()) and not any(c % per for _, c in dram.offset.terms)


def unit_dram_bytes(op, buffers: dict) -> int:
    """Bytes a DRAM <-> register Move moves for one unit: its DRAM slice's distinct elements
    (a broadcast operand read by every lane from one address counts once)."""
    dram = op.src if buffers[op.src.buffer].level == DRAM else op.dst
    return len(np.unique(dram.pattern)) * itemsize(buffers[dram.buffer].dtype)


def wide_shares(graph, at_least: tuple[int, ...]) -> tuple[float, ...]:
    """Per threshold in `at_least`, the share of the DRAM bytes a graph's Moves move that
    vector accesses of that many bytes or more move (0..1), in one pass over the Moves: per
    Move, the distinct DRAM elements one unit touches, so a broadcast operand (a per-channel
    scale read by every lane of a unit from one address) counts once per unit, not once per
    lane. 0 counts any vector access; 16 gives the 128-bit share."""
    buffers = graph.buffers
    total, wide = 0, [0] * len(at_least)
    for _, op in graph.ops():
        if not isinstance(op, Move) or DRAM not in (buffers[op.src.buffer].level, buffers[op.dst.buffer].level):
            continue
        nbytes = unit_dram_bytes(op, buffers)
        total += nbytes
        width = vector_width(op, buffers)
        if width > 1:
            access = width * itemsize(buffers[op.dst.buffer].dtype)
            for i, bound in enumerate(at_least):
                wide[i] += nbytes if access >= bound else 0
    return tuple(w / total if total else 0.0 for w in wide)


def wide_share(graph, at_least: int = 0) -> float:
    """`wide_shares` for one threshold (0: any vector access)."""
    return wide_shares(graph, (at_least,))[0]


NOT_ALLOWED = "innermost extent not whole 16-byte vectors"  # `narrow_reason`s that no structure fixes
DRAM_COPY = "DRAM to DRAM copy"


def narrow_reason(op, buffers: dict) -> str | None:
    """Why a DRAM Move is not one 16-byte access per lane and run, or None where it is: the
    static reports' breakdown of the bytes that move narrower."""
    levels = (buffers[op.src.buffer].level, buffers[op.dst.buffer].level)
    if vector_width(op, buffers) * itemsize(buffers[op.dst.buffer].dtype) >= 16:
        return None
    if levels == (DRAM, DRAM):
        return DRAM_COPY
    if not extent_allows(op, buffers):
        return NOT_ALLOWED
    if op.uniform:
        return "uniform (one value for the whole unit)"
    if op.src.is_masked or op.dst.is_masked:
        return "masked (ragged edge)"
    if op.vec == 1:
        return "structure places one element per lane"
    return "not consecutive or not aligned"


def access_census(graph) -> dict:
    """A graph's DRAM access bytes (each unit's distinct elements, `unit_dram_bytes`, times
    the units): "total", "wide" (16-byte accesses), "allowed" (bytes whose tensor extent admits
    16-byte accesses, `extent_allows`) and "narrow" (reason -> bytes)."""
    buffers, units = graph.buffers, graph.prim.num_units
    out = {"total": 0, "wide": 0, "allowed": 0, "narrow": {}}
    for _, op in graph.ops():
        if not isinstance(op, Move) or DRAM not in (buffers[op.src.buffer].level, buffers[op.dst.buffer].level):
            continue
        n = unit_dram_bytes(op, buffers) * units
        out["total"] += n
        why = narrow_reason(op, buffers)
        if why is None:
            out["wide"] += n
        else:
            out["narrow"][why] = out["narrow"].get(why, 0) + n
        if why not in (NOT_ALLOWED, DRAM_COPY):
            out["allowed"] += n
    return out
