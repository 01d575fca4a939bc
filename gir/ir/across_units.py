"""Which kernels a SIMD-lane target vectorises across units instead of within one.

On a CPU a unit is one loop iteration of one thread and its lanes are the iterations of each
gOperator's element loop. A kernel whose units each compute a handful of elements (one output
of a window reduction) has nothing to vectorise inside a unit, but neighbouring units along the
grid's last axis compute neighbouring outputs: the CPU emitter then runs that axis as the SIMD
loop (gir/backends/across_units.py). The rule lives here, on the IR, because the emitter
and the time model (gir/fusion/perf.py) must agree on it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from math import prod

import numpy as np

from .affine import Affine, ParallelPrimitive
from .gops import Gather, Move, Sync
from .target import DRAM, REGISTER

MAX_ELEMENTS = 64      # the largest gOperator (elements one unit reads or writes) worth unrolling
MAX_STATEMENTS = 1024  # unrolled element statements in the whole kernel (compile time, code size)
MIN_ROW = 4            # units along the grid's last axis: at least a SIMD vector of them
MAX_STRIDE = 4         # elements a DRAM slice may step per unit (a stride-2 conv's input: 2)
MASKED_SINGLE = 25     # masked DRAM loads per unit up to which a row is one masked SIMD loop
MIN_SPLIT_ROW = 16     # units along the last axis worth splitting into interior and borders
MERGE_BELOW = 8        # rows shorter than this run merged with the axis before them (merges_rows)
SHORT_ROW = 34         # windowed rows shorter than this run lanes on channels (channel_lanes)
CHANNEL_LANES = 16     # channels a block of the channel-lane form holds (a 64-byte vector of floats)
STAGE_BYTES = 160 << 10  # staged bytes per block at most (on the thread's stack, L2-resident)
MIN_BAND = 4           # output rows a band of a plane too large to stage whole holds at least


def step_along(prim: ParallelPrimitive, s, axis: int) -> int:
    """How far slice s moves, in elements, from one unit to the next along grid axis `axis`."""
    return dict(prim.normalize(s.offset).terms).get(f"b{axis % len(prim.grid)}", 0)


def strided(ops, prim: ParallelPrimitive, buffers: dict) -> bool:
    """Whether some DRAM slice of the kernel steps more than one element per unit."""
    return any(buffers[s.buffer].level == DRAM and step_along(prim, s, -1) > 1
               for op in ops if not isinstance(op, Sync) for s in (*op.reads(), *op.writes()))


def splits_rows(ops, prim: ParallelPrimitive, buffers: dict) -> bool:
    """Whether the emitter runs each row as an unmasked SIMD interior and scalar masked borders
    instead of one masked SIMD loop: where some access is strided (see below), and where a unit
    makes more than MASKED_SINGLE masked DRAM loads, which gcc 12 left scalar in one loop (a
    7x7 involution window, 49 masked loads: 'relevant stmt not supported'; split, 17.9 -> 3.1
    ms at OMP_NUM_THREADS=1, while a 3x3 window ran 1.5x slower split)."""
    return strided(ops, prim, buffers) or _masked_loads(ops, buffers) > MASKED_SINGLE


def merges_rows(ops, prim: ParallelPrimitive, buffers: dict) -> bool:
    """Whether the SIMD loop runs over the grid's last two axes as one (a whole 7x7 plane)
    instead of over the last alone: where a row is shorter than MERGE_BELOW, the row is one
    masked loop (not split), and every DRAM slice steps 0 or 1 element along the last axis and
    a whole row's worth along the one before it (the plane lies contiguously in memory), so
    that every access stays a contiguous vector access over the merged index. gcc 12 ran a
    7-unit row in 4-lane vectors: EfficientNet-B0's 3x3 depthwise conv + SiLU over 1152x7x7
    took 349 us, merged 67 (one thread, one process). A 14-unit row padded to 16 lanes
    (ROW_MULTIPLE in the CPU emitter) ran as fast as merged, 133 against 145 us over 480x14x14."""
    grid = prim.grid
    if len(grid) < 2 or grid[-2] < 2 or grid[-1] >= MERGE_BELOW or splits_rows(ops, prim, buffers):
        return False
    for op in ops:
        if isinstance(op, Sync):
            continue
        for s in (*op.reads(), *op.writes()):
            if buffers[s.buffer].level != DRAM:
                continue
            last = step_along(prim, s, -1)
            if last not in (0, 1) or step_along(prim, s, -2) != last * grid[-1]:
                return False
    return True


def _masked_loads(ops, buffers: dict) -> int:
    return sum(op.src.size for op in ops if isinstance(op, Move) and op.src.is_masked
               and buffers[op.src.buffer].level == DRAM)


def vectorises_across_units(ops, prim: ParallelPrimitive, buffers: dict) -> bool:
    """Whether a kernel (its gOperators, primitive and buffers) takes the across-units form:
    one unit per block, a last grid axis of at least MIN_ROW units, every gOperator small,
    register slices at constant offsets, no Gather (its out-of-range flag is an atomic store,
    which `omp simd` forbids), and every DRAM slice moving 0 to MAX_STRIDE elements from one
    unit to the next. With steps of 0 and 1 only, every access is a (masked) contiguous
    vector access or a broadcast; a larger step is a strided access, which the emitter issues
    only where no mask applies (the interior of a row), because gcc 12.2 at -O3 -march=native
    miscompiled masked gathers (a padded copy whose rows step 20 elements per unit came out
    wrong in rows 2-7; -O2 and -fno-tree-loop-vectorize were right)."""
    if prim.units_per_block != 1 or prim.grid[-1] < MIN_ROW:
        return False
    statements = 0
    for op in ops:
        if isinstance(op, Sync):
            continue
        if isinstance(op, Gather):
            return False
        slices = (*op.reads(), *op.writes())
        largest = max(s.size for s in slices)
        if largest > MAX_ELEMENTS:
            return False
        for s in slices:
            level = buffers[s.buffer].level
            if level == REGISTER and not s.offset.is_const:
                return False
            if level == DRAM and not 0 <= step_along(prim, s, -1) <= MAX_STRIDE:
                return False
        statements += largest
    if statements > MAX_STATEMENTS:
        return False
    # a short contiguous row split for its many masks is mostly scalar border (a 7x7 window
    # over 7 units: 1.3x slower than the per-unit form; a strided 5x5 one over 7 units is still
    # 3.4x faster split than per unit), unless its lanes run over channels
    return (prim.grid[-1] >= MIN_SPLIT_ROW or strided(ops, prim, buffers)
            or _masked_loads(ops, buffers) <= MASKED_SINGLE or channel_lanes(ops, prim, buffers) is not None)


@dataclass(frozen=True)
class Staging:
    """The channel-lane form of a kernel (`channel_lanes`): the SIMD lanes run over grid axis
    `axis` in blocks of CHANNEL_LANES, and each buffer in `spans` is copied per block into a
    local array laid out element-major, lane-minor, so that every lane's access is contiguous.
    spans[buffer] = (lowest, highest) element offset a lane touches over the axes after `axis`
    and the slices' own elements, for the first band of `rows` positions along the axis after
    `axis` (a block copies one band at a time where the whole plane would not fit STAGE_BYTES;
    band t's span lies t * rows * row_steps[buffer] elements further); rests[buffer]: the part
    of its offsets on the channel and outer axes (without constant), where each lane's span
    starts; `written`: the buffers copied out after the band."""
    axis: int
    spans: dict
    written: frozenset
    rows: int
    row_steps: dict
    rests: dict
    pads: dict = field(default_factory=dict)  # buffer -> Padding: staged with its halo


@dataclass(frozen=True)
class Padding:
    """A staged input read through a window's padding, staged as the padded plane: `height`
    rows of `pitch` elements a band, columns `left`.. of the tensor's rows (the whole row and
    the halo, which holds `fill`), the band's first stage row being tensor row
    band * band_rows + top. Every tap then reads the stage without a mask, where border
    positions chose between the stage and a row of fill values per tap
    (`channel_lanes._positions`): forcing RedNet-50's 7x7 involution over 128x28x28 onto the
    interior path ran it 1.37x faster (two threads, an ad-hoc harness)."""
    row_length: int  # the tensor's row (elements)
    plane_rows: int  # the tensor's rows in a plane
    top: int
    left: int
    pitch: int
    height: int
    band_rows: int
    fill: float

    def split(self, x: int) -> tuple[int, int]:
        return split_rows(x, self.row_length)


def split_rows(x: int, row_length: int) -> tuple[int, int]:
    """An offset step as (rows, columns): the nearest whole number of rows, the rest."""
    rows = (x + row_length // 2) // row_length
    return rows, x - rows * row_length


def channel_lanes(ops, prim: ParallelPrimitive, buffers: dict) -> Staging | None:
    """Whether a kernel of the across-units form runs its lanes over channels instead of along
    its rows, and how. A row shorter than SHORT_ROW whose accesses step two elements per unit
    (a stride-2 conv over a 14x14 plane: rows of 7, interior 5) leaves every unit scalar, and a
    short windowed row that is one masked loop often does too (a 5x5 conv over 672x14x14: 3.6
    ms), while neighbouring channels are independent and as many as the vector is wide. Their
    elements lie a plane apart, so each block of channels first copies the spans it reads into
    a local array with the channel innermost (`Staging`), computes, and copies its outputs back.
    One thread, one process (row or merged form -> channel lanes): EfficientNet-B0's 5x5
    stride-2 depthwise conv + SiLU over 672x14x14 600 -> 74 us (onnxruntime's Conv alone 54),
    3x3 over 480x14x14 133 -> 101, 5x5 over 1152x7x7 1091 -> 116, over 240x28x28 844 -> 390;
    3x3 over 58x28x28 76 -> 86 and 232x7x7 14 -> 16 (as good as even); RedNet-50's 7x7
    involutions over 256x14x14, which the row rule leaves per unit (49 masked loads in rows of
    14), 3000 -> 162 us. Where a whole plane does not fit STAGE_BYTES, a block stages one band
    of output rows at a time: EfficientNet-B0's 3x3 stride-2 conv + SiLU over 96x112x112 654 ->
    450 us, 3x3 over 144x56x56 523 -> 452; on such long rows the form is taken only over whole
    blocks (a max pool over 24x112x112 ran 102 us in the row form and 233 with a third of its
    lanes empty; 8 channels 39 -> 79), where one block gains too: RedNet-50's 7x7 involution
    over a group of 16 channels of 56x56 5085 -> 523 us (49 weight planes streamed per row in
    the row form), 16x112x112 3x3 max pool stride 2 96 -> 78, 3x3 conv + SiLU stride 2 114 ->
    75, stride 1 228 -> 219. On long rows a kernel must also read planes that move with the
    channel: SAR-DRN's 1 -> 64 channel 3x3 conv over 256x256 reads one input plane every
    channel shares, and staging only its output cost 32.6 ms against 3.2 in the row form (one thread).
    Taken where: rows are
    strided or masked (a window), the grid has an axis before the plane's two with
    at least half a block of channels, every DRAM buffer whose address moves with the channel
    is read or written only by Moves and in one layout (staged: a block's lanes past the last
    channel then read zeros and write nothing), a staged store writes its span densely and
    unmasked, every write is staged, no buffer is both read and written, and the copies fit
    STAGE_BYTES."""
    grid = prim.grid
    if len(grid) < 3 or not (strided(ops, prim, buffers) or _masked_loads(ops, buffers)):
        return None
    axis = len(grid) - 3
    if grid[axis] < CHANNEL_LANES // 2:
        return None
    if grid[-1] >= SHORT_ROW and grid[axis] % CHANNEL_LANES:
        return None  # a long row vectorises in the row form: lanes on channels only where blocks are whole
    plane = [f"b{i}" for i in range(axis + 1, len(grid))]
    slices = [(op, s, w) for op in ops if not isinstance(op, Sync)
              for s, w in [*((s, False) for s in op.reads()), *((s, True) for s in op.writes())]
              if buffers[s.buffer].level == DRAM]
    # every buffer whose address moves with the channel is staged, so that a block's lanes past
    # the last channel read zeros and write nothing: the SIMD loop always runs whole blocks
    staged = {s.buffer for _, s, _ in slices if step_along(prim, s, axis) != 0}
    written = {s.buffer for _, s, w in slices if w}
    if not written <= staged or reads_what_it_writes(ops, buffers):
        return None
    if grid[-1] >= SHORT_ROW and not any(
            not w and s.buffer in staged and any(step_along(prim, s, a) for a in range(axis + 1, len(grid)))
            for _, s, w in slices):
        return None  # a long row whose planes read only what every channel shares (a conv from one input channel)
    blocks = {f"b{i}" for i in range(len(grid))}
    rests, row_steps = {}, {}
    for op, s, is_write in slices:
        if s.buffer not in staged:
            continue
        off = prim.normalize(s.offset).substitute({"w": Affine(0)})
        rest, step = off.split(set(plane))[1], step_along(prim, s, axis + 1)
        rest = rest - rest.const
        if (not isinstance(op, Move) or is_write and s.is_masked or not off.variables <= blocks
                or rests.setdefault(s.buffer, rest) != rest or row_steps.setdefault(s.buffer, step) != step):
            return None  # one layout per staged buffer: its slices differ only along the plane
    positions = grid[axis + 1]
    for rows in [r for r in range(positions, 0, -1) if positions % r == 0]:  # the largest band that fits
        spans = {}
        for _, s, _ in slices:
            if s.buffer in staged:
                lo, hi = _plane_span(prim, s, plane, rows)
                old = spans.get(s.buffer, (lo, hi))
                spans[s.buffer] = (min(lo, old[0]), max(hi, old[1]))
        pads = {b: p for b in spans if b not in written
                for p in [padding(prim, [(op, s) for op, s, w in slices if s.buffer == b], buffers[b], plane, rows)] if p}
        sizes = {b: pads[b].pitch * pads[b].height if b in pads else hi - lo + 1 for b, (lo, hi) in spans.items()}
        nbytes = sum(n * CHANNEL_LANES * buffers[b].nbytes // buffers[b].size for b, n in sizes.items())
        if nbytes <= STAGE_BYTES:
            break
    else:
        return None
    if rows < min(positions, MIN_BAND):
        return None  # a thin band copies its window's overlap again for every few rows
    for buf in written:  # a staged output is copied back whole: every element of its span written
        if not _dense(np.concatenate([_plane_offsets(prim, s, plane, rows) for _, s, w in slices if w and s.buffer == buf])):
            return None
    return Staging(axis, spans, frozenset(written), rows, row_steps, rests, pads)


def padding(prim: ParallelPrimitive, reads: list, buf, plane: list[str], rows: int) -> Padding | None:
    """How a staged input read through masks stages as its padded plane (`Padding`), or None.
    Each read's offset over the plane axes and its elements split into a tensor row and column
    (a term of a multiple of the row length steps rows, a smaller one columns); taken where,
    for every position of the plane and the first and last channel and outer index, an element
    is inside the mask exactly where its row and column lie inside the tensor's plane, and
    every read fills the same value (zero where none does), which the halo then holds; and
    where it pays: the pointer selects it saves (a channel's border positions x the taps its
    border masks) at least the elements the padded copy places one at a time (every element
    of rows shorter than a 16-element piece, else about one piece a row). ShuffleNet-v2's 3x3
    stride-2 convs over 14x14 planes (13 border positions x 5 taps against 196 elements) ran
    13 -> 15 us padded; RedNet-50's 7x7 involutions over 7x7 planes (48 x 48 against 49)
    56 -> 47 us (results/halos_ab.md)."""
    if len(buf.shape) < 2 or not any(s.is_masked for _, s in reads):
        return None
    width, height = buf.shape[-1], buf.shape[-2]
    fills = {op.fill for op, _ in reads if op.fill is not None}
    if len(fills) > 1 or width < 2:
        return None
    split = partial(split_rows, row_length=width)
    env = _plane_env(prim, plane)
    extent = {n: (rows if j == 0 else prim.grid[int(n[1:])]) - 1 for j, n in enumerate(plane)}
    tops, bottoms, lefts, rights, steps, selects = [], [], [], [], set(), 0
    first = np.all([env[f"b{i}"] == 0 for i in range(len(prim.grid)) if f"b{i}" not in plane], axis=0)
    for _, s in reads:
        inside, rest = prim.normalize(s.offset).substitute({"w": Affine(0)}).split(set(plane))
        if any(c % (width * height) for _, c in rest.terms):
            return None  # the channel and outer axes must step whole planes
        terms = {n: split(c) for n, c in inside.terms}
        (r0, c0), dims = split(rest.const), [split(st) for st in s.strides]
        idx = np.indices(s.shape).reshape(len(s.shape), -1)
        pr, pc = (np.zeros(s.size, np.int64) + sum(i * d[k] for i, d in zip(idx, dims)) for k in (0, 1))
        row = r0 + pr[None, :] + sum(env[n][:, None] * r for n, (r, _) in terms.items())
        col = c0 + pc[None, :] + sum(env[n][:, None] * c for n, (_, c) in terms.items())
        valid = s.valid(env)
        if not np.array_equal(valid, (row >= 0) & (row < height) & (col >= 0) & (col < width)):
            return None
        out = ~valid[first]  # one channel's plane: border positions x the taps a border masks
        selects += int(out.any(axis=1).sum()) * int(out.any(axis=0).sum())
        tops.append(r0 + int(pr.min()) + sum(min(0, r * extent[n]) for n, (r, _) in terms.items()))
        bottoms.append(r0 + int(pr.max()) + sum(max(0, r * extent[n]) for n, (r, _) in terms.items()))
        lefts.append(c0 + int(pc.min()) + sum(min(0, c * extent[n]) for n, (_, c) in terms.items()))
        rights.append(c0 + int(pc.max()) + sum(max(0, c * extent[n]) for n, (_, c) in terms.items()))
        steps.add(terms.get(plane[0], (0, 0)))
    if len(steps) != 1 or next(iter(steps))[1]:
        return None  # a band moves whole rows, alike for every read
    if selects < height * (width if width < CHANNEL_LANES else 1):
        return None  # fewer border selects than the padded copy places elements one by one (rows under 16)
    top, left = min(tops), min(0, *lefts)  # a stage row holds the tensor's whole row: copied as it lies
    return Padding(width, height, top, left, max(width - 1, *rights) - left + 1, max(bottoms) - top + 1,
                   rows * next(iter(steps))[0], float(fills.pop()) if fills else 0.0)


def _plane_env(prim: ParallelPrimitive, plane: list[str]) -> dict:
    """Index arrays (`ParallelPrimitive.env`'s names) of every position of the plane at the
    first and last index of each other grid axis (whose planes a read must step whole: the
    masks of one stand for all)."""
    axes = [np.arange(n) if f"b{i}" in plane else np.unique([0, n - 1]) for i, n in enumerate(prim.grid)]
    coords = [g.ravel().astype(np.int64) for g in np.meshgrid(*axes, indexing="ij")]
    b = sum(c * prod(prim.grid[i + 1:]) for i, c in enumerate(coords))
    return {f"b{i}": c for i, c in enumerate(coords)} | {"w": np.zeros_like(b), "b": b, "u": b * prim.units_per_block}


def reads_what_it_writes(ops, buffers: dict) -> bool:
    """Whether some DRAM buffer is both read and written by the gOperators `ops`: a unit run
    twice, or a buffer copied out after its units, would then see another unit's result."""
    ops = [op for op in ops if not isinstance(op, Sync)]
    written = {s.buffer for op in ops for s in op.writes() if buffers[s.buffer].level == DRAM}
    return any(s.buffer in written for op in ops for s in op.reads())


def _plane_span(prim: ParallelPrimitive, s, plane: list[str], rows: int) -> tuple[int, int]:
    """The lowest and highest element offset slice s reaches over the plane axes (the other
    axes at 0, the first plane axis below `rows`): an affine offset's extremes, at the ends."""
    inside, rest = prim.normalize(s.offset).substitute({"w": Affine(0)}).split(set(plane))
    extent = {n: (rows if j == 0 else prim.grid[int(n[1:])]) - 1 for j, n in enumerate(plane)}
    lo = rest.const + int(min(s.pattern)) + sum(min(0, c * extent[n]) for n, c in inside.terms)
    hi = rest.const + int(max(s.pattern)) + sum(max(0, c * extent[n]) for n, c in inside.terms)
    return lo, hi


def _plane_offsets(prim: ParallelPrimitive, s, plane: list[str], rows: int):
    """Every element offset slice s reaches over the plane axes (the other axes at 0, the
    first plane axis below `rows`)."""
    inside, rest = prim.normalize(s.offset).substitute({"w": Affine(0)}).split(set(plane))
    grids = np.meshgrid(*[np.arange(rows if j == 0 else prim.grid[int(n[1:])]) for j, n in enumerate(plane)], indexing="ij")
    coords = {n: g.ravel() for n, g in zip(plane, grids)}
    base = rest.const + sum(c * coords[n] for n, c in inside.terms)
    return (np.asarray(base).reshape(-1, 1) + np.asarray(s.pattern).reshape(1, -1)).ravel()


def _dense(offsets) -> bool:
    """Whether the offsets cover every element between their lowest and highest."""
    return len(np.unique(offsets)) == int(offsets.max() - offsets.min()) + 1


def form(ops, prim: ParallelPrimitive, buffers: dict) -> str:
    """How a SIMD-lane target's emitter runs a kernel, in a few words (`gir run --profile`)."""
    if not vectorises_across_units(ops, prim, buffers):
        return "per unit"
    staging = channel_lanes(ops, prim, buffers)
    if staging:
        bands = prim.grid[staging.axis + 1] // staging.rows
        padded = ", padded" if staging.pads else ""
        return f"channels x{CHANNEL_LANES}" + (f", {bands} bands" if bands > 1 else "") + padded
    if merges_rows(ops, prim, buffers):
        return "plane"
    return "row, split" if splits_rows(ops, prim, buffers) else "row"
