"""SIMD across units: the CPU form of a kernel whose units each compute only a few elements.

A CPU unit is one iteration of the OpenMP loop and its lanes are the iterations of each
gOperator's element loop. When a unit computes one output of a window reduction (a depthwise
conv, a pooling window, an involution tap set) those loops run 1 to 25 iterations: too short
to vectorise, and the unit's index arithmetic and masks run once per output. Neighbouring units
along the grid's last axis compute neighbouring outputs, so the vector dimension is there:
this form runs the grid's outer axes as the OpenMP loop and its last axis as an `omp simd`
loop, every gOperator unrolled at emit time into straight-line code with constant register
indices (which the C compiler keeps in vector registers), and the part of each DRAM address
that does not depend on the last axis hoisted out of it as a 64-bit offset, so that a slice
that steps by one element per unit becomes a (masked) contiguous vector load or store instead
of a gather. EfficientNet-B0's depthwise 3x3 conv + SiLU of (1, 144, 56, 56), 3.6 MB: 8.81 ms
(0.4 GB/s) per unit, 0.67 ms (5.4 GB/s) across units, one thread (results/across_units.md,
scripts/across_units_ab.py).

The form changes only how units are enumerated and which loops are unrolled; the units'
gOperators, slices and masks are the kernel's own, so the interpreter and the race check
speak for it exactly as for the per-unit form.
"""
from __future__ import annotations

from dataclasses import replace
from math import prod

import numpy as np

from gir.ir import DRAM, REGISTER
from gir.ir.across_units import channel_lanes, merges_rows, reads_what_it_writes, splits_rows
from gir.ir.across_units import vectorises_across_units as takes_form
from gir.ir.affine import Affine, var
from gir.ir.expr import Call, Input
from gir.ir.gops import Elementwise, Reduce
from gir.ir.streams import buffer_users

from .channel_lanes import ChannelLanes
from .cstyle import Elem, Idx, add_c, affine_c, block, guarded, and_c
from .kernels import Kernel

# A row longer than this and not a multiple of it runs padded to one, its extra lanes masked
# off every DRAM access that moves along the row: gcc left a 14- or 28-unit row's remainder
# scalar (a ShuffleNet 28x28 depthwise conv 155 us, padded 49 us). A shorter row (7x7) stays
# as it is: padded to 8 it ran 2x slower.
ROW_MULTIPLE = 8
# The interior of a split row runs in chunks of this many units (a 64-byte vector of floats).
INTERIOR_CHUNK = 16


def _floordiv(x: str, d: int) -> str:
    """C expression of floor(x / d) for a positive constant d (C's `/` truncates toward 0)."""
    return x if d == 1 else f"(({x}) >= 0 ? ({x}) / {d} : -((-({x}) + {d - 1}) / {d}))"


def constant(k: int) -> Idx:
    """Element k as a compile-time index (one 'lane' holding it): addresses, register slots
    and masks along the slice's own dimensions are then decided at emit time."""
    return Idx(str(k), np.array([k]), np.array([True]))


# A kernel with fewer rows than this runs each row as pieces of at least PIECE_ELEMENTS lanes
# (a whole-tensor elementwise kernel is one row: it ran on one thread, 2x a chunked form).
MIN_ROWS, PIECE_ELEMENTS = 64, 1024


def row_pieces(rows: int, row_length: int) -> int:
    """Pieces each row is cut into, so that the OpenMP loop has about MIN_ROWS iterations."""
    if rows >= MIN_ROWS:
        return 1
    return max(1, min(-(-MIN_ROWS // rows), row_length // PIECE_ELEMENTS))


def vectorises_across_units(k: Kernel) -> bool:
    """Whether kernel `k` takes this form (the rule is the IR's, shared with the time model)."""
    return takes_form([op for _, op in k.ops], k.prim, k.buffers)


class AcrossUnits(ChannelLanes):
    """Mixin for a dialect whose lanes are loop iterations of one thread (before LoopedLanes in
    the bases), active for one kernel while `self.across` is set by `kernel_source`. The
    dialect gives its `simd_pragma`, its `scalar_barrier` (a statement that keeps the
    compiler from vectorising a loop) and its team hooks (`team_pragma`, `forks_team`); the
    C prelude may define GIR_TILE16 and gir_tile16 for the channel-lane form's copies."""
    scalar_barrier = ""
    across = False
    merged = False  # the SIMD loop runs over the last two grid axes as one (merges_rows)
    staging = None  # the lanes run over channels, planes staged (gir/ir/across_units.py channel_lanes)
    allow_across = True  # False: every kernel in the per-unit form (calibration times that form)
    pad_halos = True  # False: staged planes without their padding (an A/B baseline, channel_lanes.Padding)

    @property
    def scoped_registers(self) -> bool:
        return not self.across  # scalars here, declared once: straight-line code needs no scopes

    def kernel_source(self, k: Kernel) -> str:
        self.across = self.allow_across and vectorises_across_units(k)
        if not self.across:
            return super().kernel_source(k)
        self.offsets: dict[tuple, str] = {}
        self.pointers: dict[tuple, str] = {}  # staged loads chosen per output position (_staged_load)
        self.fill_rows: dict[tuple, str] = {}
        self.row_conditions: dict[str, str] = {}
        self.bounds: dict[str, str] = {}   # C expression -> "lo" or "hi" (exclusive)
        ops = [op for _, op in k.ops]
        self.staging = channel_lanes(ops, k.prim, k.buffers)
        if self.staging and not self.pad_halos:
            self.staging = replace(self.staging, pads={})
        self.fused = self._fused_products(k, ops) if self.fuse_products else {}
        self.merged = not self.staging and merges_rows(ops, k.prim, k.buffers)
        n = self._row_length(k)
        # a merged row is not padded: padded to 16 lanes a 7x7 plane's 3x3 conv ran 1.5x slower
        self.padded_row = 0 if self.merged or self.staging or self._split(k) or n % ROW_MULTIPLE == 0 or n < ROW_MULTIPLE else \
            -(-n // ROW_MULTIPLE) * ROW_MULTIPLE
        try:
            body = self.kernel_body(k)
            head, _ = super().kernel_frame(k)
            return "\n".join(self.across_frame(k, head, body)) + "\n"
        finally:
            self.across, self.staging = False, None

    # -- the loop nest --------------------------------------------------------------------
    @property
    def _last(self) -> str:
        """The SIMD loop's index: the last grid axis, `q` over the last two merged, or the
        channel axis."""
        if self.staging:
            return f"b{self.staging.axis}"
        return "q" if self.merged else f"b{len(self.k.prim.grid) - 1}"

    @property
    def _along(self) -> set[str]:
        """The grid axes the SIMD loop runs over."""
        d = len(self.k.prim.grid)
        return {f"b{d - 2}", f"b{d - 1}"} if self.merged else {self._last}

    def _row_length(self, k: Kernel) -> int:
        grid = k.prim.grid
        if self.staging:
            return grid[self.staging.axis]
        return grid[-1] * grid[-2] if self.merged else grid[-1]

    def across_frame(self, k: Kernel, head: list[str], body: list[str]) -> list[str]:
        """Outer grid axes as the OpenMP loop (`r`), their coordinates, the hoisted offsets and
        row conditions, then the last axis as the SIMD loop. Where every access is contiguous
        and the unit's masked loads are few, that is one masked loop over the row (measured
        fastest: splitting off the borders cost a depthwise conv 1.5x). Otherwise (`_split`)
        the masks are kept out of the SIMD loop: it runs the interior [lo, hi), where every
        mask holds, with GIR_EDGE(c) defined as 1, and the borders before and after it run
        masked and scalar (an empty asm with a memory clobber keeps gcc from vectorising
        them); a row where a row condition fails is all border."""
        if self.staging:
            return self._channel_frame(k, head, body)
        grid, b = k.prim.grid, self._last
        n, outer = self._row_length(k), grid[:-2] if self.merged else grid[:-1]
        coords = []
        for i, size in enumerate(outer):
            inner = prod(outer[i + 1:])
            expr = "r" if inner == 1 else f"r / {inner}"
            coords.append(f"const int b{i} = {0 if size == 1 else expr if i == 0 else f'({expr}) % {size}'};")
        nest = coords + [f"const long {name} = {text};" for text, name in self.offsets.values()]
        nest += [f"const int {name} = ({text}) ? {n} : 0;" for text, name in self.row_conditions.items()]
        if self.merged:  # the two axes' coordinates per lane, for the masks (addresses use q)
            d = len(grid)
            body = [f"const int b{d - 2} = q / {grid[-1]}, b{d - 1} = q % {grid[-1]};", *body]
        simd = [self.simd_pragma, *block(f"for (int {b} = lo; {b} < hi; ++{b}) {{", body)]
        rows, pieces = prod(outer), 1
        if not self._split(k):
            end = self.padded_row or n
            pieces = row_pieces(rows, end) if self.forks_team(k) else 1
            if pieces > 1:  # too few rows for the threads: each takes pieces of a row
                share = -(-end // pieces)
                step = -(-share // ROW_MULTIPLE) * ROW_MULTIPLE  # whole SIMD blocks per piece
                nest = [f"const int r = t / {pieces}, piece = t % {pieces};", *nest,
                        f"const int lo = piece * {step} < {end} ? piece * {step} : {end};",
                        f"const int hi = lo + {step} < {end} ? lo + {step} : {end};"]
            else:
                nest += [f"const int lo = 0, hi = {end};"]
            nest += ["#define GIR_EDGE(c) (c)", *simd, "#undef GIR_EDGE"]
        else:
            inside = " && ".join(f"{name} == {n}" for name in self.row_conditions.values()) or "1"
            nest += [f"int lo = 0, hi = {n};"]
            nest += [f"{{ const int e = {e}; if ({'e > lo' if side == 'lo' else 'e < hi'}) {side} = e; }}"
                     for e, side in self.bounds.items()]
            nest += [f"if (!({inside})) lo = hi = {n};", f"if (lo > {n}) lo = {n};", "if (hi < lo) hi = lo;"]
            edge = [f"{self.scalar_barrier}  /* keeps this border loop scalar */", *body]
            nest += ["#define GIR_EDGE(c) (c)", *block(f"for (int {b} = 0; {b} < lo; ++{b}) {{", edge),
                     *block(f"for (int {b} = hi; {b} < {n}; ++{b}) {{", edge), "#undef GIR_EDGE",
                     "#define GIR_EDGE(c) 1", *self._interior_loops(k, body), "#undef GIR_EDGE"]
        loop = f"  for (int r = 0; r < {rows}; ++r) {{" if pieces == 1 else f"  for (int t = 0; t < {rows * pieces}; ++t) {{"
        return [*head, self.team_pragma(k), *block(loop, ["  " + ln for ln in nest], "  }"), "}"]

    def _interior_loops(self, k: Kernel, body: list[str]) -> list[str]:
        """The unmasked interior [lo, hi) of a split row, run so that at most two units a row
        fall to gcc's scalar remainder. gcc 12 peels one scalar iteration off a vector loop
        whose strided loads read past the last unit ("peeling for gaps"), so a loop of 16m + 1
        units runs as m 64-byte vectors and one scalar unit; a second pass runs the last
        INTERIOR_CHUNK + 1 units again where the first left some over. Those units recompute
        outputs of the first pass and store the same values, which is safe because no unit
        reads a DRAM buffer the kernel writes (gir/ir/across_units.py reads_what_it_writes). EfficientNet-B0's 3x3
        stride-2 depthwise conv + SiLU over 96x112x112 left 7 of a row's 55 interior units
        scalar, and a scalar unit's SiLU cost 8 vector lanes': 835 -> 700 us, one thread."""
        b, c = self._last, INTERIOR_CHUNK
        # a short row stays one loop: run as two passes of 9 units in 32-byte vectors, a 14-unit
        # row of a 3x3 stride-2 conv over 240x28x28 took 215 us against 177 as one loop
        if reads_what_it_writes([op for _, op in k.ops], k.buffers) or self._row_length(k) < 2 * (c + 1):
            return [self.simd_pragma, *block(f"for (int {b} = lo; {b} < hi; ++{b}) {{", body)]
        head = [f"const int whole = hi - lo > {c + 1} ? (hi - lo - 1) / {c} * {c} + 1 : hi - lo;",
                "if (pass == 1 && whole == hi - lo) break;",
                f"const int s = pass == 0 ? lo : hi - {c + 1}, e = pass == 0 ? lo + whole : hi;",
                self.simd_pragma, *block(f"for (int {b} = s; {b} < e; ++{b}) {{", body)]
        return block("for (int pass = 0; pass < 2; ++pass) {", head)

    def op_Move(self, op) -> list[str]:
        """In a padded row every DRAM load is masked: a select with zero, which gcc vectorises.
        A staged load (channel lanes) takes its fill from a row of fill values instead."""
        if self.across and op.fill is None and self._moves_along_row(op.src) and self.level(op.dst) == REGISTER:
            op = replace(op, fill=0)
        if op.fill is None and op.src.is_masked and not op.dst.is_masked and self.level(op.dst) == REGISTER:
            op = replace(op, fill=0)  # as LoopedLanes.op_Move does, so that a staged load knows it
        self._fill = None if op.fill is None else self.storage_literal(op.fill, self.dtype(op.src))
        return super().op_Move(op)

    def _moves_along_row(self, s) -> bool:
        """A DRAM slice of a padded row whose address moves along it: one that does not (a
        weight, a bias) is the same in-bounds address for every lane and stays unmasked (a
        select on it left a ShuffleNet depthwise conv's loop scalar: 155 -> 764 us)."""
        if not (self.across and self.padded_row and self.level(s) == DRAM):
            return False
        return bool(self._along & self.k.prim.normalize(s.offset).substitute({"w": Affine(0)}).variables)

    def _split(self, k: Kernel) -> bool:
        """Interior and borders, or one masked SIMD loop (gir/ir/across_units.py splits_rows)."""
        return splits_rows([op for _, op in k.ops], k.prim, k.buffers)

    def across_prologue(self, k: Kernel) -> list[str]:
        if self.staging:  # the unit's index from its block coordinates
            grid = k.prim.grid
            index = " + ".join(f"{prod(grid[i + 1:])}*b{i}" if prod(grid[i + 1:]) > 1 else f"b{i}"
                               for i in range(len(grid)) if grid[i] > 1) or "0"
            return ["const int w = 0;", f"const int b = {index};", "const int u = b;"]
        return ["const int w = 0;", f"const int b = r * {self._row_length(k)} + {self._last};", "const int u = b;"]

    # -- addresses ------------------------------------------------------------------------
    def _row_offset(self, s) -> tuple[str, str]:
        """(hoisted offset variable, the rest of the address) of DRAM slice s: the offset split
        into its part along the SIMD loop's axes (stays in the loop) and the rest. Over merged
        axes that part is one step per q (gir/ir/across_units.py merges_rows)."""
        off = self.k.prim.normalize(s.offset).substitute({"w": Affine(0)})
        inside, rest = off.split(self._along)
        if self.merged:
            step = dict(inside.terms).get(f"b{len(self.k.prim.grid) - 1}", 0)
            inside = Affine.of(0) if step == 0 else var("q") * step
        key = (s.buffer, rest)
        if key not in self.offsets:
            self.offsets[key] = (affine_c(rest), f"o{len(self.offsets)}")
        return self.offsets[key][1], affine_c(inside)

    def _row_ref(self, s, i: Idx) -> str:
        if self.staging and s.buffer in self.staging.spans:
            return self._staged_ref(s, i)
        name, inside = self._row_offset(s)
        element = str(int(s.pattern[min(int(i.lanes[0]), s.size - 1)]))  # every index is a constant here
        return f"{self.names[s.buffer]}[{add_c(add_c(name, inside), element)}]"

    def _register(self, s, i: Idx) -> str:
        """Register element i of s as its own scalar variable (`r_name_5`): every index is a
        compile-time constant here, and scalars need none of the per-lane "simd array" lowering
        gcc gives an array declared inside an `omp simd` loop."""
        a = s.offset.const + int(s.pattern[min(int(i.lanes[0]), s.size - 1)])
        return f"{self.names[s.buffer]}_{min(max(a, 0), self.k.buffers[s.buffer].size - 1)}"

    def load(self, s, i: Idx, e: Elem):
        if self.staging and s.buffer in self.staging.spans:
            return self._staged_load(s, i)
        if self.across and self.level(s) == DRAM:
            return self._row_ref(s, i), self.mask(s, i)
        if self.across and self.level(s) == REGISTER:
            return self._register(s, i), self.mask(s, i)
        return super().load(s, i, e)

    def store(self, s, i: Idx, op, e: Elem | None = None):
        out = super().store(s, i, op, e)
        if out is None or not self.across or self.level(s) not in (DRAM, REGISTER):
            return out
        return (self._row_ref(s, i) if self.level(s) == DRAM else self._register(s, i)), out[1]

    def declarations(self, k: Kernel) -> list[str]:
        if not self.across:
            return super().declarations(k)
        return [f"{self.types[b.dtype]} " + ", ".join(f"{self.names[n]}_{a}" for a in range(b.size)) + ";"
                for n, b in k.buffers.items() if b.level == REGISTER]

    def mask(self, s, i: Idx) -> list[str]:
        """The slice's mask with each bound in block coordinates, as one branch-free condition
        inside GIR_EDGE (compiled out in the interior run of the row, see across_frame). A
        condition on the last grid axis also narrows the interior [lo, hi); one that does not
        depend on it is computed once per row, as a bound on the loop index (`b < m`, m = the
        row length where it holds, else 0: gcc 12 does not vectorise a select on a
        loop-invariant condition)."""
        if not self.across:
            return super().mask(s, i)
        conditions = self._conditions(s, i)
        if conditions is None:
            return ["false"]
        inside, row = conditions
        if self._moves_along_row(s):  # the lanes past a padded row's end touch no memory
            inside.append(f"{self._last} < {self._row_length(self.k)}")
        if row:  # all of them as one bound on the SIMD index: fewer masks for gcc to combine
            text = " && ".join(f"({c})" for c in row)
            if text not in self.row_conditions:
                self.row_conditions[text] = f"m{len(self.row_conditions)}"
            inside.insert(0, f"{self._last} < {self.row_conditions[text]}")
        # `&`, not `&&`: one branch-free condition, no control flow for the vectoriser to undo
        return [f"GIR_EDGE({' & '.join(f'({c})' for c in inside)})"] if inside else []

    def _conditions(self, s, i: Idx) -> tuple[list[str], list[str]] | None:
        """Element i's mask conditions that depend on the SIMD axes (per lane) and those that
        do not (per row), each bound in block coordinates; None where one fails for every unit."""
        inside, row = [], []
        for bounds, op in ((s.limits, "<"), (s.starts, ">=")):
            for d, bound in enumerate(bounds):
                if bound is None:
                    continue
                value = int(self.dim_index(s, d, i).lanes[0])
                norm = self.k.prim.normalize(bound).substitute({"w": Affine(0)})
                known = self._decided(value, op, norm)
                if known is False:
                    return None
                if known:
                    continue
                if self._along & norm.variables:
                    inside.append(f"{value} {op} {affine_c(norm)}")
                    if not self.merged and not self.staging:  # neither form is split
                        self._interior_bound(value, op, norm)
                else:
                    row.append(f"{value} {op} {affine_c(norm)}")
        return inside, row

    def _decided(self, value: int, op: str, norm: Affine) -> bool | None:
        """Whether `value op norm` holds for every unit of the grid (True), for none (False),
        or depends on the unit (None), from each block coordinate's range: a 3x3 window's
        centre column needs no test against the row's ends, and gcc cannot see that b3 < 112
        always holds in a 112-unit row (a test and a mask per tap otherwise)."""
        grid, last = self.k.prim.grid, len(self.k.prim.grid) - 1
        axis = {f"b{i}": i for i in range(len(grid))}  # the block coordinates (ParallelPrimitive.normalize)
        low = high = norm.const
        for name, a in norm.terms:
            if name not in axis:
                return None
            i = axis[name]
            top = (self.padded_row or grid[i]) - 1 if i == last else grid[i] - 1
            low, high = low + min(0, a * top), high + max(0, a * top)
        if op == "<":
            return True if value < low else False if value >= high else None
        return True if value >= high else False if value < low else None

    def _interior_bound(self, value: int, op: str, norm: Affine) -> None:
        """Record where `value op norm` holds along the last axis b (norm = rest + a*b) as a
        first (lo) or last-plus-one (hi) index of b, computed per row in C."""
        along, rest = norm.split({self._last})
        (_, a), = along.terms
        x = f"{value} - ({affine_c(rest)})"          # the condition is a*b > x (op <) or a*b <= x (op >=)
        q = _floordiv(x, abs(a))
        if op == "<":
            e, side = (f"{q} + 1", "lo") if a > 0 else (f"-({q})", "hi")
        else:
            e, side = (f"{q} + 1", "hi") if a > 0 else (f"-({q})", "lo")
        self.bounds[e] = side

    # -- unrolled elements ----------------------------------------------------------------
    def elements(self, op, n: int):
        if not self.across:
            yield from super().elements(op, n)
            return
        for k in range(n):
            yield Elem(constant(k))

    def wrap(self, e: Elem, lines: list[str]) -> list[str]:
        if not self.across:
            return super().wrap(e, lines)
        return block("{", lines) if len(lines) > 1 else lines

    # independent accumulators per output of an unrolled group: a lane's sum over a window's
    # taps was one chain of dependent adds, 49 x the add latency per position for RedNet-50's
    # 7x7 involution, which bound its kernels (a lane is a unit here: no shuffle tree)
    PARTIALS = 8
    seed_partials = True  # False: each partial starts at the identity (an A/B baseline)

    fuse_products = True  # False: a sum's products computed first, then summed (an A/B baseline)

    def _fused_products(self, k: Kernel, ops) -> dict:
        """id(sum) -> the product of two float32 operands that it alone reads, where the sum
        can compute it itself: partial = GIR_FMA(a, b, partial), tap after tap. Computing all
        of a window's products first and summing them after held 49 products live at once
        (spilled) and, with each weight a broadcast of its own, cost RedNet-50's 7x7
        involution more than its arithmetic; streamed, each weight's broadcast folds into its
        fused multiply-add (AVX-512 embedded broadcast). Where no op between the two writes
        what the product reads, reading its operands at the sum reads the same values."""
        writers, readers = buffer_users(ops)
        where = {id(op): i for i, op in enumerate(ops)}
        fused = {}
        for r in ops:
            if not isinstance(r, Reduce) or r.op != "sum" or k.buffers[r.src.buffer].level != REGISTER:
                continue
            (e, *more) = writers.get(r.src.buffer, [None])
            if more or not isinstance(e, Elementwise) or readers.get(r.src.buffer) != [r] or not self._same_elements(e.out, r.src):
                continue
            if not (isinstance(e.expr, Call) and e.expr.op == "mul" and all(isinstance(a, Input) for a in e.expr.args)):
                continue
            slices = (*e.inputs, e.out, r.src, r.dst)
            if e.compute_dtype != "float32" or any(k.buffers[s.buffer].dtype != "float32" for s in slices):
                continue
            if any(s.is_masked or k.buffers[s.buffer].level != REGISTER for s in (*e.inputs, e.out, r.src)):
                continue  # a DRAM operand may carry a padded row's lane mask the sum would not test
            read = {s.buffer for s in e.inputs}
            between = ops[where[id(e)] + 1:where[id(r)]]
            if any(w.buffer in read for op in between for w in op.writes()):
                continue
            fused[id(r)] = e
        return fused

    def op_Elementwise(self, op) -> list[str]:
        if getattr(self, "across", False) and any(e is op for e in self.fused.values()):
            return []  # computed by the sum that reads it (_fused_products)
        return super().op_Elementwise(op)

    def _fused_term(self, e: Elementwise, element: int, partial: str | None) -> str:
        """Element `element` of product e added to `partial` (None: the product alone)."""
        a, b = (self.load(e.inputs[arg.index], constant(element), None)[0] for arg in e.expr.args)
        return f"{a} * {b}" if partial is None else f"GIR_FMA({a}, {b}, {partial})"

    def op_Reduce(self, op: Reduce) -> list[str]:
        """Each output's group unrolled: element g joins partial g % PARTIALS (at least two
        elements each), and the partials combine pairwise, so that the chain of dependent
        operations is a few steps long instead of the group's length. A partial starts as its
        first element, not as the identity combined with it: the compiler keeps `0.0f + x`
        (it is not x where x is -0.0), one add per partial and output, 8 of the 49 of a 7x7
        involution's; and numpy's sum, the reference, starts from the first element too."""
        if not self.across:
            return super().op_Reduce(op)
        acc, ident, term = self._reduce_parts(op)
        parts = max(1, min(self.PARTIALS, op.group // 2))
        names = [f"acc{j}" for j in range(parts)] if parts > 1 else ["acc"]
        out = []
        for k in range(op.dst.size):
            dst = self.store(op.dst, constant(k), op)
            if dst is None:
                continue
            seeded = self.seed_partials
            lines = [] if seeded else [f"{self.ctype(acc)} " + ", ".join(f"{n} = {ident}" for n in names) + ";"]
            product = self.fused.get(id(op))
            for g in range(op.group):
                n = names[g % parts]
                if product is not None:
                    first = seeded and g < parts
                    term_ = self._fused_term(product, k * op.group + g, None if first else n)
                    lines.append(f"{self.ctype(acc)} {n} = {term_};" if first else f"{n} = {term_};")
                    continue
                x, ok = self.load(op.src, constant(k * op.group + g), None)
                x = term(x) if not ok else f"{and_c(ok)} ? {term(x)} : {ident}"
                if seeded and g < parts:
                    lines.append(f"{self.ctype(acc)} {n} = {x};")
                else:
                    lines.append(f"{n} = {self.combine(op.op, n, f'({x})')};")
            lines += self.pairwise(op.op, names)
            if names[0] != "acc":
                lines.append(f"const {self.ctype(acc)} acc = {names[0]};")
            out += block("{", lines + guarded(dst[1], [f"{dst[0]} = {self.to_storage('acc', acc, self.dtype(op.dst))};"]))
        return out
