"""What every template shares: the candidate record, dimension coalescing, the DRAM buffers of
an op, and the box tiling that maps units onto the output of a pointwise-shaped op."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from math import ceil, prod

from gir.frontend.basic import BasicOp, Tensor, contiguous_strides
from gir.ir import DRAM, REGISTER, GIRGraph, Move, ParallelPrimitive, Slice, W, block_coord, validate
from gir.ir.validate import GraphError
from gir.ir.affine import Affine
from gir.ir.dtypes import itemsize
from gir.ir.target import Target


@dataclass
class Candidate:
    """One GIR-Graph for one basic operator: the graph structure and the parameters that made it."""
    op: str
    structure: str
    params: dict
    graph: GIRGraph = field(repr=False)

    @property
    def label(self) -> str:
        return f"{self.structure}(" + ", ".join(f"{k}={v}" for k, v in sorted(self.params.items())) + ")"


def admit(cands: list, rejected: list, op_name: str, structure: str, params: dict, g: GIRGraph,
          streams: bool = False) -> None:
    """Keep a built graph as a candidate if the target can hold it, else record why not
    (`streams`: see `validate`)."""
    try:
        validate(g, bounds=False, streams=streams)
    except GraphError as err:
        rejected.append((structure, params, str(err).splitlines()[-1].strip()))
        return
    cands.append(Candidate(op_name, structure, params, g))



def coalesce(shape: tuple[int, ...], *stride_sets: tuple[int, ...]) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Drop size-1 dimensions and merge neighbours that every operand walks contiguously, so a
    (128, 12, 64) tensor read straight through is one dimension of 98304."""
    dims = [(n, [s[d] for s in stride_sets]) for d, n in enumerate(shape) if n != 1]
    merged: list[tuple[int, list[int]]] = []
    for n, strides in dims:
        if merged:
            pn, pstrides = merged[-1]
            if all(ps == s * n for ps, s in zip(pstrides, strides)):
                merged[-1] = (pn * n, strides)
                continue
        merged.append((n, strides))
    if not merged:
        return (1,), [(0,) for _ in stride_sets]
    out_shape = tuple(n for n, _ in merged)
    return out_shape, [tuple(st[i] for _, st in merged) for i in range(len(stride_sets))]


def coalesce_rows(shape: tuple[int, ...], *stride_sets: tuple[int, ...]):
    """Like coalesce, but the last axis stays its own dimension: the (rows, row) view a fused
    neighbour (a reduction over the last axis) is tiled by, so structures can match."""
    if len(shape) < 2:
        return coalesce(shape, *stride_sets)
    head, head_strides = coalesce(shape[:-1], *[s[:-1] for s in stride_sets])
    if head == (1,):
        return coalesce(shape, *stride_sets)
    return (*head, shape[-1]), [(*h, s[-1]) for h, s in zip(head_strides, stride_sets)]


def unique_views(shape, stride_sets) -> list:
    """The fully coalesced view and the row view, once each when they coincide."""
    views = [coalesce(shape, *stride_sets), coalesce_rows(shape, *stride_sets)]
    return views[:1] if views[0] == views[1] else views


def broadcast_strides(shape: tuple[int, ...], out_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides that read a numpy-broadcast operand over the output's index space (0 where broadcast)."""
    padded = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    own = contiguous_strides(padded)
    return tuple(0 if n == 1 and o != 1 else s for n, o, s in zip(padded, out_shape, own))


def new_graph(op: BasicOp, tensors: dict[str, Tensor], target: Target, prim: ParallelPrimitive, structure: str,
              inputs: list[str] | None = None) -> GIRGraph:
    """A graph with the op's tensors declared as DRAM buffers (inputs, constants, outputs).
    `inputs` replaces op.inputs where an operand is read through a folded view of another tensor."""
    g = GIRGraph(f"{op.name}:{structure}", prim, target)
    for name in dict.fromkeys(op.inputs if inputs is None else inputs):
        t = tensors[name]
        if t.size == 0:
            continue  # an empty concat operand: nothing to read
        g.buffer(name, DRAM, t.shape or (1,), t.dtype, role="const" if t.is_const else "input")
    for name in op.outputs:
        t = tensors[name]
        g.buffer(name, DRAM, t.shape or (1,), t.dtype, role="output")
    return g


@dataclass(frozen=True)
class Box:
    """How units cover a pointwise output of shape `dims` (rank >= 2 after padding): each unit
    takes `rows` x `chunk` of the last two dimensions, and all of the `whole` dimensions before
    them (a conv window's channels: the group a reduction over those axes reads); the other
    dimensions are grid axes. Units of a block go along the last dimension while it is split,
    else along the rows."""
    dims: tuple[int, ...]
    rows: int
    chunk: int
    units_per_block: int
    whole: int = 0
    outer_units: bool = False  # one whole trailing window per unit, a block's units along the last grid axis
    # the unit's slice ordered (chunk, rows): lanes placed `vec` consecutive rows each, every
    # element of those rows' chunks in turn (a lowered 1x1 conv's product: four pixels a lane
    # read 16 bytes at a time for each input channel; see `row_runs`)
    transposed: bool = False

    @classmethod
    def of(cls, dims, structure: str, rows: int, chunk: int, units_per_block: int, whole: int) -> "Box":
        """The box a `box_choices` entry describes (`taps`: units along the outer axis)."""
        return cls(dims, rows, chunk, units_per_block, whole, structure == "taps")

    @staticmethod
    def pad(dims: tuple[int, ...], strides: list[tuple[int, ...]]):
        if len(dims) >= 2:
            return dims, strides
        return (1, *dims), [(0, *s) for s in strides]

    @property
    def split_last(self) -> bool:
        return self.chunk < self.dims[-1]

    @property
    def block_per_row(self) -> bool:
        """The units of one block cover whole rows between them (no grid axis along the row)."""
        return self.split_last and self.chunk * self.units_per_block >= self.dims[-1]

    @property
    def _grid_dims(self) -> int:
        return len(self.dims) - 2 - self.whole

    @property
    def shape(self) -> tuple[int, ...]:
        """One unit's slice."""
        last = (self.chunk, self.rows) if self.transposed else (self.rows, self.chunk)
        return (*self.dims[self._grid_dims:-2], *last)

    def prim(self) -> ParallelPrimitive:
        outer = self.dims[:self._grid_dims]
        upb = self.units_per_block
        if self.outer_units:
            return ParallelPrimitive((*outer[:-1], ceil(outer[-1] / upb)), upb)
        if self.block_per_row:
            grid = (*outer, ceil(self.dims[-2] / self.rows))
        elif self.split_last:
            grid = (*outer, ceil(self.dims[-2] / self.rows), ceil(self.dims[-1] / (self.chunk * upb)))
        else:
            grid = (*outer, ceil(self.dims[-2] / (self.rows * upb)))
        return ParallelPrimitive(grid, upb)

    def _q(self) -> tuple[Affine, Affine]:
        """Box index of the unit along the rows and along the last dimension."""
        k = self._grid_dims
        if self.block_per_row:
            return block_coord(k), W
        if self.split_last:
            return block_coord(k), block_coord(k + 1) * self.units_per_block + W
        return block_coord(k) * self.units_per_block + W, Affine(0)

    def slice(self, buffer: str, offset: int, strides: tuple[int, ...]) -> Slice:
        """The box of one operand addressed with its own strides over the output's dims."""
        return Slice(buffer, *_box_addressing(self, offset, tuple(strides)))

    @property
    def size(self) -> int:
        return prod(self.shape)


@lru_cache(maxsize=8192, typed=True)  # typed: an int and a numpy offset stay apart, as uncached
def _box_addressing(box: Box, offset: int, strides: tuple[int, ...]) -> tuple:
    """(offset, shape, strides, limits) of a box slice; cached because every candidate of every
    repeated layer asks for the same few."""
    k = box._grid_dims
    base = Affine(offset)
    if box.outer_units:  # unit q of the last grid axis: its whole window, nothing past the axis' end
        q = block_coord(k - 1) * box.units_per_block + W
        for d, s in enumerate(strides[:k - 1]):
            base = base + block_coord(d) * s
        limits = (*[None] * box.whole, (box.dims[k - 1] - q) * box.rows, None)
        return base + q * strides[k - 1], box.shape, strides[k:], limits
    q_rows, q_last = box._q()
    for d, s in enumerate(strides[:k]):
        base = base + block_coord(d) * s
    base = base + q_rows * (box.rows * strides[-2]) + q_last * (box.chunk * strides[-1])
    limits = (*[None] * box.whole, box.dims[-2] - q_rows * box.rows, box.dims[-1] - q_last * box.chunk)
    inner = strides[k:]
    if box.transposed:
        inner, limits = (*inner[:-2], inner[-1], inner[-2]), (*limits[:-2], limits[-1], limits[-2])
    return base, box.shape, inner, limits


HALF_FLOATS = ("float16", "bfloat16")


def lane_widths(tensors: dict[str, Tensor], names, target: Target) -> list[int]:
    """Consecutive elements per lane (`vec`) worth offering an op, widest first: 16 bytes of
    its operands' widest type (4 for fp32) and of their narrowest (8 where one is fp16/bf16).
    On a target that issues 16-byte accesses, a graph holding 16-bit floats also offers 8 to
    its 4-byte ops: a fused group takes one width every op offers, so the fp32 sums between a
    half LayerNorm's casts would otherwise hold its fp16 loads and stores to 8 bytes."""
    sizes = {itemsize(tensors[n].dtype) for n in names}
    widths = {16 // max(sizes), 16 // min(sizes)}
    wide = target.timing.widest_access_bytes >= 16
    if 8 not in widths and wide and any(t.dtype in HALF_FLOATS for t in tensors.values()):  # scanned only then
        widths.add(8)
    return sorted((w for w in widths if w in (2, 4, 8)), reverse=True)


def exact_blocks(row: int, target: Target) -> list[int]:
    """Units per block that split a row into four or eight elements a lane each (one 16-byte
    vector of fp32 or of fp16), where that count is not a power of two: a row of 768 halves
    over three units of 256 (a LayerNorm in fp16), which the power-of-two block sizes split
    only into partial vectors."""
    if target.timing.widest_access_bytes < 16:
        return []
    counts = {row // (vec * target.lanes_per_unit) for vec in (4, 8) if row % (vec * target.lanes_per_unit) == 0}
    return sorted(u for u in counts if 2 < u <= target.max_units_per_block and u & (u - 1))


def row_elements_per_lane(target: Target) -> int:
    return max(32, target.register_bytes_per_lane // (16 * 4))


def block_sizes(target: Target, largest: int = 8) -> list[int]:
    """Units per block worth offering, largest first: the search evaluates only the first few
    structures of a group (`limit`), and on a GPU a larger block holds more warps per SM under
    the resident-block limit (the time model ranks them; this order decides what it sees)."""
    return [u for u in (16, 8, 4, 2, 1) if u <= min(largest, target.max_units_per_block)]


def box_choices(dims: tuple[int, ...], target: Target) -> list[tuple[str, int, int, int, int]]:
    """(structure, rows, chunk, units_per_block, whole) worth trying for a pointwise output: a
    chunk of the last dimension per unit (1-8 elements per lane), or whole short rows several
    at a time."""
    lanes, last = target.lanes_per_unit, dims[-1]
    upbs = block_sizes(target)
    wide = block_sizes(target, 16)  # a block per row of a long row group
    out = []
    # Whole rows first: they tile a row exactly as a unit (or block) reduction of that row does,
    # so a fused group's load slices agree and the rewrites can keep data in registers. Up to 32
    # elements per lane; more where registers are plentiful (a CPU thread's are its stack), room
    # left for 16 such rows live at once.
    if last <= row_elements_per_lane(target) * lanes:
        out += [("row", 1, last, u, 0) for u in upbs]
    out += [("row", 1, ceil(last / (u * lanes)) * lanes, u, 0) for u in upbs if u > 1]
    out += [("row", 1, last // u, u, 0) for u in exact_blocks(last, target) if u not in upbs]
    for elems_per_lane in (1, 2, 4, 8):
        span = lanes * elems_per_lane
        out += [("chunk", 1, min(span, last), u, 0) for u in upbs]
        rows = min(dims[-2], span // last)
        if rows > 1:
            out += [("rows", rows, last, u, 0) for u in upbs]
    # A lane per short row, a row per lane of a warp (wavefront): the tiling of a reduction with
    # one output per lane (`lane` structure) over a short reduced group, such as a lowered 1x1
    # conv's input channels, so the product fuses with it instead of a unit per output leaving
    # lanes idle (EfficientNet-B0's 16 -> 96 expansion conv: 133 us on an H100 as a unit per
    # output, results/bench_gpu.md). GPU units only (32 or 64 lanes): not measured on the
    # CPU's 8-lane units.
    if lanes >= 32 and last <= row_elements_per_lane(target):
        for ept in (1, 2, 4):
            if dims[-2] >= lanes * ept and ept * last <= row_elements_per_lane(target):
                out += [("rows", lanes * ept, last, u, 0) for u in upbs]
    # On a CPU unit (a thread, its lanes SIMD), whole rows of any length, a SIMD width or more
    # of them: the tiling of a reduction with an output per lane whose loads run across the
    # rows (attention's probabilities times V, read down V's columns: gir/ir/streams.py
    # `column_products`), which the emitter runs with the outputs in the SIMD lanes.
    if lanes < 32 and target.timing.unit_bandwidth:
        for ept in (1, 2, 4):
            if dims[-2] >= lanes * ept and ept * last <= row_elements_per_lane(target):
                out += [("rows", lanes * ept, last, u, 0) for u in upbs]
    # A block of units covering all rows of the second-last dimension between them: the tiling
    # of a reduction with several outputs per unit and one block per output row.
    for u in wide:
        rows = ceil(dims[-2] / u)
        if len(dims) > 2 and rows > 1 and rows * (u - 1) < dims[-2] and rows * last <= row_elements_per_lane(target) * lanes:
            out.append(("rows", rows, last, u, 0))
    # Whole trailing windows (channels x kernel rows x kernel columns of a lowered conv): the
    # group a reduction over several axes reads, so the product feeding it can fuse with it.
    for whole in range(1, len(dims) - 1):
        if prod(dims[-2 - whole:]) > row_elements_per_lane(target) * lanes:
            break
        out += [("window", dims[-2], last, u, whole) for u in upbs]
    # A whole small trailing window (a conv's or pooling's taps) per unit, the units of a block
    # along the outputs: the tiling of a reduction with one output per unit in blocks of several
    # units, so a window product and its reduction fuse in blocks of more than one warp.
    # Also with `whole` leading window dims (a dense conv's input channels x taps, 27 for an
    # RGB stem), so a small dense conv is not left in one-warp blocks.
    for whole in range(0, len(dims) - 2):
        if dims[-3 - whole] == 1 or dims[-2] == 1 or prod(dims[-2 - whole:]) > 64:
            break
        out += [("taps", dims[-2], last, u, whole) for u in upbs if u > 1]
    # One element per unit, last: poor alone (idle lanes), but it is the tiling of a reduction
    # with one output per unit, so an epilogue (bias, activation) can fuse into it.
    out += [("element", 1, 1, u, 0) for u in upbs]
    # A row over 16 units (a ViT softmax of 197 fusing with its product's reduction), last: the
    # first structure of a family is the one a fused group takes.
    out += [("row", 1, ceil(last / (u * lanes)) * lanes, u, 0) for u in wide if u not in upbs]
    return list(dict.fromkeys(out))


def load(g: GIRGraph, src: Slice, reg: str, size: int, dtype: str, fill=None, vec: int = 1, uniform: bool = False) -> Slice:
    """Move a slice into a new register buffer; local buffers start with % (never a tensor name)."""
    reg = "%" + reg
    g.buffer(reg, REGISTER, size, dtype)
    dst = Slice(reg, 0, src.shape, _contiguous(src.shape))
    g.add(Move(src=src, dst=dst, fill=fill, vec=vec, uniform=uniform))
    return dst


def store(g: GIRGraph, src: Slice, dst: Slice, vec: int = 1) -> None:
    g.add(Move(src=Slice(src.buffer, src.offset, dst.shape, _contiguous(dst.shape)), dst=dst, vec=vec))


def _contiguous(shape) -> tuple[int, ...]:
    return contiguous_strides(shape)

