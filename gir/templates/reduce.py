"""Reduce template: sum, max, min, prod over any set of axes, in four graph structures.

The input's dimensions coalesce into kept (K) and reduced (R) groups. Every structure loads a
unit's slice ordered (outputs, reduced elements) so that each output's group is contiguous in
slice order, whatever the axes were:
- lane: one lane per output (no communication; coalesced when the kept dim is innermost);
- unit: one unit per output, lanes combined by shuffles;
- block: one block per output, unit partials combined through shared memory;
- two_phase: several blocks per output, partials through DRAM and a device sync.
fp16 accumulates in fp32 and is cast back before the store.
"""
from __future__ import annotations

from copy import copy
from math import ceil, prod

from gir.frontend.basic import contiguous_strides
from gir.ir import (BLOCK, DEVICE, DRAM, REGISTER, SHARED, UNIT, Elementwise, Input, Move, ParallelPrimitive, Reduce,
                    Slice, Sync, W, block_coord, call)
from gir.ir.affine import Affine
from gir.ir.dtypes import accumulator, itemsize
from gir.ir.gops import reduce_identity

from .common import admit, block_sizes, exact_blocks, lane_widths, new_graph


def split_dims(shape, axes, strides=None, out_strides=None):
    """Coalesced (size, stride) lists of kept and reduced dimensions, in input order, and the
    output stride of each kept group. `out_strides` (per input dimension, over the kept ones)
    writes the result in another order than the input's: kept dimensions then merge only where
    both sides walk them contiguously."""
    strides = strides or contiguous_strides(shape)
    if out_strides is None:
        kept_shape = [n for d, n in enumerate(shape) if d not in axes]
        own = iter(contiguous_strides(kept_shape))
        out_strides = [0 if d in axes else next(own) for d in range(len(shape))]
    groups = []
    for d, (n, s, o) in enumerate(zip(shape, strides, out_strides)):
        if n == 1:
            continue
        kind = "R" if d in axes else "K"
        if groups and groups[-1][0] == kind and groups[-1][2] == s * n and groups[-1][3] == o * n:
            groups[-1] = (kind, groups[-1][1] * n, s, o)
        else:
            groups.append((kind, n, s, o))
    kept = [(n, s) for k, n, s, _ in groups if k == "K"] or [(1, 0)]
    red = [(n, s) for k, n, s, _ in groups if k == "R"] or [(1, 0)]
    kept_out = [o for k, _, _, o in groups if k == "K"] or [1]
    return kept, red, kept_out


def _result_strides(shape, axes, order) -> list[int] | None:
    """Per input dimension, its stride in a result written transposed by `order` (None: in order)."""
    if order is None:
        return None
    kept = [d for d in range(len(shape)) if d not in axes]
    result = contiguous_strides([shape[kept[i]] for i in order])
    where = {kept[i]: s for i, s in zip(order, result)}
    return [where.get(d, 0) for d in range(len(shape))]


class _Plan:
    """Addressing shared by the structures: kept dims but the innermost are grid axes."""

    def __init__(self, op, tensors, target, view=None):
        self.op, self.tensors, self.target = op, tensors, target
        x, y = tensors[op.inputs[0]], tensors[op.outputs[0]]
        source, self.offset, strides = view or (x.name, 0, None)
        self.x, self.y = tensors[source], y
        self.widths = lane_widths(tensors, [source, y.name], target)
        shape, axes = x.shape or (1,), set(op.attrs["axes"])
        self.kept, self.red, self.out_strides = split_dims(shape, axes, strides,
                                                          _result_strides(shape, axes, op.attrs.get("order")))
        self.group = prod(n for n, _ in self.red)
        self.acc = accumulator(x.dtype)
        self.fill = reduce_identity(op.attrs["op"], x.dtype)
        self.lanes = target.lanes_per_unit

    def rows_of(self, row: int) -> "_Plan":
        """The same reduction with its innermost kept dimension split into rows of `row`
        outputs, so that a tiling along it restarts at every row (a ragged last tile each)."""
        (n, s), o = self.kept[-1], self.out_strides[-1]
        if n == row:
            return self
        split = copy(self)
        split.kept = [*self.kept[:-1], (n // row, s * row), (row, s)]
        split.out_strides = [*self.out_strides[:-1], o * row, o]
        return split

    def outer(self, skip_last: bool):
        """(grid sizes, input base, output base) over the kept dims used as grid axes."""
        dims = self.kept[:-1] if skip_last else self.kept
        base_in, base_out, grid = Affine(self.offset), Affine(0), []
        for c, ((n, s), os) in enumerate(zip(dims, self.out_strides)):
            grid.append(n)
            base_in, base_out = base_in + block_coord(c) * s, base_out + block_coord(c) * os
        return grid, base_in, base_out

    def finish(self, g, acc_slice: Slice, dst: Slice, vec=1, uniform=False):
        """Cast the accumulator back to the output dtype (if needed) and store."""
        if self.acc != self.y.dtype:
            g.buffer("%cast", REGISTER, acc_slice.size, self.y.dtype)
            cast = Slice("%cast", 0, acc_slice.shape, acc_slice.strides)
            g.add(Elementwise(expr=call("cast", Input(0), dtype=self.y.dtype), inputs=(acc_slice,), out=cast,
                              vec=vec, uniform=uniform))
            acc_slice = cast
        g.add(Move(src=acc_slice, dst=dst, vec=vec))

    def unit_reduce(self, g, src: Slice, name: str, outputs: int = 1) -> Slice:
        """Sync the unit's lanes, then reduce cooperatively: `outputs` consecutive groups of src."""
        g.buffer(name, REGISTER, outputs, self.acc)
        dst = Slice.flat(name, 0, outputs)
        g.add(Sync(scope=UNIT, slice=src))
        g.add(Reduce(op=self.op.attrs["op"], src=src, dst=dst))
        return dst


def _unit_vec_choices(plan: _Plan, target, outs: int) -> list[int]:
    """Lane placements of a unit reduction's load (`lane_widths`: 16-byte loads) where the one
    reduced dimension is contiguous, splits into whole vectors and, where a unit has several
    `outs` rows, they give every lane whole vectors (two rows of 128 halves: each row summed over
    16 lanes; one row may end part-way through a round of lanes: a 56x56 pool's 784 vectors), first
    where the target issues such loads; else one element per lane."""
    (size, stride), *more = plan.red
    fit = [v for v in plan.widths if not more and stride == 1 and size % v == 0
           and (outs == 1 or outs * size % (v * target.lanes_per_unit) == 0)]
    return fit + [1] if target.timing.widest_access_bytes >= 16 else [1]


def _per_unit_outputs(plan: _Plan, structure: str, outs: int, upb: int, vec: int = 1):
    """lane and unit structures: each unit owns `outs` consecutive outputs of the innermost kept
    dim. `vec`: the unit structure's load placement (see `_unit_vec_choices`)."""
    p = plan
    k_last, s_last = p.kept[-1]
    grid, base_in, base_out = p.outer(skip_last=True)
    grid.append(ceil(k_last / (outs * upb)))
    q = block_coord(len(grid) - 1) * upb + W
    g = new_graph(p.op, p.tensors, p.target, ParallelPrimitive(tuple(grid), upb), structure, [p.x.name])
    red_sizes = tuple(n for n, _ in p.red)
    src = Slice(p.x.name, base_in + q * (outs * s_last), (outs, *red_sizes), (s_last, *(s for _, s in p.red)),
                (k_last - q * outs, *([None] * len(red_sizes))))
    g.buffer("%in", REGISTER, src.size, p.x.dtype)
    reg = Slice.flat("%in", 0, src.size)
    o_last = p.out_strides[-1]
    dst = Slice(p.y.name, base_out + q * (outs * o_last), (outs,), (o_last,), (k_last - q * outs,))
    if structure == "lane":
        g.add(Move(src=src, dst=Slice("%in", 0, src.shape, contiguous_strides(src.shape)), fill=p.fill, vec=p.group))
        g.buffer("%out", REGISTER, outs, p.acc)
        acc = Slice.flat("%out", 0, outs)
        g.add(Reduce(op=p.op.attrs["op"], src=reg, dst=acc, uniform=False))
    else:
        g.add(Move(src=src, dst=Slice("%in", 0, src.shape, contiguous_strides(src.shape)), fill=p.fill, vec=vec))
        acc = p.unit_reduce(g, reg, "%out", outs)
    p.finish(g, acc, dst)
    return g


def _lane_runs(plan: _Plan, outs: int, upb: int, vec: int):
    """The lane structure with `vec` consecutive outputs a lane: each unit's slice ordered
    (reduced elements, outputs), so element (g, o) sits in lane (o // vec) % lanes for every g
    (outs a multiple of vec x lanes). A product fused into it from a transposed box
    (`pointwise.row_runs`) loads `vec` consecutive outputs' operands at a time for every
    reduced element, and the lane stores its `vec` results as one access: a lowered 1x1 conv
    reads four pixels a lane, 16 bytes, per input channel, and writes four."""
    p = plan
    k_last, s_last = p.kept[-1]
    grid, base_in, base_out = p.outer(skip_last=True)
    grid.append(ceil(k_last / (outs * upb)))
    q = block_coord(len(grid) - 1) * upb + W
    g = new_graph(p.op, p.tensors, p.target, ParallelPrimitive(tuple(grid), upb), "lane", [p.x.name])
    red_sizes, red_strides = tuple(n for n, _ in p.red), tuple(s for _, s in p.red)
    src = Slice(p.x.name, base_in + q * (outs * s_last), (*red_sizes, outs), (*red_strides, s_last),
                (*([None] * len(red_sizes)), k_last - q * outs))
    g.buffer("%in", REGISTER, src.size, p.x.dtype)
    g.add(Move(src=src, dst=Slice("%in", 0, src.shape, contiguous_strides(src.shape)), fill=p.fill, vec=vec))
    g.buffer("%out", REGISTER, outs, p.acc)
    acc = Slice.flat("%out", 0, outs)
    g.add(Reduce(op=p.op.attrs["op"], src=Slice("%in", 0, (outs, p.group), (1, outs)), dst=acc, uniform=False, vec=vec))
    o_last = p.out_strides[-1]
    p.finish(g, acc, Slice(p.y.name, base_out + q * (outs * o_last), (outs,), (o_last,), (k_last - q * outs,)), vec=vec)
    return g


def _lane_run_widths(plan: _Plan, target, outs: int) -> list[int]:
    """Widths at which `_lane_runs` applies: GPU units, `outs` a multiple of width x lanes and
    the outputs' innermost dimension whole vectors (a ragged end masks whole runs)."""
    lanes = target.lanes_per_unit
    if lanes < 32 or target.timing.widest_access_bytes < 16:
        return []
    k_last = plan.kept[-1][0]
    return [v for v in plan.widths if v > 1 and outs % (v * lanes) == 0 and k_last % v == 0]


def _run_rows(plan: _Plan) -> list[_Plan]:
    """The reduction as `_lane_runs` may tile it: over its whole innermost kept dimension, and
    restarting at every row of each trailing block of the result's dimensions that divides it
    (a 1x1 conv's 56x56 pixels of one output channel: the product's box tiles each channel's
    pixels on its own, and a tile of 128 outputs does not divide 3,136)."""
    k_last, out = plan.kept[-1][0], []
    for i in range(len(plan.y.shape) - 1, 0, -1):
        row = prod(plan.y.shape[i:])
        if 1 < row < k_last and k_last % row == 0 and row not in out:
            out.append(row)
    return [plan] + [plan.rows_of(r) for r in out]


def _block_vec_choices(plan: _Plan, target, workers: int) -> list[int]:
    """Lane placements of a block reduction's load, as `_unit_vec_choices`: 16-byte loads where
    the reduced dimension is contiguous and splits into whole vectors (each unit's chunk is whole
    rounds of vec x lanes; the last units' bounds fall on whole vectors, so a ragged end masks
    whole runs: a 112x112 pool's 12,544 floats over 16 units)."""
    (size, stride), = plan.red
    fit = [v for v in plan.widths if stride == 1 and size % v == 0]
    return fit + [1] if target.timing.widest_access_bytes >= 16 else [1]


def _block(plan: _Plan, upb: int, phases: int, vec: int = 1):
    """One block (phases == 1) or `phases` blocks (through DRAM) per output; units split the
    single reduced dimension into lane-multiple chunks (`vec` consecutive elements per lane:
    see `_block_vec_choices`)."""
    p = plan
    (size, stride), = p.red
    grid, base_in, base_out = p.outer(skip_last=False)
    workers = upb * phases
    chunk = ceil(size / (workers * p.lanes * vec)) * p.lanes * vec
    if phases > 1:
        grid.append(phases)
        t = block_coord(len(grid) - 1) * upb + W
        lead = block_coord(len(grid) - 1) + W  # zero only on the first unit of the first block
    else:
        t, lead = W, W
    structure = "block" if phases == 1 else "two_phase"
    g = new_graph(p.op, p.tensors, p.target, ParallelPrimitive(tuple(grid), upb), structure, [p.x.name])
    g.buffer("%in", REGISTER, chunk, p.x.dtype)
    src = Slice.flat(p.x.name, base_in + t * (chunk * stride), chunk, limit=size - t * chunk)
    if stride != 1:
        src = Slice(p.x.name, src.offset, (chunk,), (stride,), src.limits)
    g.add(Move(src=src, dst=Slice.flat("%in", 0, chunk), fill=p.fill, vec=vec))
    part = p.unit_reduce(g, Slice.flat("%in", 0, chunk), "%part")
    if phases == 1:
        g.buffer("%partials", SHARED, upb, p.acc)
        mine, everyone = Slice.flat("%partials", W, 1), Slice.flat("%partials", 0, upb)
        scope = BLOCK
    else:
        g.buffer("%partials", DRAM, (prod(grid[:-1]) * workers,), p.acc)
        out_index = base_out
        mine = Slice.flat("%partials", out_index * workers + t, 1)
        everyone = Slice.flat("%partials", out_index * workers, workers, limit=workers - workers * lead)
        scope = DEVICE
    g.add(Move(src=part, dst=mine))
    g.add(Sync(scope=scope, slice=mine))
    g.buffer("%all", REGISTER, everyone.size, p.acc)
    g.add(Move(src=everyone, dst=Slice.flat("%all", 0, everyone.size), fill=p.fill))
    total = p.unit_reduce(g, Slice.flat("%all", 0, everyone.size), "%total")
    p.finish(g, total, Slice.flat(p.y.name, base_out, 1, limit=1 - lead))
    return g


def _elements_per_lane(plan: _Plan, structure: str, params: dict) -> int:
    """Register elements one lane holds, known before building (keeps huge slices unbuilt)."""
    lanes = plan.lanes
    if structure == "lane":
        return ceil(params["outputs_per_unit"] / lanes) * plan.group
    if structure == "unit":
        return ceil(params["outputs_per_unit"] * plan.group / lanes)
    workers = params["units_per_block"] * params.get("blocks_per_output", 1)
    return ceil(plan.group / (workers * lanes))


def generate(op, tensors, target, rejected, view=None):
    """`view`: read the input as (tensor, offset, strides over the input's shape) instead."""
    plan = _Plan(op, tensors, target, view)
    lanes, upbs = target.lanes_per_unit, block_sizes(target)
    builds = []
    row = next((n for n in reversed(plan.y.shape) if n != 1), 1)
    for upb in upbs:
        for ept in (1, 2, 4):
            for vec in _lane_run_widths(plan, target, lanes * ept):
                for tiled in _run_rows(plan):
                    rows = {} if tiled is plan else {"row": tiled.kept[-1][0]}
                    builds.append(("lane", {"outputs_per_unit": lanes * ept, "units_per_block": upb, "vec": vec,
                                            "runs": vec} | rows,
                                   lambda o=lanes * ept, u=upb, v=vec, t=tiled: _lane_runs(t, o, u, v)))
            builds.append(("lane", {"outputs_per_unit": lanes * ept, "units_per_block": upb},
                           lambda o=lanes * ept, u=upb: _per_unit_outputs(plan, "lane", o, u)))
        for outs in (1, 2, 4):
            for vec in _unit_vec_choices(plan, target, outs):
                builds.append(("unit", {"outputs_per_unit": outs, "units_per_block": upb} | ({"vec": vec} if vec > 1 else {}),
                               lambda o=outs, u=upb, v=vec: _per_unit_outputs(plan, "unit", o, u, v)))
    for upb in block_sizes(target, 16):
        # One block per row of the result, its units splitting the row: the tiling of a product
        # computed by rows (QK^T) and of a softmax over that row, so attention fuses.
        outs = ceil(row / upb)
        if (outs > 4 or upb not in upbs) and outs * (upb - 1) < row and plan.kept[-1][0] % row == 0:
            builds.append(("unit", {"outputs_per_unit": outs, "units_per_block": upb},
                           lambda o=outs, u=upb: _per_unit_outputs(plan.rows_of(row), "unit", o, u)))
    if len(plan.red) == 1 and plan.group >= 2 * lanes:
        big = [u for u in block_sizes(target, 16) if u > 1] or [1]
        big += [u for u in exact_blocks(plan.red[0][0], target) if u not in big]
        for upb in (u for u in big if u > 1):
            for vec in _block_vec_choices(plan, target, upb):
                builds.append(("block", {"units_per_block": upb} | ({"vec": vec} if vec > 1 else {}),
                               lambda u=upb, v=vec: _block(plan, u, 1, v)))
        if plan.group >= 64 * lanes:
            for upb in big[:2]:
                for phases in (4, 16):
                    for vec in _block_vec_choices(plan, target, upb * phases):
                        builds.append(("two_phase", {"units_per_block": upb, "blocks_per_output": phases}
                                       | ({"vec": vec} if vec > 1 else {}),
                                       lambda u=upb, ph=phases, v=vec: _block(plan, u, ph, v)))
    cands = []
    for structure, params, build in builds:
        held = _elements_per_lane(plan, structure, params)
        if held * itemsize(plan.acc) > target.register_bytes_per_lane:
            rejected.append((structure, params, f"{held} elements per lane exceed the register file"))
            continue
        g = build()
        admit(cands, rejected, op.name, structure, params, g)
    return cands
