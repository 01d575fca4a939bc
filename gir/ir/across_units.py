"""Which kernels a SIMD-lane target vectorises across units instead of within one.

On a CPU a unit is one loop iteration of one thread and its lanes are the iterations of each
gOperator's element loop. A kernel whose units each compute a handful of elements (one output
of a window reduction) has nothing to vectorise inside a unit, but neighbouring units along the
grid's last axis compute neighbouring outputs: the CPU emitter then runs that axis as the SIMD
loop (gir/backends/cpu/across_units.py). The rule lives here, on the IR, because the emitter
and the time model (gir/fusion/perf.py) must agree on it.
"""
from __future__ import annotations

from .affine import ParallelPrimitive
from .gops import Gather, Sync
from .target import DRAM, REGISTER

MAX_ELEMENTS = 64      # the largest gOperator (elements one unit reads or writes) worth unrolling
MAX_STATEMENTS = 1024  # unrolled element statements in the whole kernel (compile time, code size)
MIN_ROW = 4            # units along the grid's last axis: at least a SIMD vector of them
MAX_STRIDE = 4         # elements a DRAM slice may step per unit (a stride-2 conv's input: 2)


def step_along_last(prim: ParallelPrimitive, s) -> int:
    """How far slice s moves, in elements, from one unit to the next along the last grid axis."""
    return dict(prim.normalize(s.offset).terms).get(f"b{len(prim.grid) - 1}", 0)


def strided(ops, prim: ParallelPrimitive, buffers: dict) -> bool:
    """Whether some DRAM slice of the kernel steps more than one element per unit."""
    return any(buffers[s.buffer].level == DRAM and step_along_last(prim, s) > 1
               for op in ops if not isinstance(op, Sync) for s in (*op.reads(), *op.writes()))


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
            if level == DRAM and not 0 <= step_along_last(prim, s) <= MAX_STRIDE:
                return False
        statements += largest
    return statements <= MAX_STATEMENTS
