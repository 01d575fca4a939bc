"""Memory planning: intermediate tensors share one arena, a tensor's bytes reused once its last
reader has run. Greedy first-fit by decreasing size over lifetimes in step order.

Kernel-local DRAM buffers (the partials of a two-phase reduction) live for their one step and
share the arena too; a tensor that an output or input is a view of lives outside it, since
the caller holds it beyond the last step."""
from __future__ import annotations

from dataclasses import dataclass

from gir.frontend.basic import BasicOp
from gir.ir import DRAM
from gir.ir.dtypes import itemsize

ALIGN = 256  # bytes: what cudaMalloc guarantees, and enough for any vector load


@dataclass
class MemoryPlan:
    offsets: dict[str, int]              # intermediate tensor -> byte offset in the arena
    scratch: dict[tuple[int, str], int]  # (step index, kernel-local DRAM buffer) -> byte offset
    arena_bytes: int                     # peak bytes with reuse
    unshared_bytes: int                  # bytes if every intermediate had its own buffer

    @property
    def peak_bytes(self) -> int:
        return self.arena_bytes


def scratch_buffers(graph) -> list:
    """DRAM buffers of a GIR-Graph that are neither model tensors nor constants."""
    return [b for b in graph.buffers.values() if b.level == DRAM and b.role == "temp"]


def _steps_io(plan):
    for step in plan.steps:
        if isinstance(step, BasicOp):
            yield step.inputs, step.outputs
        else:
            yield step.reads, step.writes


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def plan_memory(plan) -> MemoryPlan:
    g = plan.graph

    def root(t):
        return plan.aliases.get(t, t)

    keep = {root(t) for t in (*g.inputs, *g.outputs)} | {n for n, t in g.tensors.items() if t.value is not None}
    first, last = {}, {}
    for i, (ins, outs) in enumerate(_steps_io(plan)):
        for t in outs:
            first.setdefault(root(t), i)
            last.setdefault(root(t), i)
        for t in ins:
            last[root(t)] = i
    size = {t: _aligned(g.tensors[t].size * itemsize(g.tensors[t].dtype)) for t in first if t not in keep}
    for i, step in enumerate(plan.steps):
        if not isinstance(step, BasicOp):
            for b in scratch_buffers(step.graph):
                first[i, b.name] = last[i, b.name] = i
                size[i, b.name] = _aligned(b.nbytes)
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first step, last step)
    offsets = {}
    for t in sorted(size, key=lambda t: (-size[t], first[t], str(t))):
        offset = 0
        for lo, hi, a, b in sorted(placed):
            overlaps_in_time = not (last[t] < a or b < first[t])
            if overlaps_in_time and offset < hi and lo < offset + size[t]:
                offset = hi
        offsets[t] = offset
        placed.append((offset, offset + size[t], first[t], last[t]))
    arena = max((hi for _, hi, _, _ in placed), default=0)
    tensors = {t: o for t, o in offsets.items() if isinstance(t, str)}
    scratch = {t: o for t, o in offsets.items() if not isinstance(t, str)}
    return MemoryPlan(tensors, scratch, arena, sum(size.values()))


def locate(plan, memory: MemoryPlan, step: int, buf) -> tuple[str, object]:
    """Where a kernel's DRAM parameter lives: ("arena", byte offset), ("const", tensor), or
    ("run", tensor) for an input or output bound at each run."""
    if buf.role == "temp":
        return "arena", memory.scratch[step, buf.name]
    name = plan.aliases.get(buf.name, buf.name)
    if name in memory.offsets:
        return "arena", memory.offsets[name]
    return ("const" if plan.graph.tensors[name].value is not None else "run"), name


def output_roots(plan) -> set[str]:
    """Tensors the outputs are stored in that a run allocates (not inputs or constants)."""
    g = plan.graph
    roots = {plan.aliases.get(n, n) for n in g.outputs}
    return {r for r in roots if r not in g.inputs and g.tensors[r].value is None}
