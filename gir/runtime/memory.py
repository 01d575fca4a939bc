"""Memory planning: intermediate tensors share one arena, a tensor's bytes reused once its last
reader has run. Greedy first-fit by decreasing size over lifetimes in step order."""
from __future__ import annotations

from dataclasses import dataclass

from gir.frontend.basic import BasicOp
from gir.ir.dtypes import itemsize

ALIGN = 256  # bytes: what cudaMalloc guarantees, and enough for any vector load


@dataclass
class MemoryPlan:
    offsets: dict[str, int]      # intermediate tensor -> byte offset in the arena
    arena_bytes: int             # peak bytes with reuse
    unshared_bytes: int          # bytes if every intermediate had its own buffer


def _steps_io(plan):
    for step in plan.steps:
        if isinstance(step, BasicOp):
            yield step.inputs, step.outputs
        else:
            yield step.reads, step.writes


def plan_memory(plan) -> MemoryPlan:
    g = plan.graph
    keep = set(g.inputs) | set(g.outputs) | {n for n, t in g.tensors.items() if t.value is not None}
    first, last = {}, {}
    for i, (ins, outs) in enumerate(_steps_io(plan)):
        for t in outs:
            t = plan.aliases.get(t, t)
            first.setdefault(t, i)
            last.setdefault(t, i)
        for t in ins:
            last[plan.aliases.get(t, t)] = i
    temps = [t for t in first if t not in keep]
    size = {t: -(-g.tensors[t].size * itemsize(g.tensors[t].dtype) // ALIGN) * ALIGN for t in temps}
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first step, last step)
    offsets = {}
    for t in sorted(temps, key=lambda t: (-size[t], first[t])):
        offset = 0
        for lo, hi, a, b in sorted(placed):
            overlaps_in_time = not (last[t] < a or b < first[t])
            if overlaps_in_time and offset < hi and lo < offset + size[t]:
                offset = hi
        offsets[t] = offset
        placed.append((offset, offset + size[t], first[t], last[t]))
    arena = max((hi for _, hi, _, _ in placed), default=0)
    return MemoryPlan(offsets, arena, sum(size.values()))
