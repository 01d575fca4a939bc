"""One C-like emitter for every backend: a Kernel becomes its parallel structure (block
coordinates b0.. unravelled from the linear block, unit in block w, lane) followed by each
gOperator in program order. Dialects override names and a few strategies (types, shuffles,
barriers, prologue), after tinygrad's renderer/cstyle.py: CUDA and HIP are thin subclasses,
the CPU overrides the register model.

GPU registers. A register buffer is a per-lane local array. Element `a` lives in lane
`(a // vec) % lanes` at local index `(a // (vec*lanes))*vec + a % vec`, `vec` being that of the
buffer's first non-uniform writer (GOp.lane_of_output); a writer whose slice is not the plain
0-based one defines the placement by table instead. A buffer whose writers are all `uniform`
is replicated: every lane holds element `a` at index `a`. Every gOperator is unrolled at emit
time, one block per (chunk j, vector position v) with k = j*vec*lanes + v + vec*lane, so local
indices are constants and the arrays stay in registers; `vec` only decides which lane owns
which elements (no vector types are emitted). A `uniform` gOperator runs every element in
every lane; its stores to shared or DRAM come from lane 0.

Who holds what is computed for all lanes at emit time. A read of an element another lane holds
(legal only after a Sync(UNIT) in the IR) is a warp shuffle from the owner lane, one per local
index the lanes need, hoisted out of any per-lane guard so the whole warp executes it; hence
Sync(UNIT) on registers emits nothing. A replicated buffer read at lane-dependent indices is a
short select chain on the lane (or a run-time index). A cooperative Reduce (`uniform`) is a
per-lane partial over the elements the lane holds, then an xor-shuffle butterfly over the
smallest aligned lane segment that holds a group; outputs whose groups sit in different
segments share one butterfly, and a shuffle from each segment replicates its result.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from math import prod

import numpy as np

from gir.ir import BLOCK, DRAM, LANE, REGISTER, SHARED, UNIT
from gir.ir.affine import Affine, var
from gir.ir.dtypes import HALF, accumulator, compute
from gir.ir.expr import Call, Const, Input, evaluate, postorder
from gir.ir.gops import Elementwise, Gather, Move, Reduce, Sync, reduce_identity
from gir.ir.slices import Slice
from gir.ir.streams import (COLUMN_GROUP, buffer_users, column_reduction, column_step, loaded_as_product, row_streams,
                             runs_stream)
from gir.ir.vector_access import vector_width

from .kernels import GATHER_FLAG, EmitError, Kernel
from .loop_fusion import fuse_element_loops
from .loop_split import split_row_loops

MAX_RUNS = 16  # longest per-lane select chain (or shuffles per element) before other means
COMPARE = {"eq": "==", "lt": "<", "gt": ">", "le": "<=", "ge": ">="}
INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
FLOAT_FN = {"exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh", "erf": "erf", "floor": "floor",
            "ceil": "ceil", "sin": "sin", "cos": "cos", "abs": "fabs", "pow": "pow", "mod": "fmod"}


# -- integer index expressions -----------------------------------------------------------------
def affine_c(expr: Affine) -> str:
    parts = [n if c == 1 else f"-{n}" if c == -1 else f"{c}*{n}" for n, c in expr.terms]
    text = " + ".join(parts + ([str(expr.const)] if expr.const or not parts else []))
    return text.replace("+ -", "- ")


def add_c(a: str, b: str) -> str:
    if a == "0":
        return b
    if b == "0":
        return a
    return f"{a} - {b[1:]}" if b.startswith("-") else f"{a} + {b}"


def linear_c(c: int, m: int, var: str) -> str:
    term = "" if m == 0 else var if m == 1 else f"-{var}" if m == -1 else f"{m}*{var}"
    if not term:
        return str(c)
    return term if c == 0 else add_c(str(c), term)


def lane_runs(values: np.ndarray, consider: np.ndarray) -> list[tuple[int, int]]:
    """(end lane, value) runs over the lanes that matter; the others extend a neighbour."""
    runs: list[list[int]] = []
    for lane in np.flatnonzero(consider):
        v = int(values[lane])
        if runs and runs[-1][1] == v:
            runs[-1][0] = lane + 1
        else:
            runs.append([lane + 1, v])
    return [(e, v) for e, v in runs]


@dataclass
class Idx:
    """An element index: its C expression and, on GPUs, its compile-time value in every lane
    (`valid` marks the lanes that have the element). Tables decide register placement."""
    expr: str
    lanes: np.ndarray | None = None
    valid: np.ndarray | None = None

    def __post_init__(self):
        if self.lanes is not None:
            if self.valid is None:
                self.valid = np.ones(len(self.lanes), bool)
            form = lane_form(self.lanes, self.valid)
            if form is not None:
                self.expr = form

    def _map(self, fmt: str, fn) -> "Idx":
        return Idx(fmt.format(paren(self.expr)), None if self.lanes is None else fn(self.lanes), self.valid)

    def div(self, n: int) -> "Idx":
        return self if n == 1 else self._map(f"{{}} / {n}", lambda v: v // n)

    def mod(self, n: int) -> "Idx":
        return Idx("0", None if self.lanes is None else 0 * self.lanes, self.valid) if n == 1 else \
            self._map(f"{{}} % {n}", lambda v: v % n)

    def lin(self, mul: int, add: int) -> "Idx":
        return self._map(f"{{}}*{mul} + {add}", lambda v: v * mul + add)


def lane_affine(values: np.ndarray, valid: np.ndarray) -> tuple[int, int] | None:
    """(c, m) with value = c + m*lane on every valid lane, if there are such integers."""
    idx = np.flatnonzero(valid)
    if not len(idx):
        return 0, 0
    v = values[idx]
    if (v == v[0]).all():
        return int(v[0]), 0
    m = (int(v[-1]) - int(v[0])) // int(idx[-1] - idx[0])
    c = int(v[0]) - m * int(idx[0])
    return (c, m) if (v == c + m * idx).all() else None


def lane_form(values: np.ndarray, valid: np.ndarray) -> str | None:
    fit = lane_affine(values, valid)
    return None if fit is None else linear_c(fit[0], fit[1], "lane")


def paren(e: str) -> str:
    return e if re.fullmatch(r"-?\w+", e) else f"({e})"


def and_c(conds: list[str]) -> str:
    conds = list(dict.fromkeys(conds))  # a Move's source and destination masks often coincide
    if len(conds) == 1:
        return conds[0]
    return " && ".join(f"({c})" if " " in c and not c.startswith("(") else c for c in conds) or "true"


class _NotStreamable(Exception):
    """A reduction `CStyle._reduce_runs` cannot stream: it is emitted over stored arrays."""


@dataclass
class Elem:
    """The output element one emitted block computes; `pre` holds statements every lane runs
    before the per-lane guard (shuffles)."""
    k: Idx
    guard: str | None = None
    pre: list[str] = field(default_factory=list)
    temps: int = 0
    loop: int | None = None  # CPU: k is the variable of a loop with this trip count
    independent: bool = False  # ... whose iterations touch disjoint elements (see LoopedLanes)

    def tmp(self) -> str:
        self.temps += 1
        return f"t{self.temps - 1}"


@dataclass
class RegLayout:
    """Where each address of a register buffer lives: owner lane (-1: every lane) and local index."""
    owner: np.ndarray
    slot: np.ndarray
    vec: int | None  # set when owner/slot follow the closed formula (usable at run time)

    @property
    def replicated(self) -> bool:
        return bool((self.owner == -1).all())

    @property
    def nslots(self) -> int:
        return int(self.slot.max()) + 1


def guarded(conds: list[str], lines: list[str]) -> list[str]:
    if not conds:
        return lines
    if len(lines) == 1:
        return [f"if ({and_c(conds)}) {lines[0]}"]
    return [f"if ({and_c(conds)}) {{", *["  " + ln for ln in lines], "}"]


def block(header: str, lines: list[str], footer: str = "}") -> list[str]:
    return [header, *["  " + ln for ln in lines], footer]


def _statement_prefix(a: list[str], b: list[str]) -> int:
    """Length of the longest common prefix of two bodies that ends between statements at brace
    depth 0 (the split point of an if/else over two versions of one body)."""
    depth, best = 0, 0
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            break
        if x.lstrip().startswith(("//", "#")):
            continue  # a comment or pragma belongs to the statement after it
        depth += x.count("{") - x.count("}")
        if depth == 0:
            best = i + 1
    return best


def _row_slice(s: Slice, group: int) -> Slice | None:
    """Output k's group of s (elements [k * group, (k + 1) * group)) as a slice of its own whose
    offset is affine in a C variable `k`: where the group is s's trailing dimensions, one
    leading dimension indexes the outputs (the others have extent 1) and no bound falls on it;
    else None."""
    inner, d = 1, len(s.shape)
    while d > 0 and inner < group:
        d -= 1
        inner *= s.shape[d]
    lead = [i for i in range(d) if s.shape[i] > 1]
    if inner != group or len(lead) != 1:
        return None
    if any(b is not None for b in (*s.limits[:d], *s.starts[:d])):
        return None
    return Slice(s.buffer, s.offset + var("k") * s.strides[lead[0]], s.shape[d:], s.strides[d:], s.limits[d:], s.starts[d:])


def _column(s: Slice, group: int, g: int) -> Slice:
    """The elements g of slice s's runs of `group` (`streams.columns` holds): a 1-D slice, one
    step per run."""
    runs = s.pattern.reshape(-1, group)
    return Slice(s.buffer, s.offset + int(runs[0, g]), (runs.shape[0],), (int(runs[1, g] - runs[0, g]),))


def _column_at(s: Slice, group: int) -> Slice:
    """The elements g of slice s's runs for a C variable g (`streams.column_step` holds)."""
    runs = s.pattern.reshape(-1, group)
    return Slice(s.buffer, s.offset + var("g") * column_step(s, group), (runs.shape[0],), (int(runs[1, 0] - runs[0, 0]),))


def register_segments(k: Kernel) -> list[tuple[range, list[str]]]:
    """The kernel's gOperators cut where no register buffer is live across the cut, each span
    with the register buffers it uses. Declaring arrays only in their span bounds what a C
    compiler's register allocator sees at once: 150 concat pieces declared together took gcc
    -O2 10.8 s, each in its own block 1.3 s."""
    ops = k.ops
    span: dict[str, list[int]] = {}
    for i, (_, op) in enumerate(ops):
        for sl in (*op.reads(), *op.writes(), *([op.slice] if isinstance(op, Sync) and op.slice is not None else [])):
            if k.buffers[sl.buffer].level == REGISTER:
                span.setdefault(sl.buffer, [i, i])[1] = i
    open_until, start, out, members = -1, 0, [], []
    firsts = sorted(span.items(), key=lambda kv: kv[1][0])
    j = 0
    for i in range(len(ops)):
        while j < len(firsts) and firsts[j][1][0] == i:
            members.append(firsts[j][0])
            open_until = max(open_until, firsts[j][1][1])
            j += 1
        if i >= open_until:  # no register live past op i: a cut (always true at the last op)
            out.append((range(start, i + 1), members))
            start, members = i + 1, []
    return out or [(range(0), [])]


def _elementwise_independent(op) -> bool:
    """Whether a gOperator's element loop may run its iterations in any order or together: it
    writes a buffer it does not read (so no iteration reads another's result) and is no Gather
    (whose out-of-range report is a store to one shared flag)."""
    if isinstance(op, (Gather, Reduce, Sync)):
        return False
    written = {s.buffer for s in op.writes()}
    return not written & {s.buffer for s in op.reads()}


def _declared_name(declaration: str) -> str:
    return declaration.rsplit("[", 1)[0].split()[-1]


ROUND = {"float16": "GIR_RH", "bfloat16": "GIR_RB"}  # prelude macros: a float rounded to that precision


class CStyle:
    """The shared emitter; dialect subclasses set the class attributes and hooks below."""
    kernel_prefix = 'extern "C" __global__ void'
    restrict = "__restrict__"
    shared_prefix = "__shared__ "
    distributed_registers = True  # per-lane register arrays (GPU) vs per-unit address arrays (CPU)
    types = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16", "float64": "double", "int64": "long long",
             "int32": "int", "int8": "signed char", "uint8": "unsigned char", "bool": "bool"}
    shuffle_types = {"float32": "float", "float64": "double", "int64": "long long"}  # others go as int/float

    def __init__(self, target):
        self.target = target
        self.L = target.lanes_per_unit

    # -- dialect hooks ----------------------------------------------------------------------
    def prelude(self) -> str:
        return ""

    def launch_bounds(self, k: Kernel) -> str:
        """A kernel whose runs reductions stream (`_streamed_products`) is held to the target's
        `streamed_registers` a thread, as resident blocks per SM (CUDA's second argument):
        uncapped, ptxas hoists every channel's loads (136 registers for 24 channels, 25%
        occupancy); capped, it streams them (31, no spill), the occupancy the time model
        assumes for it (perf._residency: what streams). A target without the figure (HIP:
        its second argument is waves per EU, and the AMDGPU backend spilled such a kernel at
        128 VGPRs) gets the block size alone."""
        blocks, cap = 0, self.target.timing.streamed_registers
        if cap and self.distributed_registers and self._streamed_products()[0]:
            regs = (self.target.register_file_bytes or 256 * 1024) // 4
            blocks = max(1, min(self.target.timing.max_blocks_per_processor, regs // (k.block_threads * cap)))
        return f"__launch_bounds__({k.block_threads}{f', {blocks}' if blocks else ''}) "

    def barrier(self) -> str:
        return "__syncthreads();"

    def sync_unit(self) -> str:
        return "__syncwarp();"

    def shfl(self, value: str, src: str) -> str:
        return f"GIR_SHFL({value}, {src})"

    def shfl_xor(self, value: str, mask: int) -> str:
        return f"GIR_SHFL_XOR({value}, {mask})"

    def half_to_float(self, x: str) -> str:
        return f"__half2float({x})"

    def float_to_half(self, x: str) -> str:
        return f"__float2half({x})"

    def bf16_to_float(self, x: str) -> str:
        return f"__bfloat162float({x})"

    def float_to_bf16(self, x: str) -> str:
        return f"__float2bfloat16({x})"  # round to nearest even, NaN kept

    def half_bits(self, x: str, dtype: str) -> str:
        """The 16 bits of a stored fp16/bf16 value, as an unsigned short."""
        return f"__half_as_ushort({x})" if dtype == "float16" else f"__bfloat16_as_ushort({x})"

    def half_from_bits(self, u: str, dtype: str) -> str:
        return f"__ushort_as_half({u})" if dtype == "float16" else f"__ushort_as_bfloat16({u})"

    def widen(self, x: str, dtype: str) -> str:
        """A stored fp16/bf16 value as the float it is computed in; other types as they are."""
        return self.half_to_float(x) if dtype == "float16" else self.bf16_to_float(x) if dtype == "bfloat16" else x

    def narrow(self, x: str, dtype: str) -> str:
        """A float rounded once into fp16/bf16 storage."""
        return self.float_to_half(x) if dtype == "float16" else self.float_to_bf16(x)

    # -- kernel --------------------------------------------------------------------------------
    def emit(self, kernel: Kernel) -> str:
        return self.prelude() + "\n" + self.kernel_source(kernel)

    def kernel_source(self, k: Kernel) -> str:
        body = self.kernel_body(k)
        head, tail = self.kernel_frame(k)
        pad = "  " * len(tail)  # one level per enclosing brace
        return "\n".join([*head, *[pad + ln for ln in body], *tail]) + "\n"

    def kernel_body(self, k: Kernel) -> list[str]:
        """What one unit runs: the prologue, the register declarations, each gOperator."""
        self.k = k
        self.names = self._names(k)
        self.layouts = self._layouts(k) if self.distributed_registers else {}
        segments = register_segments(k)
        declared = self.declarations(k)
        if len(segments) == 1 or not self.scoped_registers:
            body, scoped = self.prologue(k) + declared, {}
        else:  # register arrays declared in the span of gOperators that uses them
            regs = {self.names[n] for n, b in k.buffers.items() if b.level == REGISTER}
            body = self.prologue(k) + [d for d in declared if _declared_name(d) not in regs]
            by_name = {_declared_name(d): d for d in declared}
            scoped = {seg[0]: [by_name[self.names[n]] for n in names] for seg, names in segments if names}
            ends = {seg[-1] for seg, names in segments if names}
        last = None
        for i, (node, op) in enumerate(k.ops):
            if i in scoped:
                body += ["{", *scoped[i]]
            lines = self.emit_op(op)
            if not (isinstance(op, Sync) and lines and lines == last):  # back-to-back barriers: the first covers both
                # names come from the model: no NUL (a compiler reads the source as a C string), no newline,
                # no backslash (a // comment ending in one swallows the next line)
                summary = re.sub(r"[^\x20-\x5b\x5d-\x7e]", "_", str(op))
                body += [f"// #{node} {summary[:150]}{'...' if len(summary) > 150 else ''}", *lines]
                last = lines if isinstance(op, Sync) else None
            if scoped and i in ends:
                body.append("}")
        return body

    scoped_registers = True  # register arrays declared in the span of gOperators that uses them

    gather_flag_type = "int*"  # the flag parameter of a kernel that gathers; None: the dialect has another way

    def kernel_frame(self, k: Kernel) -> tuple[list[str], list[str]]:
        params = [self.param(b, k) for b in k.params]
        if k.gathers and self.gather_flag_type:
            params.append(f"{self.gather_flag_type} {GATHER_FLAG}")
        params = ", ".join(params)
        return [f"{self.kernel_prefix} {self.launch_bounds(k)}{k.name}({params}) {{"], ["}"]

    def param(self, buf, k: Kernel) -> str:
        const = "" if k.is_written(buf.name) else "const "
        return f"{const}{self.types[buf.dtype]}* {self.restrict} {self.names[buf.name]}"

    def prologue(self, k: Kernel) -> list[str]:
        upb = k.prim.units_per_block
        lines = [f"const int lane = threadIdx.x % {self.L};", f"const int w = threadIdx.x / {self.L};",
                 "const int b = blockIdx.x;", "const int u = b + w;" if upb == 1 else f"const int u = b * {upb} + w;"]
        return lines + self.block_coords(k)

    def block_coords(self, k: Kernel) -> list[str]:
        grid, out = k.prim.grid, []
        for i, n in enumerate(grid):
            inner = prod(grid[i + 1:])
            expr = "b" if inner == 1 else f"b / {inner}"
            out.append(f"const int b{i} = {0 if n == 1 else expr if i == 0 else f'({expr}) % {n}'};")
        return out

    def declarations(self, k: Kernel) -> list[str]:
        out = []
        for name, buf in k.buffers.items():
            if buf.level == SHARED:
                out.append(f"{self.shared_prefix}{self.types[buf.dtype]} {self.names[name]}[{buf.size}];")
            elif buf.level == REGISTER:
                size = self.layouts[name].nslots if self.distributed_registers else buf.size
                out.append(f"{self.types[buf.dtype]} {self.names[name]}[{size}];")
        return out

    @staticmethod
    def _names(k: Kernel) -> dict[str, str]:
        prefix = {DRAM: "g_", SHARED: "s_", REGISTER: "r_"}
        names, used = {}, set()
        for name, buf in sorted(k.buffers.items()):
            base = re.sub(r"_+", "_", prefix[buf.level] + re.sub(r"\W", "_", name)).rstrip("_")
            ident, i = base, 1
            while ident in used:
                ident, i = f"{base}_{i}", i + 1
            used.add(ident)
            names[name] = ident
        return names

    # -- register placement (GPU) ----------------------------------------------------------
    def _layouts(self, k: Kernel) -> dict[str, RegLayout]:
        first: dict[str, object] = {}  # register buffer -> its first writer that is not uniform
        for _, op in k.ops:
            if not isinstance(op, Sync) and not op.uniform:
                first.setdefault(op.writes()[0].buffer, op)
        return {name: self._layout_of(buf, first.get(name)) for name, buf in k.buffers.items() if buf.level == REGISTER}

    def _layout_of(self, buf, writer) -> RegLayout:
        a = np.arange(buf.size)
        if writer is None:
            return RegLayout(np.full(buf.size, -1), a, None)
        L, vec, s = self.L, writer.vec, writer.writes()[0]
        if not s.offset.is_const:
            raise EmitError(f"register slice {s} has a unit-dependent offset; GPU registers need constant indices")
        owner, slot = (a // vec) % L, (a // (vec * L)) * vec + a % vec
        k = np.arange(s.size)
        addr = s.offset.const + s.pattern
        ok = (addr >= 0) & (addr < buf.size) & s.possibly_valid  # a ReduceMax's scalar, then Abs (fuzzing)
        lane_k, slot_k = writer.lane_of_output(k, L), (k // (vec * L)) * vec + k % vec
        if (owner[addr[ok]] == lane_k[ok]).all() and (slot[addr[ok]] == slot_k[ok]).all():
            return RegLayout(owner, slot, vec)
        return self._table_layout(buf, addr[ok], lane_k[ok], slot_k[ok])

    def _table_layout(self, buf, addr, lanes, slots) -> RegLayout:
        owner, slot = np.full(buf.size, -2), np.full(buf.size, -1)
        for a, ln, s in zip(addr, lanes, slots):
            if owner[a] not in (-2, ln) or slot[a] not in (-1, s):
                raise EmitError(f"register buffer {buf.name!r}: one element written from two lanes by one gOperator")
            owner[a], slot[a] = ln, s
        used = {ln: int(slot[owner == ln].max()) + 1 for ln in set(owner[owner >= 0].tolist())}
        for a in np.flatnonzero(owner == -2):
            ln = int(a % self.L)
            owner[a], slot[a] = ln, used.get(ln, 0)
            used[ln] = slot[a] + 1
        return RegLayout(owner, slot, None)

    # -- elements ----------------------------------------------------------------------------
    def elements(self, op, n: int):
        """GPU: one block per unrolled position. Uniform: every lane runs every element."""
        L, lanes = self.L, np.arange(self.L)
        if op.uniform:
            for k in range(n):
                yield Elem(Idx(str(k), np.full(L, k), np.ones(L, bool)))
            return
        vec = op.vec
        for j in range(-(-n // (vec * L))):
            for v in range(vec):
                ks = j * vec * L + v + vec * lanes
                valid = ks < n
                if valid.any():
                    yield Elem(Idx("", ks, valid), None if valid.all() else f"lane < {int(valid.sum())}")

    def for_elements(self, op, n: int, body) -> list[str]:
        out = []
        for e in self.elements(op, n):
            lines = body(e)
            if lines:
                out += self.wrap(e, lines)
        return out

    def wrap(self, e: Elem, lines: list[str]) -> list[str]:
        return block("{", [*e.pre, *lines]) if e.pre or e.temps or len(lines) > 1 else lines

    # -- slices ------------------------------------------------------------------------------
    @staticmethod
    def unravel(s: Slice, k: str) -> str:
        """Offset of element k from the slice's base, dimensions merged where contiguous."""
        dims = [(n, st) for n, st in zip(s.shape, s.strides) if n > 1]
        merged: list[list[int]] = []
        for n, st in dims:
            if merged and merged[-1][1] == st * n:
                merged[-1] = [merged[-1][0] * n, st]
            else:
                merged.append([n, st])
        text = "0"
        for i, (n, st) in enumerate(merged):
            if st == 0:
                continue
            inner = prod(m for m, _ in merged[i + 1:])
            idx = k if inner == 1 else f"{paren(k)} / {inner}"
            idx = paren(idx if i == 0 else f"{paren(idx)} % {n}")
            text = add_c(text, idx if st == 1 else f"-{idx}" if st == -1 else f"{st}*{idx}")
        return text

    def address(self, s: Slice, e: Idx) -> str:
        """C expression of element e's address; affine in the lane where it can be."""
        if e.lanes is not None:
            fit = lane_affine(s.pattern[np.clip(e.lanes, 0, s.size - 1)], e.valid)
            if fit is not None:
                return add_c(affine_c(s.offset + fit[0]), linear_c(0, fit[1], "lane"))
        return add_c(affine_c(s.offset), self.unravel(s, e.expr))

    def dim_index(self, s: Slice, d: int, e: Idx) -> Idx:
        if s.shape[d] == 1:
            return Idx("0", None if e.lanes is None else 0 * e.lanes, e.valid)
        i = e.div(prod(s.shape[d + 1:]))
        return i if d == 0 else i.mod(s.shape[d])

    def mask(self, s: Slice, e: Idx) -> list[str]:
        conds = []
        for bounds, op in ((s.limits, "<"), (s.starts, ">=")):
            for d, bound in enumerate(bounds):
                if bound is None or bound.is_const and (bound.const >= s.shape[d] if op == "<" else bound.const <= 0):
                    continue  # holds for every index of the dimension
                i = self.dim_index(s, d, e)
                known = i.lanes if i.lanes is not None else np.array([int(i.expr)]) if i.expr.isdigit() else None
                if known is not None and bound.is_const:  # decided at emit time
                    vals = known[i.valid] if i.lanes is not None else known
                    holds = vals < bound.const if op == "<" else vals >= bound.const
                    if holds.all():
                        continue
                    if not holds.any():
                        return ["false"]
                conds.append(f"{i.expr} {op} {affine_c(bound)}")
        return conds

    # -- memory access -----------------------------------------------------------------------
    def level(self, s: Slice) -> str:
        return self.k.buffers[s.buffer].level

    def dtype(self, s: Slice) -> str:
        return self.k.buffers[s.buffer].dtype

    def load(self, s: Slice, i: Idx, e: Elem) -> tuple[str, list[str]]:
        """(C expression of the element in its storage type, conditions for it to be valid)."""
        if self.level(s) == REGISTER and self.distributed_registers:
            return self.reg_load(s, i, e), self.mask(s, i)
        return f"{self.names[s.buffer]}[{self.address(s, i)}]", self.mask(s, i)

    def store(self, s: Slice, i: Idx, op, e: Elem | None = None) -> tuple[str, list[str]] | None:
        """(lvalue, conditions) for writing element i of s, or None when no lane holds it.
        The conditions include the element's lane guard: values are computed by every lane."""
        conds = ([e.guard] if e is not None and e.guard else []) + self.mask(s, i)
        if "false" in conds:
            return None
        if self.level(s) == REGISTER and self.distributed_registers:
            target = self.reg_store(s, i, op)
            return None if target is None else (target[0], conds + target[1])
        if op.uniform and self.distributed_registers:
            conds.append("lane == 0")  # every lane has the value; one stores it
        return f"{self.names[s.buffer]}[{self.address(s, i)}]", conds

    def _reg_addresses(self, s: Slice, i: Idx) -> tuple[np.ndarray, np.ndarray]:
        if not s.offset.is_const:
            raise EmitError(f"register slice {s} has a unit-dependent offset; GPU registers need constant indices")
        k = np.clip(i.lanes, 0, s.size - 1)
        a = s.offset.const + s.pattern[k]
        size = self.k.buffers[s.buffer].size
        consider = i.valid & (a >= 0) & (a < size)  # out of range only where masked off
        if s.is_masked:
            consider &= s.possibly_valid[k]
        return np.where(consider, a, 0), consider

    def reg_load(self, s: Slice, i: Idx, e: Elem) -> str:
        name, lay = self.names[s.buffer], self.layouts[s.buffer]
        a, consider = self._reg_addresses(s, i)
        if not consider.any():
            return f"{name}[0]"
        owner, slot = lay.owner[a], lay.slot[a]
        addr = paren(add_c(str(s.offset.const), self.unravel(s, i.expr)))  # the address at run time
        if lay.replicated:  # slot == address; beyond a short chain, index at run time (local memory)
            return self.by_lane(slot, consider, lambda v: f"{name}[{v}]", lambda x: f"{name}[{x}]") or f"{name}[{addr}]"
        lanes = np.arange(self.L)
        slots = sorted(set(slot[consider].tolist()))
        if (owner[consider] == lanes[consider]).all() and len(slots) == 1:
            return f"{name}[{slots[0]}]"
        # Another lane holds it: one shuffle per local index the lanes need, each lane keeps its own.
        src = lane_form(owner, consider)
        if src is None and lay.vec is not None:
            src = f"({addr} / {lay.vec}) % {self.L}"
        src = src or self.by_lane(owner, consider, str, None)
        if src is None or len(slots) > MAX_RUNS:
            raise EmitError(f"cross-lane read of {s} is too irregular to shuffle")
        temps = {}
        for sv in slots:
            temps[sv] = e.tmp()
            e.pre.append(f"const {self.types[self.dtype(s)]} {temps[sv]} = "
                         f"{self.shuffle_typed(f'{name}[{sv}]', src, self.dtype(s))};")
        pick = self.by_lane(slot, consider, lambda v: temps[v], None) if len(lane_runs(slot, consider)) <= 4 else None
        if pick is None and lay.vec is not None:
            local = f"({addr} / {lay.vec * self.L}) * {lay.vec} + {addr} % {lay.vec}"
            pick = temps[slots[-1]]
            for sv in reversed(slots[:-1]):
                pick = f"({local} == {sv} ? {temps[sv]} : {pick})"
        pick = pick or self.by_lane(slot, consider, lambda v: temps[v], None)
        if pick is None:
            raise EmitError(f"cross-lane read of {s} is too irregular to shuffle")
        return pick

    def reg_store(self, s: Slice, i: Idx, op):
        name, lay = self.names[s.buffer], self.layouts[s.buffer]
        a, consider = self._reg_addresses(s, i)
        if not consider.any():
            return None
        owner, slot = lay.owner[a], lay.slot[a]
        if op.uniform:
            first = int(np.argmax(consider))
            cond = [] if owner[first] == -1 else [f"lane == {owner[first]}"]
            return f"{name}[{slot[first]}]", cond
        lanes = np.arange(self.L)
        if (owner[consider] == lanes[consider]).all() and len(set(slot[consider].tolist())) == 1:
            return f"{name}[{slot[consider][0]}]", []
        raise EmitError(f"{op.kind} writes register elements of {s} that other lanes hold")

    def by_lane(self, values, consider, render, dynamic) -> str | None:
        runs = lane_runs(values, consider)
        if len(runs) == 1:
            return render(runs[0][1])
        if len(runs) <= MAX_RUNS:
            text = render(runs[-1][1])
            for end, v in reversed(runs[:-1]):
                text = f"(lane < {end} ? {render(v)} : {text})"
            return text
        form = lane_form(values, consider)
        return dynamic(form) if dynamic and form is not None else None

    def lane_in(self, m: np.ndarray) -> str:
        on = np.flatnonzero(m)
        lo, hi = int(on[0]), int(on[-1]) + 1
        if len(on) == hi - lo:
            return and_c(([f"lane >= {lo}"] if lo else []) + ([f"lane < {hi}"] if hi < self.L else []))
        return f"((0x{sum(1 << int(b) for b in on):x}ull >> lane) & 1)"

    def shuffle_typed(self, value: str, src: str, dtype: str, xor: bool = False) -> str:
        """A shuffle in a type the hardware moves: fp16/bf16 as float, bool and bytes as int."""
        via = self.shuffle_types.get(dtype, "float" if dtype in HALF else "int")
        x = self.widen(value, dtype) if dtype in HALF else value if via == self.types[dtype] else f"({via}){value}"
        moved = self.shfl_xor(x, src) if xor else self.shfl(x, src)
        if dtype in HALF:
            return self.narrow(moved, dtype)
        return moved if via == self.types[dtype] else f"({self.types[dtype]}){moved}"

    # -- values and expressions --------------------------------------------------------------
    def ctype(self, dtype: str) -> str:
        """C type of a value in computation: fp16 and bf16 are computed (and held) in float."""
        return "float" if dtype in HALF else self.types[dtype]

    def to_value(self, x: str, dtype: str) -> str:
        return self.widen(x, dtype)

    def convert(self, x: str, src: str, dst: str) -> str:
        """Value of dtype src as a value of dtype dst (numpy astype)."""
        if src == dst or (src in HALF and dst == "float32"):
            return x
        if dst in HALF:  # held in float, rounded to the half type's precision
            return f"{ROUND[dst]}({x if src in ('float32', *HALF) else f'(float)({x})'})"
        return f"({self.ctype(dst)})({x})"

    def to_storage(self, x: str, src: str, dst: str) -> str:
        if dst in HALF:
            return self.narrow(x if src in ("float32", *HALF) else f"(float)({x})", dst)
        return self.convert(x, src, dst)

    def literal(self, value, dtype: str) -> str:
        if dtype == "bool":
            return "true" if value else "false"
        v = np.asarray(value).astype(dtype).item()
        if dtype in ("float32", "float16", "float64"):
            suffix = "D" if dtype == "float64" else "F"
            if np.isnan(v):
                return f"GIR_NAN_{suffix}"
            if np.isinf(v):
                return f"{'-' if v < 0 else ''}GIR_INF_{suffix}"
            return repr(float(v)) if dtype == "float64" else f"{np.float32(v)!s}f"
        if dtype in ("int64", "int32") and v == np.iinfo(dtype).min:
            return f"({v + 1}{'LL' if dtype == 'int64' else ''} - 1)"  # -2^63 is not a C literal
        return f"{v}LL" if dtype == "int64" else str(v) if dtype == "int32" else f"({self.types[dtype]}){v}"

    def storage_literal(self, value, dtype: str) -> str:
        lit = self.literal(value, compute(dtype))
        return self.narrow(lit, dtype) if dtype in HALF else lit

    @staticmethod
    def node_dtype(node: Call, args: list, cdt: str) -> str:
        """The numpy dtype the interpreter gets for this node: evaluate it on tiny arrays."""
        dummies = [np.asarray(a.value, dt) if isinstance(a, Const) else np.ones(1, dt) for a, dt in args]
        probe = Call(node.op, tuple(Input(i) for i in range(len(args))), node.dtype)
        return np.asarray(evaluate(probe, dummies, cdt)).dtype.name

    def render_expr(self, expr, inputs: list[tuple[str, str]], cdt: str, e: Elem):
        """SSA lines for an expression tree; returns (lines, result, its dtype)."""
        lines, memo = [], {}
        for node in postorder(expr):  # operands first, no recursion (chains can be thousands deep)
            if node in memo:
                continue  # an equal sub-tree elsewhere: one SSA value
            if isinstance(node, Input):
                x, dt = inputs[node.index]
                out = (self.to_value(x, dt), compute(dt))
            elif isinstance(node, Const):
                dt = "bool" if node.dtype == "bool" else cdt
                out = (self.literal(node.value, dt), dt)
            else:
                args = [memo[a] for a in node.args]
                dt = self.node_dtype(node, [(a, np.dtype(d)) for a, (_, d) in zip(node.args, args)], cdt)
                t = e.tmp()
                lines.append(f"const {self.ctype(dt)} {t} = {self.render_call(node, args, dt)};")
                out = (t, dt)
            memo[node] = out
        x, dt = memo[expr]
        return lines, x, dt

    def render_call(self, node: Call, args: list[tuple[str, str]], dt: str) -> str:
        op, xs, dts = node.op, [a for a, _ in args], [d for _, d in args]
        if op in COMPARE:
            common = np.result_type(*dts).name
            return f"{self.convert(xs[0], dts[0], common)} {COMPARE[op]} {self.convert(xs[1], dts[1], common)}"
        if op in ("and", "or"):
            return f"{xs[0]} {'&&' if op == 'and' else '||'} {xs[1]}"
        if op == "not":
            return f"!{xs[0]}"
        if op == "isnan":
            return f"{xs[0]} != {xs[0]}"
        if op == "cast":
            return self.convert(xs[0], dts[0], dt)
        half = dt in HALF
        work = compute(dt)
        if op == "where":
            return f"{xs[0]} ? {self.convert(xs[1], dts[1], dt)} : {self.convert(xs[2], dts[2], dt)}"
        a = [self.convert(x, d, work) for x, d in zip(xs, dts)]
        text = self.arith(op, a, work)
        return f"{ROUND[dt]}({text})" if half else text

    def arith(self, op: str, a: list[str], dt: str) -> str:
        is_float = dt in ("float32", "float64")
        f = "f" if dt == "float32" else ""
        one, zero = self.literal(1, dt), self.literal(0, dt)
        neg = f"-{a[0]}" if re.fullmatch(r"\w+", a[0]) else f"-({a[0]})"
        if not is_float and op in ("div", "mod"):  # numpy gives 0 where C would trap
            if dt.startswith("int"):  # MIN / -1 and MIN % -1 trap too (x86 idiv): numpy wraps, gives 0
                return (f"({a[1]} == -1 ? {neg} : {a[1]} != 0 ? {a[0]} / {a[1]} : {zero})" if op == "div" else
                        f"({a[1]} != 0 && {a[1]} != -1 ? {a[0]} % {a[1]} : {zero})")
            return f"({a[1]} != 0 ? {a[0]} {'/' if op == 'div' else '%'} {a[1]} : {zero})"
        if op in INFIX:
            return f"{a[0]} {INFIX[op]} {a[1]}"
        if op in ("max", "min"):
            return f"GIR_{op.upper()}({a[0]}, {a[1]})"
        if op == "neg":
            return neg
        if op == "relu":
            return f"GIR_MAX({a[0]}, {zero})"
        if not is_float and op in ("abs", "pow"):
            return f"({a[0]} < 0 ? {neg} : {a[0]})" if op == "abs" else f"({self.ctype(dt)})gir_ipow({a[0]}, {a[1]})"
        if not is_float:
            raise EmitError(f"elementwise {op} on {dt}")
        special = {"rsqrt": f"{one} / {self.math_fn('sqrt', dt)}({a[0]})", "recip": f"{one} / {a[0]}",
                   "sigmoid": f"{one} / ({one} + {self.math_fn('exp', dt)}({neg}))"}
        if op in special:
            return special[op]
        return f"{self.math_fn(op, dt)}({', '.join(a)})"

    def math_fn(self, op: str, dt: str) -> str:
        """The C function computing `op` on `dt` (float32 or float64): the C library's by default."""
        return FLOAT_FN[op] + ("f" if dt == "float32" else "")

    # -- gOperators --------------------------------------------------------------------------
    def emit_op(self, op) -> list[str]:
        if self.distributed_registers and id(op) in self._streamed_products()[1]:
            return []  # computed inside the reduction that reads it (_reduce_runs)
        return getattr(self, f"op_{op.kind}")(op)

    # -- a lane's runs reduced as the products arrive (GPU) ------------------------------------
    def _streamed_products(self) -> tuple[set, set]:
        """(ids of the lane-own Reduces with runs of outputs (`vec` > 1) that compute their
        source where they add it; ids of the register Moves and Elementwise ops they compute
        so). A lowered 1x1 conv's product, and the register copies between it and the sum, then
        never exist as arrays: each input channel's run of pixels is multiplied and added to the
        lane's accumulators as it arrives, so ptxas can hold a few channels at a time. Written
        out as arrays, the same kernel held 124 registers at 24 channels (ptxas, sm_90) and
        could not be held to 64 without spilling; streamed, a hand-written one fits 64 registers
        at 232 channels."""
        if getattr(self, "_streamed_for", None) is self.k:
            return self._streamed
        self._streamed_for, self._streamed, self._sunk, self._computed = self.k, (set(), set()), {}, {}
        ops = [op for _, op in self.k.ops]
        writers, readers = buffer_users(ops)
        for r in ops:
            if not (isinstance(r, Reduce) and not r.uniform and r.vec > 1 and self.level(r.src) == REGISTER):
                continue
            chain: list = []
            if not self._chain(r.src.buffer, r, writers, readers, chain):
                chain = []
            loads = self._sunk_loads(r, chain, writers, readers)
            if not loads and not any(isinstance(o, Elementwise) for o in chain):
                continue
            self._streamed[1].update(id(o) for o in (*chain, *loads))  # tried with them unemitted
            self._streamed[0].add(id(r))
            self._sunk[id(r)] = loads
            computed = {o.writes()[0].buffer: (o, self._written_at(o)) for o in chain}
            self._computed |= computed
            try:
                self._reduce_runs(r, dry=True)
            except _NotStreamable:
                self._streamed[0].discard(id(r))
                self._streamed[1].difference_update(id(o) for o in (*chain, *loads))
                del self._sunk[id(r)]
                for b in computed:
                    del self._computed[b]
        return self._streamed

    def _written_at(self, op) -> np.ndarray:
        """Per address of op's register result, the element of its written slice that holds
        it (-1: none; masked-off elements are not written)."""
        w = op.writes()[0]
        size = self.k.buffers[w.buffer].size
        where, written = np.full(size, -1), w.offset.const + w.pattern
        keep = (written >= 0) & (written < size) & (w.possibly_valid if w.is_masked else True)
        where[written[keep]] = np.flatnonzero(keep)
        return where

    def _sunk_loads(self, r: Reduce, chain: list, writers, readers) -> list:
        """The loads from DRAM into the chain's operands that `_reduce_runs` issues where the
        group element they hold is added (row g of the load for element g): each is read by the
        chain alone, its register array row-major with one row per group element, and a row is
        whole rounds of the lanes' runs. Loaded all at the top instead, ptxas keeps every
        channel's run in registers whatever the chain does."""
        inside = {id(o) for o in (*chain, r)}
        rows = r.dst.size
        ops = [op for _, op in self.k.ops]
        at = {id(op): i for i, op in enumerate(ops)}
        out = []
        for o in (*chain, r):
            for x in (o.inputs if isinstance(o, Elementwise) else (o.src,)):
                (m, *more) = writers.get(x.buffer, [None])
                if (more or not isinstance(m, Move) or self.level(m.src) != DRAM or m.uniform
                        or any(id(u) not in inside for u in readers.get(x.buffer, [])) or m in out):
                    continue
                d = m.dst
                if (len(d.shape) == 2 and d.shape == (r.group, rows) and d.strides == (rows, 1) and d.offset.is_const
                        and d.offset.const == 0 and rows % (m.vec * self.L) == 0 and not d.is_masked
                        and (not m.src.limits or m.src.limits[0] is None or m.src.limits[0].is_const and m.src.limits[0].const >= r.group)
                        and (not m.src.starts or m.src.starts[0] is None)
                        and not any(w.buffer == m.src.buffer for op in ops[at[id(m)] + 1:at[id(r)]]
                                    if not isinstance(op, Sync) for w in op.writes())):  # still the same values
                    out.append(m)
        return out

    @staticmethod
    def _row_of(m: Move, g: int) -> Move:
        """Row g of a load `_sunk_loads` chose, as a Move of its own; where it is masked, the
        lanes past the edge take zeros (its array has no other writer: those elements were
        never defined), so ptxas need not keep an undefined value alive per element (a guarded
        load spilled at 64 registers, a filled one did not)."""
        def row(x: Slice) -> Slice:
            tail = lambda b: b[1:] if b else ()  # noqa: E731
            return Slice(x.buffer, x.offset + g * x.strides[0], x.shape[1:], x.strides[1:], tail(x.limits), tail(x.starts))
        return replace(m, src=row(m.src), dst=row(m.dst), fill=0 if m.fill is None and m.src.unbounded_where_still().is_masked else m.fill)

    def _chain(self, buffer: str, reader, writers, readers, chain: list) -> bool:
        """Whether register `buffer` is computed by register copies and elementwise ops that
        only `reader` reads, down to arrays written once (then appended to `chain`, producers
        first; nothing is appended where it is not)."""
        (op, *more) = writers.get(buffer, [None])
        if more or op is None or readers.get(buffer) != [reader] or self.k.buffers[buffer].level != REGISTER:
            return False
        if isinstance(op, Move) and self.level(op.src) == REGISTER and not op.uniform:
            sources = [op.src]
        elif isinstance(op, Elementwise) and not op.uniform and all(self.level(s) == REGISTER for s in op.inputs):
            sources = list(op.inputs)
        else:
            return False
        found: list = []
        for s in sources:  # each source computed in turn, or an array with one writer (a leaf)
            if not self._chain(s.buffer, op, writers, readers, found) and len(writers.get(s.buffer, [])) != 1:
                return False
        chain += [*found, op]
        return True

    def _value_at(self, s: Slice, i: Idx, e: Elem) -> tuple[list[str], str, list[str]]:
        """(statements, value in s's storage type, conditions) of element i of register slice
        s, computed through the ops `_streamed_products` left unemitted, else read."""
        conds = self.mask(s, i)
        if s.buffer not in self._computed:
            return [], self.reg_load(s, i, e), conds
        writer, where = self._computed[s.buffer]
        w = writer.writes()[0]
        a, consider = self._reg_addresses(s, i)
        j = np.where(consider, where[a], 0)
        if (j[consider] < 0).any() or lane_form(j, consider) is None:
            raise _NotStreamable
        at = Idx("", j, consider)
        conds += self.mask(w, at)
        if isinstance(writer, Move):
            lines, x, inner = self._value_at(writer.src, at, e)
            if writer.fill is not None and inner:
                fill = self.storage_literal(writer.fill, self.dtype(writer.dst))
                return lines, f"({and_c(inner)} ? {x} : {fill})", conds
            return lines, x, conds + inner
        lines, inputs = [], []
        for x in writer.inputs:
            pre, v, inner = self._value_at(x, at, e)
            lines += pre
            inputs.append((v, self.dtype(x)))
            conds += inner
        more, v, dt = self.render_expr(writer.expr, inputs, writer.compute_dtype, e)
        return lines + more, self.to_storage(v, dt, self.dtype(writer.out)), conds

    def op_Sync(self, op: Sync) -> list[str]:
        level = self.level(op.slice)
        if op.scope == LANE or (op.scope == UNIT and level == REGISTER):
            return []  # lane: nothing; unit on registers: the reads are shuffles
        if op.scope == UNIT:
            return [self.sync_unit()]
        if op.scope == BLOCK:
            return [self.barrier()]
        raise EmitError(f"Sync at scope {op.scope} inside a kernel (device syncs split kernels)")

    vector_types = {"float32": {2: "float2", 4: "float4"}, "int32": {2: "int2", 4: "int4"},
                    "float16": {4: "uint2", 8: "uint4"}, "bfloat16": {4: "uint2", 8: "uint4"}}  # halves: two per word
    VECTOR_FIELDS = "xyzw"

    def op_Move(self, op) -> list[str]:
        if self.distributed_registers and self.vector_types:
            wide = self.vector_move(op)
            if wide is not None:
                return wide
        dt = self.dtype(op.dst)
        source = op.src
        if self.distributed_registers and op.fill is None and self.level(op.dst) == REGISTER and self.level(op.src) == DRAM:
            source = op.src.unbounded_where_still()  # a repeated address loads unguarded: NVRTC issues it once

        def body(e: Elem):
            src, ok = self.load(source, e.k, e)
            dst = self.store(op.dst, e.k, op, e)
            if dst is None:
                return []
            if op.fill is None or not ok:
                return guarded(ok + dst[1], [f"{dst[0]} = {src};"])
            return guarded(dst[1], [f"{dst[0]} = {and_c(ok)} ? {src} : {self.storage_literal(op.fill, dt)};"])
        return self.for_elements(op, op.dst.size, body)

    def vector_move(self, op) -> list[str] | None:
        """A Move between DRAM and registers as 8- or 16-byte accesses, one per lane and run of
        `vector_width` elements, where gir.ir.vector_access proves the DRAM side (consecutive,
        aligned, unmasked or masked on whole runs) and each lane's elements sit in consecutive
        register slots; None otherwise (the scalar path). The mask at a run's first element
        guards its access; a load it fails takes the fill."""
        vec = vector_width(op, self.k.buffers)  # elements per access
        if vec == 1:
            return None
        place = op.vec  # each lane's consecutive elements: one access or several of `vec`
        src_dram = self.level(op.src) == DRAM
        dram, reg = (op.src, op.dst) if src_dram else (op.dst, op.src)
        vtype = self.vector_types.get(self.dtype(dram), {}).get(vec)
        n = op.dst.size
        if vtype is None or not reg.offset.is_const:
            return None
        lay, name, L, lanes = self.layouts[reg.buffer], self.names[reg.buffer], self.L, np.arange(self.L)
        groups = []
        starts = [j * place * L + place * lanes + part * vec for j in range(-(-n // (place * L))) for part in range(place // vec)]
        for first in starts:
            valid = first < n
            ks = [np.where(valid, first + v, 0) for v in range(vec)]
            regs = [reg.offset.const + reg.pattern[e] for e in ks]
            slot0 = lay.slot[regs[0]][valid]
            if ((lay.owner[regs[0]][valid] != lanes[valid]).any() or (slot0 != slot0[0]).any()
                    or any((lay.slot[regs[v]][valid] != slot0[0] + v).any() or (lay.owner[regs[v]][valid] != lanes[valid]).any()
                           for v in range(vec))):
                return None
            groups.append((Idx("", ks[0], valid), int(slot0[0]), None if valid.all() else f"lane < {int(valid.sum())}"))
        out, fields = [], self.VECTOR_FIELDS[:vec]
        dt = self.dtype(dram)
        for i, slot, guard in groups:
            where = f"&{self.names[dram.buffer]}[{self.address(dram, i)}]"
            parts = [f"{name}[{slot + v}]" for v in range(vec)]
            unit_mask = self.mask(dram, i)  # the same for the lane's run of elements (run_uniform_mask)
            if unit_mask:
                out += self._masked_vector(op, src_dram, unit_mask, guard, parts,
                                           self._vector_access(src_dram, vtype, where, parts, fields, dt))
                continue
            out += guarded([guard] if guard else [], self._vector_access(src_dram, vtype, where, parts, fields, dt))
        return out

    def _masked_vector(self, op, src_dram: bool, mask: list[str], guard, parts: list[str], access: list[str]) -> list[str]:
        """A vector access under a per-unit mask: skipped where it fails, and a load with a fill
        value writes the fill into the lane's registers instead."""
        lane = [guard] if guard else []
        if "false" in mask:
            if src_dram and op.fill is not None:
                fill = self.storage_literal(op.fill, self.dtype(op.dst))
                return guarded(lane, [f"{p} = {fill};" for p in parts])
            return []
        if not src_dram or op.fill is None:
            return guarded(lane + mask, access)
        fill = self.storage_literal(op.fill, self.dtype(op.dst))
        return guarded(lane, [f"if ({and_c(mask)})", *block("{", access), "else",
                              *block("{", [f"{p} = {fill};" for p in parts])])

    def _vector_access(self, src_dram: bool, vtype: str, where: str, parts: list[str], fields, dt) -> list[str]:
        """The statements of one vector load into `parts` or store from them."""
        if dt in HALF:  # two halves per 32-bit field, the first in the low bits
            if src_dram:
                body = [f"const {vtype} v = *(const {vtype}*)({where});",
                        *(f"{p} = {self.half_from_bits(f'(unsigned short)(v.{fields[v // 2]} >> {16 * (v % 2)})', dt)};"
                          for v, p in enumerate(parts))]
                return block("{", body)
            words = [f"((unsigned){self.half_bits(a, dt)} | ((unsigned){self.half_bits(b, dt)} << 16))"
                     for a, b in zip(parts[::2], parts[1::2])]
            return [f"*({vtype}*)({where}) = make_{vtype}({', '.join(words)});"]
        if src_dram:
            body = [f"const {vtype} v = *(const {vtype}*)({where});", *(f"{p} = v.{f};" for p, f in zip(parts, fields))]
            return block("{", body)
        return [f"*({vtype}*)({where}) = make_{vtype}({', '.join(parts)});"]

    def op_Elementwise(self, op) -> list[str]:
        odt = self.dtype(op.out)

        def body(e: Elem):
            inputs, conds = [], []
            for s in op.inputs:
                x, ok = self.load(s, e.k, e)
                inputs.append((x, self.dtype(s)))
                conds += ok
            dst = self.store(op.out, e.k, op, e)
            if dst is None:
                return []
            lines, x, dt = self.render_expr(op.expr, inputs, op.compute_dtype, e)
            return lines + guarded(conds + dst[1], [f"{dst[0]} = {self.to_storage(x, dt, odt)};"])
        return self.for_elements(op, op.out.size, body)

    def op_Broadcast(self, op) -> list[str]:
        r = op.dst.size // op.src.size

        def body(e: Elem):
            src, ok = self.load(op.src, e.k.div(r) if op.mode == "repeat" else e.k.mod(op.src.size), e)
            dst = self.store(op.dst, e.k, op, e)
            return [] if dst is None else guarded(ok + dst[1], [f"{dst[0]} = {src};"])
        return self.for_elements(op, op.dst.size, body)

    def gather_out_of_range(self) -> str:
        """A statement run when a Gather index is out of range (the index is clamped, so memory
        stays safe): it sets the kernel's flag parameter (every writer writes 1: no atomics
        needed), which the caller reads after the kernel and raises."""
        return f"*{GATHER_FLAG} = 1;"

    def op_Gather(self, op) -> list[str]:
        """Negative indices wrap by `extent`; out-of-range ones are clamped here (a kernel cannot
        raise) and reported through `gather_out_of_range`, where the interpreter raises."""
        if self.level(op.src) == REGISTER and self.distributed_registers:
            raise EmitError("Gather from registers needs dynamic register indexing")
        n = op.extent

        def body(e: Elem):
            index, _ = self.load(op.index, e.k.div(op.group), e)
            dst = self.store(op.dst, e.k, op, e)
            if dst is None:
                return []
            src = f"{self.names[op.src.buffer]}[{self.address(op.src, e.k)} + (int)ix * {op.stride}]"
            i64 = self.types["int64"]
            flag = self.gather_out_of_range()
            wrap = [f"{i64} ix = ({i64})({index});", f"ix = ix < 0 ? ix + {n} : ix;"]
            if not flag:
                return [*wrap, f"ix = ix < 0 ? 0 : ix >= {n} ? {n - 1} : ix;",
                        *guarded(self.mask(op.src, e.k) + dst[1], [f"{dst[0]} = {src};"])]
            # flagged only where the element is stored: masked-off lanes may hold any index
            return [*wrap, f"const bool oob = ix < 0 || ix >= {n};", f"ix = oob ? (ix < 0 ? 0 : {n - 1}) : ix;",
                    *guarded(self.mask(op.src, e.k) + dst[1], [f"if (oob) {flag}", f"{dst[0]} = {src};"])]
        return self.for_elements(op, op.dst.size, body)

    def op_Reduce(self, op: Reduce) -> list[str]:
        return self.reduce_cooperative(op) if op.uniform else self.reduce_own(op)

    def _reduce_parts(self, op: Reduce):
        acc = accumulator(self.dtype(op.dst))
        ident = self.literal(reduce_identity(op.op, acc), acc)
        sdt = self.dtype(op.src)

        def term(x: str) -> str:
            return self.convert(self.to_value(x, sdt), compute(sdt), acc)
        return acc, ident, term

    @staticmethod
    def combine(kind: str, a: str, b: str, chain: bool = False) -> str:
        """`chain`: a scalar accumulation, one element after another (the prelude's max/min
        spelling that compiles to selects there, not branches)."""
        s = "S" if chain else ""
        return {"sum": f"{a} + {b}", "prod": f"{a} * {b}", "max": f"GIR_MAX{s}({a}, {b})", "min": f"GIR_MIN{s}({a}, {b})"}[kind]

    def pairwise(self, kind: str, names: list[str], chain: bool = False) -> list[str]:
        """Statements that combine the partials `names` pairwise into names[0]:
        ((p0 . p1) . (p2 . p3)) . ... (a tree: log2 dependent steps, not len(names))."""
        lines = []
        while len(names) > 1:
            pairs = [names[i:i + 2] for i in range(0, len(names), 2)]
            lines += [f"{a} = {self.combine(kind, a, b[0], chain)};" for a, *b in pairs if b]
            names = [pair[0] for pair in pairs]
        return lines

    def reduce_own(self, op: Reduce) -> list[str]:
        """uniform=False: output element k is reduced by the lane that owns it."""
        if self.distributed_registers and id(op) in self._streamed_products()[0]:
            return self._reduce_runs(op)
        acc, ident, term = self._reduce_parts(op)
        ddt = self.dtype(op.dst)

        def body(e: Elem):
            dst = self.store(op.dst, e.k, op, e)
            if dst is None:
                return []
            lines = [f"{self.ctype(acc)} acc = {ident};"]
            for g in range(op.group):
                x, ok = self.load(op.src, e.k.lin(op.group, g), e)
                x = term(x) if not ok else f"{and_c(ok)} ? {term(x)} : {ident}"
                lines.append(f"acc = {self.combine(op.op, 'acc', f'({x})', chain=True)};")
            return lines + guarded(dst[1], [f"{dst[0]} = {self.to_storage('acc', acc, ddt)};"])
        return self.for_elements(op, op.dst.size, body)

    def _reduce_runs(self, op: Reduce, dry: bool = False) -> list[str]:
        """A lane's run of outputs reduced side by side (`_streamed_products`): one accumulator
        per output, element g of every output's group added before element g + 1 (each
        output's additions in the order one at a time would make), each computed where it is
        added. Raises _NotStreamable (`dry`: before anything is emitted) where an element
        needs a shuffle, a lane guard or an index not affine in the lane."""
        acc, ident, term = self._reduce_parts(op)
        ddt = self.dtype(op.dst)
        elems = list(self.elements(op, op.dst.size))
        if any(e.guard for e in elems):
            raise _NotStreamable
        rows, stores = [], []
        for j, e in enumerate(elems):
            dst = self.store(op.dst, e.k, op, e)
            if dst is None:
                continue
            row = []
            for g in range(op.group):
                pre, x, ok = self._value_at(op.src, e.k.lin(op.group, g), e)
                x = term(x) if not ok else f"{and_c(ok)} ? {term(x)} : {ident}"
                add = f"acc{j} = {self.combine(op.op, f'acc{j}', f'({x})', chain=True)};"
                row.append(block("{", [*pre, add]) if pre else [add])
            if e.pre:
                raise _NotStreamable
            rows.append((j, row))
            stores += guarded(dst[1], [f"{dst[0]} = {self.to_storage(f'acc{j}', acc, ddt)};"])
        if dry or not rows:
            return []
        lines = [f"{self.ctype(acc)} " + ", ".join(f"acc{j} = {ident}" for j, _ in rows) + ";"]
        for g in range(op.group):
            lines += [ln for m in self._sunk.get(id(op), []) for ln in self.op_Move(self._row_of(m, g))]
            lines += [ln for _, row in rows for ln in row[g]]
        return block("{", lines + stores)

    def reduce_cooperative(self, op: Reduce) -> list[str]:
        """uniform=True: per-lane partials over held elements, then an xor butterfly."""
        src, G, R = op.src, op.group, op.dst.size
        if src.is_masked or not src.offset.is_const:
            raise EmitError(f"cooperative Reduce over a masked or unit-dependent register slice {src}")
        acc, ident, term = self._reduce_parts(op)
        name, lay = self.names[src.buffer], self.layouts[src.buffer]
        a = src.offset.const + src.pattern
        if lay.replicated:  # every lane holds every element: no communication
            return [line for r in range(R) for line in self._reduce_into(op, r, [
                f"p = {self.combine(op.op, 'p', term(f'{name}[{lay.slot[x]}]'))};" for x in a[r * G:(r + 1) * G]])]
        owner, slot = lay.owner[a], lay.slot[a]
        rtab = np.full((lay.nslots, self.L), -1)
        for j in range(src.size):
            if rtab[slot[j], owner[j]] != -1:
                raise EmitError(f"Reduce source {src} reads one register element twice")
            rtab[slot[j], owner[j]] = j // G
        seg = 1
        while any(owner[r * G:(r + 1) * G].min() // seg != owner[r * G:(r + 1) * G].max() // seg for r in range(R)):
            seg *= 2
        per_seg: dict[int, list[int]] = {}
        for r in range(R):
            per_seg.setdefault(int(owner[r * G]) // seg, []).append(r)
        out = []
        for p in range(max(len(v) for v in per_seg.values())):
            members = {rs[p]: q for q, rs in per_seg.items() if len(rs) > p}
            lines = []
            for sv in range(lay.nslots):
                m = np.isin(rtab[sv], list(members))
                if m.any():
                    x = term(f"{name}[{sv}]")
                    lines.append(f"p = {self.combine(op.op, 'p', x if m.all() else f'({self.lane_in(m)} ? {x} : {ident})')};")
            step = seg // 2
            while step >= 1:  # the shuffle into a temporary: GIR_MAX would evaluate it twice
                lines.append(f"q = {self.shuffle_typed('p', step, acc, xor=True)}; p = {self.combine(op.op, 'p', 'q')};")
                step //= 2
            spread = {}
            for r, q in sorted(members.items()):  # shuffles outside any store guard
                spread[r] = "p" if seg == self.L else f"o{r}"
                if seg != self.L:
                    lines.append(f"const {self.ctype(acc)} o{r} = {self.shuffle_typed('p', str(q * seg), acc)};")
            out += self._reduce_into(op, None, lines, spread)
        return out

    def _reduce_into(self, op: Reduce, r, lines: list[str], spread: dict | None = None) -> list[str]:
        """A scope with accumulator p: `lines`, then store p (or each spread value) to dst."""
        acc, ident, _ = self._reduce_parts(op)
        ddt = self.dtype(op.dst)
        stores = []
        for out, value in (spread or {r: "p"}).items():
            i = Idx(str(out), np.full(self.L, out), np.ones(self.L, bool))
            dst = self.store(op.dst, i, op)
            if dst is not None:
                stores += guarded(dst[1], [f"{dst[0]} = {self.to_storage(value, acc, ddt)};"])
        decl = f"{self.ctype(acc)} p = {ident}" + (", q;" if any(ln.startswith("q = ") for ln in lines) else ";")
        return block("{", [decl, *lines, *stores])


class LoopedLanes:
    """The register model of a unit whose lanes are loop iterations of one thread (a CPU
    thread, an OpenCL work-item): registers are per-unit arrays indexed by address, so
    cross-lane reads are plain reads, each gOperator is one loop over its elements (the
    compiler vectorises it) and a Reduce, cooperative or not, is a loop per output."""
    distributed_registers = False
    simd_pragma: str | None = None  # a dialect's way to say "vectorise this element loop"
    _interior = False  # emitting the unmasked copy of the kernel (see kernel_body)
    fuse_loops = True  # False: one loop per gOperator (an A/B baseline)
    fuse_escaping = True  # False: loops fuse only where every array they write becomes a scalar (an A/B baseline)
    split_interior = True  # False: masks tested in every unit (an A/B baseline)
    inline_products = True  # False: a reduction's product in an array of its own (an A/B baseline)
    split_rows = True  # False: element loops indexed by row left flat (an A/B baseline)
    inline_loads = True  # False: a reduction of a plain DRAM load reads a stack copy (an A/B baseline)

    def kernel_body(self, k) -> list[str]:
        """A kernel with slices masked by bounds that depend on the unit runs twice as code:
        unmasked when every such bound holds for the unit (the interior: every unit but the
        ragged ones at an edge), masked otherwise. A mask tested per element keeps gcc from
        vectorising a loop (a ragged-row SiLU kernel: 1.2 ms with a mask per element, 0.76 ms
        with the interior unmasked, one thread) and element loops from fusing (loop_fusion.py)."""
        if getattr(self, "across", False):
            return super().kernel_body(k)
        # only where the C compiler vectorises the loops (simd_pragma): PoCL's kernel compiler
        # died on the two-version form of a 33-element lane sum (tests/conformance, opencl)
        split = self.split_interior and self.simd_pragma
        conds = list(dict.fromkeys(c for _, op in k.ops for c in self.interior_conditions(op))) if split else []
        if not conds:
            return self._fused(super().kernel_body(k))
        self._interior = True
        try:
            fast = super().kernel_body(k)
        finally:
            self._interior = False
        slow = super().kernel_body(k)
        n = _statement_prefix(fast, slow)  # the prologue and declarations; each branch runs to the end
        prefix = fast[:n]
        fast, slow = self._fused(fast[n:], prefix), self._fused(slow[n:], prefix)
        return [*prefix, f"if ({and_c(conds)}) {{", *["  " + ln for ln in fast], "} else {", *["  " + ln for ln in slow], "}"]

    def _fused(self, lines: list[str], declared: list[str] = ()) -> list[str]:
        """Element loops fused (loop_fusion.py), then split into rows where they index by
        row (loop_split.py). `declared`: lines before `lines` that declare register arrays."""
        if not self.simd_pragma:
            return lines
        if self.fuse_loops:
            lines = fuse_element_loops(lines, self.simd_pragma, declared, self.fuse_escaping)
        return split_row_loops(lines, self.simd_pragma) if self.split_rows else lines

    def interior_conditions(self, op) -> list[str]:
        """C conditions under which none of `op`'s unit-dependent slice bounds can fail (a
        constant bound is decided when emitting)."""
        conds = []
        for s in (*op.reads(), *op.writes()):
            for bounds, holds in ((s.limits, lambda b, n: f"{affine_c(b)} >= {n}"), (s.starts, lambda b, n: f"{affine_c(b)} <= 0")):
                for d, bound in enumerate(bounds):
                    if bound is not None and not bound.is_const:
                        conds.append(holds(bound, s.shape[d]))
        return conds

    def op_Move(self, op) -> list[str]:
        """A masked load into registers without a fill leaves the masked-off elements
        undefined: zero is as good a value as any, and it makes the load a select, the form
        the across-units loads take (gcc if-converts it into a masked vector load)."""
        if op.fill is None and op.src.is_masked and not op.dst.is_masked and self.level(op.dst) == REGISTER:
            op = replace(op, fill=0)
        return super().op_Move(op)

    def mask(self, s, e) -> list[str]:
        return super().mask(self._as_here(s), e)

    def _as_here(self, s):
        """s with the bounds tested where it is emitted: in the interior the unit-dependent
        ones hold (interior_conditions); constant ones stay."""
        if not self._interior or not s.is_masked:
            return s
        const = lambda bounds: tuple(b if b is not None and b.is_const else None for b in bounds)  # noqa: E731
        return replace(s, limits=const(s.limits), starts=const(s.starts))

    def elements(self, op, n: int):
        yield Elem(Idx("k"), loop=n, independent=_elementwise_independent(op))

    def wrap(self, e: Elem, lines: list[str]) -> list[str]:
        """An element loop whose iterations are independent is marked for SIMD: gcc would
        otherwise fully unroll a short one and then fail to vectorise the selects of an inlined
        math function in it (a SiLU kernel of 8-element units: 5.2 ms plain, 0.78 ms marked)."""
        pragma = [self.simd_pragma] if self.simd_pragma and e.independent else []
        return pragma + block(f"for (int k = 0; k < {e.loop}; ++k) {{", lines)

    ACCUMULATORS = 16   # independent partials per output: SIMD-wide and pairwise-combined
    interleave_rows = True  # False: a unit's outputs reduced one after another (an A/B baseline)
    COLUMN_GROUP = COLUMN_GROUP  # the longest group a reduction with its outputs in the SIMD lanes writes out (streams.py)
    COLUMN_PARTIALS = 4  # its partials per output from 2 x ACCUMULATORS elements on
    BLOCK_STEPS = 64    # steps per partial before the block's tree adds into the running result

    def op_Reduce(self, op) -> list[str]:
        acc, ident, term = self._reduce_parts(op)
        index = Idx(f"k*{op.group} + g")
        pre, x = self._inlined_term(op)
        ok = []
        if x is None:
            x, ok = self.load(op.src, index, None)
        x = term(x) if not ok else f"{and_c(ok)} ? {term(x)} : {ident}"
        dst = self.store(op.dst, Idx("k"), op)
        if dst is None:
            return []
        store = guarded(dst[1], [f"{dst[0]} = {self.to_storage('acc', acc, self.dtype(op.dst))};"])
        if id(op) in self._inline_plan()[2]:  # outputs in the SIMD lanes, the group unrolled
            # a group under 2 x ACCUMULATORS in order, as the plain loop adds it; a longer one in
            # COLUMN_PARTIALS interleaved partials combined pairwise (a chain of 128 adds would
            # bound the loop by the add latency)
            parts = 1 if op.group < 2 * self.ACCUMULATORS else self.COLUMN_PARTIALS
            names = ["acc"] + [f"acc{j}" for j in range(1, parts)]
            lines = [f"{self.ctype(acc)} " + ", ".join(f"{n} = {ident}" for n in names) + ";"]

            def add(g, n: str, looped: bool) -> list[str]:
                """Element g of output k's group into partial n (g: an int, or the C variable)."""
                pre, x = self._inlined_term(op, column="g" if looped else g)
                head = [f"const int g = {g};"] if looped else []
                return block("{", [*head, *pre, f"{n} = {self.combine(op.op, n, f'({term(x)})', chain=True)};"])

            if op.group <= self.COLUMN_GROUP:  # the group written out: what gcc schedules best
                for g in range(op.group):
                    lines += add(g, names[g % parts], False)
            else:  # a loop over the group, partial j taking g = j mod parts as written out above
                full = op.group - op.group % parts
                lines += block(f"for (int g0 = 0; g0 < {full}; g0 += {parts}) {{",
                               [ln for j in range(parts) for ln in add(f"g0 + {j}", names[j], True)])
                for j in range(op.group % parts):
                    lines += add(f"{full + j}", names[j], True)
            lines += self.pairwise(op.op, names, chain=True)
            pragma = [self.simd_pragma] if self.simd_pragma else []
            return pragma + block(f"for (int k = 0; k < {op.dst.size}; ++k) {{", lines + store)
        rows = self._interleaved_term(op, term) if self.interleave_rows else None
        if rows is not None:  # the time model counts these streams (gir/ir/streams.py)
            ct = self.ctype(acc)
            return block("{", [*self.interleaved_reduce_loop(op, acc, ident, *rows),
                               *block(f"for (int k = 0; k < {op.dst.size}; ++k) {{", [f"const {ct} acc = accs[k];", *store])])
        return block(f"for (int k = 0; k < {op.dst.size}; ++k) {{", [*self.reduce_loop(op, acc, ident, x, " ".join(pre)), *store])

    # -- a product computed inside the reduction that consumes it -----------------------------
    def emit_op(self, op) -> list[str]:
        if id(op) in self._inline_plan()[1]:
            return []  # computed inside the reduction that reads it (_inlined_term)
        return super().emit_op(op)

    def _inline_plan(self) -> tuple[dict, set, set]:
        """(id of a Reduce -> (the Elementwise whose result it alone reads, in its element order,
        and per input buffer of that Elementwise the Move from DRAM that alone fills it for it);
        ids of the gOperators the reductions compute in their own loops; ids of the reductions
        whose loop over outputs is the SIMD loop). A GEMV's product then streams the weights once, multiplied and
        summed in one loop, instead of being copied into arrays (two loops), multiplied into a
        third and summed in a fourth. Only unmasked slices (or, in the interior copy, slices
        masked by unit-dependent bounds only) are inlined. A group whose loads are contiguous
        across outputs instead (`streams.columns`; over COLUMN_GROUP, affine in the group's
        index too: `column_products`, which the time model charges alike) runs with the outputs as SIMD
        lanes: a lowered 4 -> 24 channel 1x1 conv + SiLU over 32x32 (EfficientNet-B0 exported at
        64x64) gathered its 16 x 4 inputs per unit, 120 us on one thread (15 us now); ResNet-50
        exported, a 32 -> 8 channel conv over 4x4 6.1 -> 0.5 us."""
        held, interior = getattr(self, "_plan_for", (None, None))
        if held is self.k and interior == self._interior:  # the kernel itself held: its id stays its own
            return self._plan
        self._plan_for, self._plan = (self.k, self._interior), ({}, set(), set())
        if getattr(self, "across", False) or not self.inline_products:
            return self._plan
        ops = [op for _, op in self.k.ops]
        writers, readers = buffer_users(ops)
        producer, skipped, across = self._plan
        for r in ops:
            if not isinstance(r, Reduce) or not self._in_registers(r.src):
                continue
            (e, *more) = writers.get(r.src.buffer, [None])
            reader = e  # who reads the loads: the product, or the reduction itself (a plain load)
            if self.inline_loads and (plain := loaded_as_product(e, self.k.buffers)) is not None:
                e, reader = plain, r
            if (more or not isinstance(e, Elementwise) or readers.get(r.src.buffer) != [r]
                    or not self._same_elements(e.out, r.src) or not all(map(self._plain, (e.out, *e.inputs)))):
                continue
            loads = {s.buffer: m for s in e.inputs if (m := self._dram_load_of(s, writers, readers, reader)) is not None}
            if reader is r and not loads:
                continue
            if not all(runs_stream(m.src, r.group) for m in loads.values()):
                if not column_reduction(r, list(loads.values())):
                    continue  # a strided load inside the partial sums would be a gather per element
                across.add(id(r))
            producer[id(r)] = (e, loads)
            skipped.add(id(e))
            skipped.update(id(m) for m in loads.values())
        return self._plan

    def _in_registers(self, s) -> bool:
        return self.level(s) == REGISTER

    def _plain(self, s) -> bool:
        """No mask is tested on s here: none, or only unit-dependent ones in the interior copy."""
        return not s.is_masked or self._interior and all(b is None or not b.is_const for b in (*s.limits, *s.starts))

    @staticmethod
    def _same_elements(a, b) -> bool:
        """Element i of a is element i of b (same buffer, constant offsets)."""
        return (a.buffer == b.buffer and a.size == b.size and a.offset.is_const and b.offset.is_const
                and bool(np.array_equal(a.pattern + a.offset.const, b.pattern + b.offset.const)))

    def _dram_load_of(self, s, writers, readers, e):
        """The Move from DRAM that alone fills register slice s, read only by e, in s's order."""
        if not self._in_registers(s) or readers.get(s.buffer) != [e]:
            return None
        (m, *more) = writers.get(s.buffer, [None])
        if (more or not isinstance(m, Move) or m.fill is not None or self.level(m.src) != DRAM
                or not self._same_elements(m.dst, s) or not self._plain(m.src) or not self._plain(m.dst)
                or self.dtype(m.src) != self.dtype(m.dst)):
            return None
        return m

    def _inlined_term(self, r, column: int | str | None = None, rows: bool = False) -> tuple[list[str], str | None]:
        """(statements, value) of element g of output k's group of r's source (k and g C
        variables) computed in place, or ([], None); each input read through its own row where
        it has one (`_row_slice`: no division), else by its flat index k*group + g.
        `column`: element `column` of output k's group (an int, or "g": the C variable g), the outputs in the SIMD lanes
        (`_inline_plan`'s third set): each loaded input is read as its runs' column-th elements,
        one address per output apart (or one for all), an address affine in k with no division.
        `rows`: element g of output k's group, k and g C variables (the interleaved loop), each
        input read through its slice of that group (`_row_slice`), an address affine in k and
        g; (statements, None) where an input has no such slice."""
        if id(r) not in self._inline_plan()[0]:
            return [], None
        e, loads = self._inline_plan()[0][id(r)]
        index = Idx(f"k*{r.group} + {column}" if isinstance(column, int) else f"k*{r.group} + g")
        inputs = []
        for s in e.inputs:
            if rows:
                own = _row_slice(self._as_here(loads[s.buffer].src if s.buffer in loads else s), r.group)
                if own is None:
                    return [], None
                x, ok = self.load(own, Idx("g"), None)
            elif s.buffer in loads and column == "g":
                x, ok = self.load(_column_at(loads[s.buffer].src, r.group), Idx("k"), None)
            elif s.buffer in loads and column is not None:
                x, ok = self.load(_column(loads[s.buffer].src, r.group, column), Idx("k"), None)
            else:
                src = loads[s.buffer].src if s.buffer in loads else s
                own = None if isinstance(column, int) else _row_slice(self._as_here(src), r.group)
                x, ok = self.load(own, Idx("g"), None) if own is not None else self.load(src, index, None)
            if ok:  # _plain admitted only slices without a mask to test: the plan and the emitter disagree
                raise EmitError(f"{self.k.name}: an inlined input of a reduction has a mask ({' && '.join(ok)})")
            inputs.append((x, self.dtype(s)))
        lines, x, dt = self.render_expr(e.expr, inputs, e.compute_dtype, Elem(index))
        return lines, self.to_storage(x, dt, self.dtype(e.out))

    def _interleaved_term(self, op, term) -> tuple[str, str] | None:
        """(statements, value) of element g of output k's group, for the interleaved loop: where
        op computes a product of DRAM loads in its own loop whose rows lie a page or more apart
        (`gir.ir.streams.row_streams`: what the time model charges at the faster rate), and each
        input has a slice per output affine in k (`_row_slice`). None: the plain loop."""
        if not self.simd_pragma or id(op) not in self._inline_plan()[0]:
            return None
        e, loads = self._inline_plan()[0][id(op)]
        if row_streams(op, list(loads.values()), self.k.buffers) < 2:
            return None
        pre, x = self._inlined_term(op, rows=True)
        return None if x is None else (" ".join(pre), term(x))

    def interleaved_reduce_loop(self, op, acc: str, ident: str, pre: str, x: str) -> list[str]:
        """`accs[k]` (of dtype `acc`) = the reduction of `x` (after statements `pre`), an
        expression of the C variables k and g, over g < group for each of the unit's outputs
        k, their groups walked side by side: each block step runs ACCUMULATORS partials of every
        output in turn, so a unit of R outputs keeps R streams of loads in flight where
        `reduce_loop` per output keeps one. GPT-2 decode's 768 x 3072 GEMV as GIR emits it, from
        DRAM: 11.5 GB/s a row at a time, 13.2 eight rows an eighth of the matrix apart, one
        thread; 21.1 and 24.6 with two (results/gemv_streams.md). The outputs are a loop over k:
        written out one loop a line, gcc compiled them to half the one-row rate. The SIMD mark
        on j made 1.19x in an ad-hoc harness and 0.9-1.05x in that script; it stays. Each output's partials,
        tree and block order are `reduce_loop`'s, so the sums are bit-identical to it."""
        G, A, R, ct, accs = op.group, self.ACCUMULATORS, op.dst.size, self.ctype(acc), "accs"
        full, blk = G - G % A, A * self.BLOCK_STEPS
        sep = " " if pre else ""
        lines = [f"{ct} {accs}[{R}];", f"for (int k = 0; k < {R}; ++k) {accs}[k] = {ident};",
                 f"for (int gb = 0; gb < {full}; gb += {blk}) {{",
                 f"  const int ge = gb + {blk} < {full} ? gb + {blk} : {full};",
                 f"  {ct} part[{R}][{A}];",
                 f"  for (int k = 0; k < {R}; ++k) for (int j = 0; j < {A}; ++j) part[k][j] = {ident};",
                 f"  for (int g0 = gb; g0 < ge; g0 += {A}) {{",
                 f"    for (int k = 0; k < {R}; ++k) {{",
                 f"      {self.simd_pragma}",
                 f"      for (int j = 0; j < {A}; ++j) {{ const int g = g0 + j; {pre}{sep}"
                 f"part[k][j] = {self.combine(op.op, 'part[k][j]', f'({x})')}; }}",
                 "    }", "  }", f"  for (int k = 0; k < {R}; ++k) {{"]
        select = [f"    {self.simd_pragma}"] if op.op in ("max", "min") else []
        half = A // 2
        while half >= 1:
            lines += select
            lines.append(f"    for (int j = 0; j < {half}; ++j) part[k][j] = {self.combine(op.op, 'part[k][j]', f'part[k][j + {half}]')};")
            half //= 2
        lines += [f"    {accs}[k] = {self.combine(op.op, f'{accs}[k]', 'part[k][0]', chain=True)};", "  }", "}"]
        if G % A:
            lines.append(f"for (int k = 0; k < {R}; ++k) for (int g = {full}; g < {G}; ++g) {{ {pre}{sep}"
                         f"{accs}[k] = {self.combine(op.op, f'{accs}[k]', f'({x})', chain=True)}; }}")
        return lines

    def reduce_loop(self, op, acc: str, ident: str, x: str, pre: str = "") -> list[str]:
        """`acc` = the reduction of `x` (an expression of `g`, after statements `pre`) over g < group. A long group runs
        in blocks of ACCUMULATORS x BLOCK_STEPS elements, each over ACCUMULATORS independent partials of consecutive
        elements combined as a tree, the block results then in order: one serial chain would
        run at one add per FP latency, would not vectorise without reassociating (which C
        forbids), and loses accuracy linearly in its length (a sum of 1,001 floats was 3e-4
        off; 200,000 x 0.1 2e-3). Rounding error now grows with BLOCK_STEPS plus the
        number of blocks."""
        G, A, ct = op.group, self.ACCUMULATORS, self.ctype(acc)
        if G < 2 * A:
            return [f"{ct} acc = {ident};",
                    f"for (int g = 0; g < {G}; ++g) {{ {pre}{' ' if pre else ''}acc = {self.combine(op.op, 'acc', f'({x})', chain=True)}; }}"]
        full, blk = G - G % A, A * self.BLOCK_STEPS
        lines = [f"{ct} acc = {ident};", f"for (int gb = 0; gb < {full}; gb += {blk}) {{",
                 f"  const int ge = gb + {blk} < {full} ? gb + {blk} : {full};",
                 f"  {ct} part[{A}];", f"  for (int j = 0; j < {A}; ++j) part[j] = {ident};",
                 f"  for (int g0 = gb; g0 < ge; g0 += {A}) {{",
                 # the partials are independent: said so, gcc vectorises a max/min (a select) too;
                 # not on a sum, which gcc vectorises better unmarked (a GEMV: 280 us, 527 marked)
                 *([f"    {self.simd_pragma}"] if self.simd_pragma and op.op in ("max", "min") else []),
                 f"    for (int j = 0; j < {A}; ++j) {{ const int g = g0 + j; {pre}{' ' if pre else ''}"
                 f"part[j] = {self.combine(op.op, 'part[j]', f'({x})')}; }}", "  }"]
        half = A // 2
        # the tree's steps vectorise too when said so; unmarked, gcc made a max tree a branch
        # per pair (a softmax row max: 161 us against 64 us over 1,536 rows of 128)
        tree_pragma = [f"  {self.simd_pragma}"] if self.simd_pragma and op.op in ("max", "min") else []
        while half >= 1:
            lines += tree_pragma
            lines.append(f"  for (int j = 0; j < {half}; ++j) part[j] = {self.combine(op.op, 'part[j]', f'part[j + {half}]')};")
            half //= 2
        lines += [f"  acc = {self.combine(op.op, 'acc', 'part[0]', chain=True)};", "}"]
        if G % A:
            lines.append(f"for (int g = {full}; g < {G}; ++g) {{ {pre}{' ' if pre else ''}acc = {self.combine(op.op, 'acc', f'({x})', chain=True)}; }}")
        return lines
