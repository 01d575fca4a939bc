"""Fusing a group of basic operators into one GIR-Graph: pick one candidate per operator so
that all share a parallel primitive, merge them, rewrite, and keep the best result.

"Best" is what the planner's search (gir/fusion/plan.py) would keep: the structures it
shortlists, rewritten, ranked by the same time model (gir/fusion/perf.py); ties go to fewer
DRAM bytes, then fewer device syncs, then fewer gOperators. Tests use this to fuse a chain the
way production does without planning a whole model.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from gir.frontend.basic import BasicGraph, BasicOp
from gir.ir import DEVICE, GIRGraph, Move, Sync
from gir.ir.cost import level_bytes
from gir.ir.target import DRAM, Target
from gir.rewrite import Step, optimize
from gir.templates import Candidate, candidates

from .merge import merge_graphs
from .regrid import common_refinement, family, regrid


class FusionError(ValueError):
    pass


@dataclass
class Fused:
    ops: list[BasicOp]
    chosen: list[Candidate]
    merged: GIRGraph
    graph: GIRGraph
    log: list[Step] = field(default_factory=list)
    explored: int = 0

    @property
    def device_syncs(self) -> int:
        return sum(1 for _, op in self.graph.ops() if isinstance(op, Sync) and op.scope == DEVICE)


def escaping_tensors(graph: BasicGraph, ops: list[BasicOp]) -> set[str]:
    """Tensors the group writes that someone outside it (or the model's caller) reads."""
    inside = {id(op) for op in ops}
    written = {t for op in ops for t in op.outputs}
    used_outside = {t for op in graph.ops if id(op) not in inside for t in op.inputs}
    return {t for t in written if t in used_outside or t in graph.outputs}


def _per_lane(c: Candidate) -> float:
    """DRAM elements the candidate's largest DRAM read gives each lane of a unit."""
    g = c.graph
    sizes = [op.dst.size for _, op in g.ops() if isinstance(op, Move) and g.buffers[op.src.buffer].level == DRAM]
    return max(sizes, default=0) / g.target.lanes_per_unit


def common_structures(per_op: list[list[Candidate]]) -> list[list[Candidate]]:
    """For each parallel primitive every operator offers (up to the layout of its grid, see
    regrid), the first such candidate per op, re-expressed over one common grid."""
    return [[_on_grid(c, grid) for c in chosen] for chosen, grid in aligned(per_op)]


def aligned(per_op: list[list[Candidate]]) -> list[tuple[list[Candidate], tuple]]:
    """(first candidate per op of one primitive family, their common grid), per family."""
    families = None
    for cands in per_op:
        offered = {family(c.graph.prim) for c in cands}
        families = offered if families is None else families & offered
    out, seen = [], set()
    for c0 in per_op[0]:
        key = family(c0.graph.prim)
        if key not in families or key in seen:
            continue
        seen.add(key)
        chosen = _one_lane_placement([[c for c in cands if family(c.graph.prim) == key] for cands in per_op])
        grid = common_refinement([c.graph.prim.grid for c in chosen])
        if grid is not None:
            out.append((chosen, grid))
    return out


def _one_lane_placement(in_family: list[list[Candidate]]) -> list[Candidate]:
    """Per op, its first candidate of the family (the tiling the templates list first, which
    decides the common grid), at one vector width every op offers for that tiling: the widest
    where the target issues 16-byte accesses, else the narrowest. Ops that place elements on
    lanes alike hand each other registers once merged, where mixed widths would re-read a
    shared input. An op whose tiling gives a unit fewer than two elements per lane (a bias or
    activation after a one-output-per-unit reduction) can place nothing wider and shares no
    register slice with the wide ops, so it does not narrow the others (GPT-2 decode's GEMVs
    read their weight rows one float per lane because their GELU epilogue offered only 1)."""
    def box(c):
        return c.structure, tuple(sorted((k, v) for k, v in c.params.items() if k not in ("vec", "runs")))
    twins = [[c for c in cands if box(c) == box(cands[0])] for cands in in_family]
    wide = in_family[0][0].graph.target.timing.widest_access_bytes >= 16
    runs = _row_runs(in_family, twins, wide)
    if runs is not None:
        return runs
    plain = [[c for c in same if "runs" not in c.params] or same for same in twins]
    offered = [{c.params.get("vec", 1) for c in same} for same in plain]
    narrowing = [o for o, same in zip(offered, plain) if o != {1} or _per_lane(same[0]) >= 2]
    common = set.intersection(*narrowing) if narrowing else {1}
    width = (max(common) if wide else min(common)) if common else 1
    return [next((c for c in same if c.params.get("vec", 1) == width), same[0]) for same in plain]


def _row_runs(in_family: list[list[Candidate]], twins: list[list[Candidate]], wide: bool) -> list[Candidate] | None:
    """Per op, its candidate for the widest `runs` placement (`vec` consecutive outputs a lane,
    the reduced elements in turn: `reduce._lane_runs`, `pointwise.row_runs`) the whole group
    can take, or None. Taken before any width along the last dimensions (where runs apply, the
    product's tiling offers none). An op that offers runs takes them; any other takes its
    family's first tiling along its last dimension at that width that is not a lane-per-row one
    (`lane`, `rows`: its lanes would hold whole rows): an epilogue over the outputs, four a
    lane, from a view that restarts with the sum at each output channel
    (`elementwise.cut_views`); an op whose tiling gives a lane under two elements keeps its own."""
    offered = {c.params["runs"] for same in twins for c in same if "runs" in c.params}
    if not wide or not offered:
        return None
    for v in sorted(offered, reverse=True):
        chosen = []
        for cands, same in zip(in_family, twins):
            pick = next((c for c in same if c.params.get("runs") == v), None)
            if pick is None:
                pick = next((c for c in cands if "runs" not in c.params and c.params.get("vec", 1) == v
                             and c.structure not in ("lane", "rows")), None)
            if pick is None and _per_lane(same[0]) < 2 and not any(c.params.get("vec", 1) > 1 for c in same):
                pick = same[0]
            if pick is None:
                break
            chosen.append(pick)
        else:
            return chosen
    return None


def _on_grid(cand: Candidate, grid) -> Candidate:
    return replace(cand, graph=regrid(cand.graph, grid))


def fuse(graph: BasicGraph, ops: list[BasicOp], target: Target, limit: int = 8) -> Fused:
    per_op = [candidates(op, graph.tensors, target).candidates for op in ops]
    choices = common_structures(per_op)
    if not choices:
        raise FusionError(f"{graph.model_name}: no parallel structure common to {[op.name for op in ops]}")
    escaping = escaping_tensors(graph, ops)
    from .perf import estimate
    from .plan import shortlist
    best, explored = None, 0
    for chosen in shortlist(choices, limit):
        merged = merge_graphs("+".join(op.name for op in ops), [c.graph for c in chosen], escaping)
        optimized, log = optimize(merged)
        explored += 1
        fused = Fused(ops, chosen, merged, optimized, log)
        traffic = level_bytes(optimized)
        key = (estimate(optimized).seconds, traffic["read"] + traffic["write"], fused.device_syncs, len(optimized))
        if best is None or key < best[0]:
            best = (key, fused)
    best[1].explored = explored
    return best[1]
