"""The greedy driver of Algorithm 1: apply sync insertion, merging and swapping until nothing
applies. Every application is tried on a copy and kept only if the graph stays valid, every
read stays covered by a sync, and DRAM traffic does not grow. Each kept application is logged
(rule, what changed, DRAM bytes before and after) for `gir explain`."""
from __future__ import annotations

from dataclasses import dataclass

from gir.ir import GIRGraph, validate
from gir.ir.cost import level_bytes
from gir.ir.scope import uncovered_reads
from gir.ir.validate import GraphError

from . import merging, relane, swapping, sync_insertion
from .query import slices_of
from .tidy import tidy

RULES = [
    ("sync-insertion", sync_insertion.find, sync_insertion.apply),
    ("relane", relane.find, relane.apply),
    ("merge-raw", merging.find_raw, merging.apply_raw),
    ("merge-copy", merging.find_copies, merging.apply_copy),
    ("merge-rar", merging.find_rar, merging.apply_rar),
    ("swap", swapping.find, swapping.apply),
    ("merge-elementwise", merging.find_elementwise, merging.apply_elementwise),
    ("dead-code", merging.find_dead, merging.apply_dead),
]


@dataclass
class Step:
    rule: str
    detail: str
    dram_before: int
    dram_after: int

    def __str__(self):
        return f"{self.rule}: {self.detail} [DRAM {self.dram_before} -> {self.dram_after} B]"


def _dram(g: GIRGraph) -> int:
    b = level_bytes(g)
    return b["read"] + b["write"]


def _trial_dram(g: GIRGraph) -> int | None:
    """DRAM bytes of a trial, counted before the soundness checks; None when a gOperator uses
    an undeclared buffer (nothing to count; validation would reject it)."""
    if any(s.buffer not in g.buffers for _, op in g.ops() for s in slices_of(op)):
        return None
    return _dram(g)


def optimize(graph: GIRGraph, max_steps: int = 10_000) -> tuple[GIRGraph, list[Step]]:
    """Rewrite to a fixed point; the input must itself be valid (GraphError otherwise)."""
    validate(graph)
    g, log = graph.copy(), []
    dram = _dram(g)
    dropped = tidy(g)
    if dropped:
        log.append(Step("tidy", f"{dropped} masks that hold for every unit dropped", dram, dram))
    progress = True
    while progress and len(log) < max_steps:
        progress = False
        for rule, find, apply in RULES:
            for site in find(g):
                if not _alive(g, site):
                    continue  # an earlier application this pass removed it
                trial = g.copy()
                detail = apply(trial, site)
                if detail is None:
                    continue
                after = _trial_dram(trial)
                if after is None or after > dram or not _sound(trial):  # cheap test first: most trials fail it
                    continue
                log.append(Step(rule, detail, dram, after))
                g, dram, progress = trial, after, True
    return g, log


def _alive(g: GIRGraph, site) -> bool:
    if isinstance(site, str):
        return site in g.buffers
    nodes = site if isinstance(site, tuple) else (site,)
    return all(g.graph.has_node(n) for n in nodes)


def _sound(g: GIRGraph) -> bool:
    try:
        validate(g)
    except GraphError:
        return False
    return not uncovered_reads(g)
