"""How many DRAM streams one unit of a looped-lanes kernel (a CPU thread) keeps in flight.

A CPU thread's DRAM rate is set by how many misses it has outstanding, and its hardware
prefetchers track each stream of addresses within a page on its own: one thread summing one
row after another of a 768 x 3072 float GEMV streamed 11.5 GB/s from DRAM, four or eight rows
a fraction of the matrix apart side by side 13.2-13.6 GB/s (results/gemv_streams.md). The emitter walks a unit's
outputs side by side where a reduction computes its product in its own loop
(gir/backends/cstyle.py `interleaved_reduce_loop`, `_inline_plan`); the time model
(gir/fusion/perf.py) charges that unit's bytes at the faster rate. The rule lives here, on the
IR, because the two must agree on it.
"""
from __future__ import annotations

import numpy as np

from .dtypes import itemsize
from .gops import Elementwise, Move, Reduce
from .expr import Input
from .target import DRAM, REGISTER

MAX_INTERLEAVED_ROWS = 8  # the most outputs of a unit whose reductions the emitter walks side by side
MIN_GROUP = 32            # a shorter group is one plain loop (cstyle: under 2 x ACCUMULATORS)
PAGE_BYTES = 4096         # the prefetchers track a stream per page: rows within one share it
GAINFUL_STREAMS = 8       # streams `gir calibrate` measures the gain at (results/gemv_streams.md: 8 beat 4)


def interleaves(r: Reduce) -> bool:
    """The emitter walks r's outputs side by side (cstyle.LoopedLanes.op_Reduce)."""
    return 2 <= r.dst.size <= MAX_INTERLEAVED_ROWS and r.group >= MIN_GROUP


def runs_stream(s, group: int) -> bool:
    """Each run of `group` consecutive elements of s sits at consecutive addresses, or at one
    (a broadcast operand): a loop over the run is a contiguous vector load."""
    steps = np.diff(s.pattern.reshape(-1, group), axis=1) if group > 1 else np.zeros((1, 0))
    return bool(((steps == 1).all(axis=1) | (steps == 0).all(axis=1)).all())


def buffer_users(ops) -> tuple[dict, dict]:
    """(buffer -> the gOperators that write it, buffer -> those that read it), in program order."""
    writers, readers = {}, {}
    for op in ops:
        for s in op.writes():
            writers.setdefault(s.buffer, []).append(op)
        for s in op.reads():
            readers.setdefault(s.buffer, []).append(op)
    return writers, readers


def inlined_products(ops, buffers) -> list[tuple[Reduce, Elementwise, list[Move]]]:
    """(reduction, the product it alone reads, the DRAM loads that alone fill the product's
    inputs) where each load streams run by run: the looped-lanes emitter computes such a
    product inside the reduction's loop (cstyle.LoopedLanes `_inline_plan`, which also needs
    unmasked slices), so neither the product nor the loads' register arrays exist, and each
    load is a contiguous vector load per run rather than a copy loop."""
    return [(r, e, loads) for r, e, loads in _products(ops, buffers) if all(runs_stream(m.src, r.group) for m in loads)]


def loaded_as_product(producer, buffers) -> Elementwise | None:
    """A reduction fed by one plain load from DRAM (a row's sum or max): the load as the
    identity product over it, which the reduction then reads from DRAM in its own loop like
    any product's inputs. Copied into a stack array first, a GEMV's 768-float rows summed at
    4.3 GB/s a thread where the same rows multiplied in the loop streamed at 10 (a 2-core
    Cascade Lake guest, scripts/perf_model_rank.py --subgraph gemv)."""
    if (isinstance(producer, Move) and producer.fill is None and buffers[producer.src.buffer].level == DRAM
            and buffers[producer.dst.buffer].dtype == buffers[producer.src.buffer].dtype):
        return Elementwise(expr=Input(0), inputs=(producer.dst,), out=producer.dst)
    return None


def _products(ops, buffers):
    """(reduction, the product it alone reads, the DRAM loads that alone fill the product's
    inputs; at least one)."""
    writers, readers = buffer_users(ops)
    for r in ops:
        if not isinstance(r, Reduce) or buffers[r.src.buffer].level != REGISTER:
            continue
        producers = writers.get(r.src.buffer, [])
        if len(producers) != 1 or readers.get(r.src.buffer) != [r]:
            continue
        if (plain := loaded_as_product(producers[0], buffers)) is not None:
            yield r, plain, [producers[0]]
            continue
        if not isinstance(producers[0], Elementwise):
            continue
        e, loads = producers[0], []
        for s in e.inputs:
            (m, *more) = writers.get(s.buffer, [None])
            if (not more and isinstance(m, Move) and buffers[m.src.buffer].level == DRAM
                    and readers.get(s.buffer) == [e] and m.fill is None):
                loads.append(m)
        if loads:
            yield r, e, loads


COLUMN_OPS = ("sum", "max", "min")  # reductions the emitter runs with their outputs in the SIMD lanes
COLUMN_GROUP = 128  # the longest such group the emitter writes out; a longer one is a loop over g


def columns(s, group: int) -> bool:
    """Element g of every run of `group` sits one address after (or at) element g of the run
    before: a loop over the runs (a unit's outputs) reads contiguous vectors for each g (a
    lowered 1x1 conv whose unit holds 16 positions x 4 input channels, the channels a plane
    apart; attention's probabilities times V read down V's columns)."""
    runs = s.pattern.reshape(-1, group)
    if runs.shape[0] < 2:
        return False
    steps = np.diff(runs, axis=0)
    return bool(((steps == 1).all(axis=0) | (steps == 0).all(axis=0)).all())


def column_step(s, group: int) -> int | None:
    """The address step from element g to g + 1 of every run where it is one constant (the
    runs are a 2-D affine grid, so a loop over g can address them); else None."""
    runs = s.pattern.reshape(-1, group)
    if group < 2:
        return 0
    steps = np.diff(runs, axis=1)
    return int(steps[0, 0]) if (steps == steps[0, 0]).all() else None


def column_products(ops, buffers) -> list[tuple[Reduce, Elementwise, list[Move]]]:
    """(reduction, product, loads) like `inlined_products`, where the loads are no runs but
    `columns` instead, the reduction a sum, max or min, and (past COLUMN_GROUP) the runs affine
    in g: the emitter runs those outputs in the SIMD lanes, the group written out or as a loop
    (cstyle `_inline_plan`), each load a contiguous vector per element of the group, never a
    gather."""
    return [(r, e, loads) for r, e, loads in _products(ops, buffers) if column_reduction(r, loads)]


def column_reduction(r: Reduce, loads: list[Move]) -> bool:
    """Reduction r, whose product reads `loads` from DRAM, runs with its outputs in the SIMD
    lanes (see `column_products`): the rule the emitter and the time model share."""
    return (r.op in COLUMN_OPS and bool(loads) and not all(runs_stream(m.src, r.group) for m in loads)
            and all(columns(m.src, r.group) for m in loads)
            and (r.group <= COLUMN_GROUP or all(column_step(m.src, r.group) is not None for m in loads)))


def _row_bytes(r: Reduce, m: Move, buffers) -> int | None:
    """Bytes between consecutive rows of load m's source where it holds one row per output of
    reduction r (its leading dimension runs over r's outputs), else None."""
    lead = [(n, st) for n, st in zip(m.src.shape, m.src.strides) if n > 1][:1]
    if not lead or lead[0][0] != r.dst.size:
        return None
    return abs(lead[0][1]) * itemsize(buffers[m.src.buffer].dtype)


def row_streams(r: Reduce, loads: list[Move], buffers) -> int:
    """DRAM streams reduction r walks side by side when the emitter interleaves it: where some
    load of its product has one row per output, the pages those rows span, at most one per
    output (rows a page or more apart: its outputs; 8 adjacent rows of 3 KB: 6); else 1."""
    if not interleaves(r):
        return 1
    steps = [step for m in loads if (step := _row_bytes(r, m, buffers)) is not None]
    return max([1, *(min(r.dst.size, r.dst.size * step // PAGE_BYTES) for step in steps)])


def unit_streams(products, buffers) -> int:
    """DRAM streams one unit reads side by side: the most `row_streams` of `products` (a unit's
    `inlined_products`); 1 where none."""
    return max([row_streams(r, loads, buffers) for r, _, loads in products], default=1)


def rows_adjacent(products, buffers) -> bool:
    """The rows a unit walks side by side lie under a page apart (adjacent rows of one matrix,
    not rows a fraction of it apart). A CPU's prefetchers take the two differently: eight
    adjacent 768-float GEMV rows ran 1.09x one row's rate on an Intel Xeon VM but 0.64-0.72x
    on an AMD EPYC (Zen 4) VM, where eight rows an eighth of the matrix apart ran 0.97-1.17x
    (scripts/gemv_streams.py, one thread, four runs); `gir calibrate` measures both gains."""
    return any(interleaves(r) and (step := _row_bytes(r, m, buffers)) is not None and step < PAGE_BYTES
               for r, _, loads in products for m in loads)


def stream_factor(streams: int, gain: float) -> float:
    """One thread's DRAM rate with `streams` side by side over its rate with one: `gain` (what
    `gir calibrate` measured at GAINFUL_STREAMS) reached linearly; under 1 where the form
    measured slower (adjacent rows on some CPUs)."""
    if streams <= 1:
        return 1.0
    return 1 + (gain - 1) * min(streams - 1, GAINFUL_STREAMS - 1) / (GAINFUL_STREAMS - 1)
