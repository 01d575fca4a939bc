"""Shared builder of the load -> (compute) -> store graphs for ops whose output elements each
depend on one element per operand: elementwise ops and strided layout copies."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from gir.frontend.basic import contiguous_strides
from gir.ir import REGISTER, Slice

from .common import admit, Box, Candidate, box_choices, lane_widths, load, new_graph, store


def vec_choices(chunk: int, size: int, strides: list[tuple[int, ...]], target, widths: list[int],
                mixed: bool = False) -> list[int]:
    """The widths of `lane_widths` that fit: every operand walks the last dimension
    contiguously (or not at all; `mixed`, on a GPU, one operand contiguously is enough where
    the chunk fills every lane's run: the others keep the lanes' runs but load them element by
    element, so a 1x1 conv over a 7x7 map reads its weight row 16 bytes a lane while it
    gathers the input, 49 floats a channel apart, where before every one of its 11,368 units
    read the 232-float weight row a float a lane; the row must give three quarters of the lanes
    a vector or more: 232 halves or 116 floats are 29 vectors over 32 lanes, while 24 channels
    would leave 26 of 32 lanes idle) and a unit's chunk of a row splits into whole vectors (so
    no lane's run crosses a row). The last round of lanes may be partial (a 28x28 map's 196
    vectors over 32 lanes: the emitters guard those lanes); a reduction fused with the box
    offers a width only where its own lane layout takes it (`reduce._unit_vec_choices`: rows of
    128 halves two to a unit, 16 lanes to a row). Widest first where the target
    issues 16-byte accesses (the fusion search takes the widest every op of a group offers),
    else after the scalar one."""
    walks = [s[-1] for s in strides]
    contiguous = all(w in (0, 1) for w in walks)
    mixed = mixed and target.lanes_per_unit >= 32 and target.timing.widest_access_bytes >= 16 and 1 in walks
    fit = [v for v in widths if (contiguous or mixed and 4 * chunk >= 3 * v * target.lanes_per_unit)
           and chunk % v == 0 and size % v == 0]
    return fit + [1] if target.timing.widest_access_bytes >= 16 else [1, *fit]


def row_runs(structure: str, rows: int, chunk: int, dims, strides: list[tuple[int, ...]], target, widths: list[int],
             along_last: list[int]) -> list[int]:
    """Widths `v` at which a lane-per-row box (one whole row a lane: `rows` = lanes) has a
    twin giving each lane `v` consecutive rows, lanes x v rows a unit, its slice ordered
    (chunk, rows): the tiling of a reduction with `v` consecutive outputs a lane (`reduce`
    structure `lane` with `runs`), for an operand that walks the rows contiguously (a lowered
    1x1 conv's input: four pixels a lane, 16 bytes, for every input channel) where no operand
    walks the chunk so. The register file decides (the validator; a load read by one
    reduction streams). GPU units only (the CPU's loops vectorise on their own); never where
    the box already offers a width along the last dimension (`vec` means one or the other)."""
    lanes = target.lanes_per_unit
    if (structure != "rows" or rows != lanes or chunk != dims[-1] or len(along_last) > 1 or lanes < 32
            or target.timing.widest_access_bytes < 16 or not any(s[-2] == 1 for s in strides)):
        return []
    return [v for v in widths if v > 1 and dims[-2] % v == 0]


def pointwise_candidates(op, tensors, target, dims, in_views: list[tuple[str, int, tuple]], out_strides: tuple,
                         compute: Callable | None, rejected: list, structures: tuple | None = None) -> list[Candidate]:
    """One candidate per box shape, units per block and vector width. `in_views` gives each
    operand's (tensor, offset, strides) over `dims`; `compute(g, regs, box)` returns the result
    register slice, or None for a plain copy. `structures`: only these box structures."""
    out = tensors[op.outputs[0]]
    dims, padded = Box.pad(dims, [out_strides, *[v[2] for v in in_views]])
    out_strides, in_strides = padded[0], padded[1:]
    widths = lane_widths(tensors, [out.name, *[v[0] for v in in_views]], target)
    cands = []
    for structure, rows, chunk, upb, whole in box_choices(dims, target):
        if structures is not None and structure not in structures:
            continue
        plain = Box.of(dims, structure, rows, chunk, upb, whole)
        vecs = vec_choices(chunk, plain.size, padded, target, widths)
        runs = row_runs(structure, rows, chunk, dims, padded[1:], target, widths, vecs)
        if not runs and structure == "row" and chunk == dims[-1]:
            # no runs twin: a whole row a unit may read one operand wide while it gathers others
            vecs = vec_choices(chunk, plain.size, padded, target, widths, mixed=True)
        twins = [(replace(plain, rows=rows * v, transposed=True), v) for v in runs]
        for box, vec in twins + [(plain, v) for v in vecs]:
            g = new_graph(op, tensors, target, box.prim(), structure, [v[0] for v in in_views])
            regs = [load(g, box.slice(name, offset, st), f"in{i}", box.size, tensors[name].dtype, vec=vec)
                    for i, ((name, offset, _), st) in enumerate(zip(in_views, in_strides))]
            result = compute(g, regs, box, vec) if compute else regs[0]
            store(g, result, box.slice(out.name, 0, out_strides), vec=vec)
            params = {"rows": box.rows, "chunk": chunk, "units_per_block": upb, "vec": vec} | ({"whole": whole} if whole else {})
            params |= {"runs": vec} if box.transposed else {}
            admit(cands, rejected, op.name, structure, params, g, streams=box.transposed)
    return cands


def register_result(g, box: Box, dtype: str, name: str = "%out") -> Slice:
    g.buffer(name, REGISTER, box.size, dtype)
    return Slice(name, 0, box.shape, contiguous_strides(box.shape))
