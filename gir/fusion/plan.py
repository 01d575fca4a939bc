"""Graph-level planning of a whole model: partition, movement composition, grouping of
memory-intensive ops into fused GIR-Graphs, search over parallel structures ranked by the
performance model, and structural-hash reuse for repeated layers.

The result is an ordered list of steps (library calls and GIR-Graphs) with, per subgraph, the
DRAM bytes of three plans: one kernel per op, GIR, and the compulsory bound (each external
input read once, each escaping output written once).
"""
from __future__ import annotations

import time
from functools import partial
from dataclasses import dataclass, field, replace

import networkx as nx
import numpy as np

from gir.frontend.basic import BasicGraph, BasicOp
from gir.frontend.limits import max_group_ops
from gir.frontend.reference import execute_op
from gir.ir import DRAM, GIRGraph, GraphError
from gir.ir.cost import level_bytes
from gir.ir.dtypes import itemsize, np_dtype
from gir.ir.target import Target
from gir.ir.vector_access import wide_shares
from gir.backends.registry import lowering_check
from gir.rewrite import Step, optimize
from gir.templates import shape_only

from .compose import compose, copy_candidates
from .excess import CYCLE, GROUP_LIMIT, NO_STRUCTURE, ORDER, SLOWER, Excess, attribute, bound_shares
from .fold import provider
from .group import aligned, common_structures
from .chains import compose_elementwise_runs
from .merge import merge_graphs, rename_op
from .partition import LIBRARY_KINDS, Partition, partition
from .perf import Estimate, estimate, quick_estimate
from .commute import pooling_before_monotone_ops
from .recompute import recompute_cheap_producers
from .reorder import innermost_reductions
from .reblock import MIN_THREADS, missing_blocks, reblock_choices, shortfalls
from .spread import spread_choices


@dataclass
class Kernel:
    """One fused GIR-Graph (it may hold device syncs, i.e. several launches)."""
    name: str
    ops: list[str]
    graph: GIRGraph
    before: GIRGraph
    log: list[Step]
    estimate: Estimate
    explored: int
    rewrite_seconds: float = 0.0
    reused: bool = False
    unlowerable: str | None = None  # why the target's emitter cannot lower it (None: it can)

    @property
    def reads(self) -> list[str]:
        return [b.name for b in self.graph.buffers.values() if b.role in ("input", "const")]

    @property
    def writes(self) -> list[str]:
        return [b.name for b in self.graph.buffers.values() if b.role == "output"]


@dataclass
class Subgraph:
    """DRAM bytes of three plans. `gir_bytes` counts each distinct element a kernel touches
    once (re-reads of a broadcast operand or of overlapping windows assumed served by L2);
    `gir_access_bytes` counts every access."""
    ops: list[BasicOp]
    kernels: list[Kernel]
    unfused_bytes: int
    gir_bytes: int
    bound_bytes: int
    gir_access_bytes: int = 0
    excess: list[Excess] = field(default_factory=list)  # gir_bytes - bound_bytes, per tensor and why


@dataclass
class Plan:
    graph: BasicGraph
    target: Target
    partition: Partition
    subgraphs: list[Subgraph]
    steps: list = field(default_factory=list)     # BasicOp (library) or Kernel, in execution order
    aliases: dict[str, str] = field(default_factory=dict)  # view tensors -> the storage they share
    search_seconds: float = 0.0

    @property
    def kernels(self) -> list[Kernel]:
        return [k for s in self.subgraphs for k in s.kernels]


def _nbytes(graph: BasicGraph, names) -> int:
    return sum(graph.tensors[n].size * itemsize(graph.tensors[n].dtype) for n in names)


def plan(graph: BasicGraph, target: Target, limit: int = 6, progress=None, cache=None) -> Plan:
    """`limit`: parallel structures tried per group (deterministic order). `progress(i, n, text)`
    is called once per subgraph. `cache`: a mapping from a group's structure key to its searched
    and rewritten kernel; a persistent one makes a second compile skip the search. Where the
    time model finds a lowered matmul or conv far slower than its library call
    (`_back_to_library`), the model is planned once more with those ops in the library, and the
    faster plan by the model is kept (`time_checked`)."""
    start = time.perf_counter()
    cache = {} if cache is None else cache
    result = time_checked(graph, target, limit, progress, cache)[-1]
    result.search_seconds = time.perf_counter() - start
    return result


def time_checked(graph: BasicGraph, target: Target, limit: int, progress, cache) -> tuple:
    """(first plan, the plan with `_back_to_library`'s ops in the library or None, the plan
    kept): the second is kept only when its modelled time (GIR kernels plus library calls) is
    lower, since a kernel's time also holds the fused work around the lowered op."""
    first = _plan_once(graph, target, limit, progress, cache, {})
    back = _back_to_library(first, target)
    if not back:
        _note_kept_in_gir(first)
        return first, None, first
    second = _plan_once(graph, target, limit, progress, cache, back)
    kept = second if modelled_seconds(second) < modelled_seconds(first) else first
    _note_kept_in_gir(kept)
    return first, second, kept


def modelled_seconds(p: Plan) -> float:
    """GIR kernels' modelled time plus the library calls' (`Decision.library_s`, 0 unmodelled)."""
    return sum(k.estimate.seconds for k in p.kernels) + sum(d.library_s or 0.0 for d in p.partition.decisions
                                                             if d.library)


# A lowered op goes back to the library when its GIR kernels are modelled at more than the
# target's margin x the library call plus a round trip of its output (`library_margin`). This is
# the margin of a target whose library calls are not fitted to measurements (the HIP presets):
# there the call is FLOPs at the peak and bytes at the copy bandwidth, which put the calls an H100
# ran at a median 0.27x of their measured time (results/bench_gpu_run6.md), so a kernel must model
# at 3x before the library is taken to be faster. The CUDA presets fit their calls and use 1
# (their `library_calls`).
LIBRARY_MARGIN = 3.0


def library_margin(target: Target) -> float:
    """How many times its library calls a lowered op's GIR kernels may model at and stay in GIR."""
    return (target.extra.get("library_calls") or {}).get("margin", LIBRARY_MARGIN)


def _back_to_library(result: Plan, target: Target) -> dict[str, str]:
    """Lowered matmuls/convs (op name -> why) whose kernels the time model puts at more than
    `library_margin` x their library calls (`Decision.library_s`; targets without a library model
    have none). Ops that share a kernel (an attention kernel holds both of a layer's products)
    are judged together, with every kernel that holds any of them, so those kernels go away whole."""
    back, margin = {}, library_margin(target)
    for ops, gir_s, library_s in _time_checks(result):
        if gir_s > margin * library_s:
            for n in ops:
                back[n] = _time_check_words(ops, gir_s, library_s)
    return back


def _time_checks(result: Plan) -> list[tuple[set, float, float]]:
    """(lowered ops judged together, their GIR kernels' modelled seconds, their library calls'),
    per group of lowered ops that share kernels."""
    lowered = {d.op: d.library_s for d in result.partition.decisions if not d.library and d.library_s}
    return [(ops, sum(k.estimate.seconds for k in kernels), sum(lowered[n] for n in ops))
            for ops, kernels in lowered_groups(result, lowered)]


def lowered_groups(result: Plan, lowered) -> list[tuple[set, list]]:
    """(ops of `lowered` judged together, the kernels of `result` that hold any of them): ops that
    share a kernel are one group. Also scripts/bench_gpu.py's, which times both sides on a GPU."""
    joined = nx.Graph()
    holding = []  # (kernel, the lowered ops it holds)
    for k in result.kernels:
        mine = sorted(n for n in lowered if any(o == n or o.startswith(n + "/") for o in k.ops))
        if mine:
            holding.append((k, mine))
            joined.add_nodes_from(mine)
            joined.add_edges_from(zip(mine, mine[1:]))
    return [(ops, [k for k, mine in holding if ops & set(mine)]) for ops in nx.connected_components(joined)]


def _time_check_words(ops: set, gir_s: float, library_s: float) -> str:
    what, calls = (("its GIR kernels model", "a library call with its output") if len(ops) == 1 else
                   (f"the GIR kernels it shares with {len(ops) - 1} more lowered op{'s' if len(ops) > 2 else ''} model",
                    "library calls with their outputs"))
    return f"{what} at {gir_s * 1e6:.1f} us against {library_s * 1e6:.1f} us as {calls} written and read once"


def _note_kept_in_gir(result: Plan) -> None:
    """Add the time check's figures to the reason of every lowered op the kept plan runs in GIR
    (`gir explain`'s partition table): a kernel modelled at up to `library_margin` x its library
    call stays in GIR, and a reader should see where it does."""
    by_op, margin = {d.op: d for d in result.partition.decisions}, library_margin(result.target)
    for ops, gir_s, library_s in _time_checks(result):
        ratio = gir_s / library_s if library_s else float("inf")
        verdict = ("kept in GIR, within the time check's margin of "
                   f"{margin:g}x" if ratio > 1 else "kept in GIR")
        note = f"; time check: {_time_check_words(ops, gir_s, library_s)} ({ratio:.2f}x): {verdict}"
        for n in ops:
            by_op[n].reason += note


def _plan_once(graph: BasicGraph, target: Target, limit: int, progress, cache, give_back: dict[str, str]) -> Plan:
    part = partition(_fold_shape_only(graph), target, give_back)
    given_graph, given_subgraphs = part.graph, part.subgraphs
    g, subgraphs = compose_elementwise_runs(part.graph, part.subgraphs)
    g, subgraphs = pooling_before_monotone_ops(g, subgraphs)
    g, subgraphs = recompute_cheap_producers(g, subgraphs, target)
    g, subgraphs = innermost_reductions(g, subgraphs)
    g, subgraphs = recompute_cheap_producers(g, subgraphs, target)  # windows reorder split into single views
    part = replace(part, graph=g, subgraphs=subgraphs)
    result = Plan(g, target, part, [])
    lowers = lowering_check(target)
    for i, (ops, given) in enumerate(zip(part.subgraphs, given_subgraphs)):
        if progress:
            progress(i, len(part.subgraphs), ", ".join(op.name for op in ops[:3]) + (" ..." if len(ops) > 3 else ""))
        result.subgraphs.append(_plan_subgraph(g, ops, target, limit, cache, result.aliases, (given_graph, given), lowers))
    result.steps = _order(g, part.library, result.kernels, result.aliases)
    pruned = without_dead_constants(result)
    result.graph, result.partition = pruned, replace(result.partition, graph=pruned)
    return result


def without_dead_constants(p: Plan) -> BasicGraph:
    """The plan's graph without the constants nothing reads: no op of the graph, no kernel's
    buffer, no library step, no alias, not an output. Folding a layout into its reader leaves
    its constant operand behind (GPT-2 decode kept each weight three times: as given, as
    `weight_T` and as `expand_b`, 1.64 GB of constants for 0.65 GB of weights), and the engine,
    the session cache and its load time paid for all of them."""
    g = p.graph
    used = {t for op in g.ops for t in (*op.inputs, *op.outputs)} | set(g.inputs) | set(g.outputs)
    used |= set(p.aliases) | set(p.aliases.values())
    used |= {b for k in p.kernels for b in k.graph.buffers}
    used |= {t for s in p.steps if isinstance(s, BasicOp) for t in (*s.inputs, *s.outputs)}
    dead = {n for n, t in g.tensors.items() if t.value is not None and n not in used}
    if not dead:
        return g
    return replace(g, tensors={n: t for n, t in g.tensors.items() if n not in dead})


def _fold_shape_only(graph: BasicGraph) -> BasicGraph:
    """Ops that read no data (an empty operand) become constants computed here."""
    folded = [op for op in graph.ops if shape_only(op, graph.tensors)]
    if not folded:
        return graph
    tensors = dict(graph.tensors)
    for op in folded:
        args = [np.zeros(tensors[t].shape, np_dtype(tensors[t].dtype)) if tensors[t].value is None else tensors[t].value
                for t in op.inputs]
        out = tensors[op.outputs[0]]
        tensors[out.name] = replace(out, value=execute_op(op, tensors, args))
    ops = [op for op in graph.ops if not shape_only(op, graph.tensors)]
    return replace(graph, tensors=tensors, ops=ops)


def _plan_subgraph(g: BasicGraph, ops: list[BasicOp], target, limit, cache, aliases, given, lowers) -> Subgraph:
    """`given`: the partition's graph and this subgraph's ops before the graph rewrites
    (recompute, reorder), on which the one-kernel-per-op and bound bytes are counted."""
    comp = compose(g, ops)
    aliases.update(comp.aliases)
    absorbed = {id(op) for op in comp.absorbed}
    rest = [op for op in ops if id(op) not in absorbed]
    cands_for, unread = provider(g, comp, target)
    for op in rest:
        cands_for(op)
    still_read = {t for op in g.ops if id(op) not in absorbed for t in op.inputs
                  if t not in unread.get(op.name, set())} | set(g.outputs) | comp.materialized
    comp.written = [t for t in comp.written if t in still_read]
    kernels = []
    for cands in copy_candidates(g, comp, target, []):
        kernels.append(_best([[c] for c in cands], f"copy:{cands[0].op}", [cands[0].op], limit, None, lowers))
    copies = {b for k in kernels for b in k.graph.buffers}
    rest = [op for op in rest if not _folded_away(op, g, ops, rest, cands_for, copies, unread, aliases)]
    inside = {id(op) for op in ops}
    outside = {aliases.get(t, t) for op in g.ops if id(op) not in inside for t in op.inputs}
    outside |= {aliases.get(t, t) for t in g.outputs} | {aliases.get(b.name, b.name) for k in kernels
                                                       for b in k.graph.buffers.values() if b.role == "input"}
    fuse = partial(_fuse_group, g, lowers=lowers, limit=limit, cache=cache, aliases=aliases, cands_for=cands_for)
    fused, not_chosen = _fused_groups(g, rest, ops, outside, fuse, cands_for, aliases)
    kernels += fused
    g0, ops0 = given
    produced = {t for op in ops0 for t in op.outputs}
    external = {aliases.get(t, t) for op in ops0 for t in op.inputs if t not in produced}
    escaping = _escaping(g0, ops0)
    unfused = sum(_nbytes(g0, set(op.inputs) | set(op.outputs)) for op in ops0 if op.kind != "view")
    gir = sum(k.estimate.dram_bytes for k in kernels)
    accessed = sum(sum(level_bytes(k.graph).values()) for k in kernels)
    external_reads = {t: _compulsory_read(g0, ops0, t, aliases) for t in external - escaping}
    bound = _nbytes(g0, escaping) + sum(external_reads.values())
    excess = attribute(
        kernels, bound_shares(g0, escaping, external_reads, aliases), {op.name: op for op in ops},
        reads=lambda op: {aliases.get(t, t): t not in op.inputs for t in (*_sources(op, cands_for), *op.inputs)},
        writes=lambda op: {aliases.get(t, t) for t in op.outputs},
        why_apart=partial(_why_apart, _dependences(ops, lambda op: _sources(op, cands_for), aliases), cands_for,
                          not_chosen))
    return Subgraph(ops, kernels, unfused, gir, bound, accessed, excess)


def _why_apart(dag: nx.DiGraph, cands_for, not_chosen: list[list[BasicOp]], writer_ops: list[BasicOp],
               producer: BasicOp, reader: BasicOp) -> str:
    """Why `reader` is not in the kernel of `writer_ops` that holds its `producer` (see
    excess.py). `not_chosen`: the groups of the grouping the performance model ranked second."""
    if any(reader in group and producer in group for group in not_chosen):
        return SLOWER
    if not aligned([cands_for(o).candidates for o in (*writer_ops, reader)]):
        return NO_STRUCTURE
    if _reenters(dag, {o.name for o in writer_ops}, reader.name):
        return CYCLE
    if len(writer_ops) >= max_group_ops():
        return GROUP_LIMIT
    return ORDER


def _fused_groups(g, ops, subgraph, outside: set[str], fuse, cands_for, aliases) -> tuple[list[Kernel], list]:
    """Kernels of the greedy grouping, formed twice: with ops joining a group they read only
    through a folded layout (P @ V reading the probabilities through its broadcast: attention
    is then one kernel) and without (a conv window reading its producer's neighbours would keep
    a device sync in the group and drag its structure, or split a product from its sum). The
    one the performance model finds faster is kept, one the emitter lowers whole first; the
    other's groups are returned too, to explain what was not fused."""
    def reads(group):
        return {aliases.get(t, t) for op in group for t in _sources(op, cands_for)}

    def kernels_of(groups, around=frozenset()):
        read = [reads(group) for group in groups]
        out = []
        for i, group in enumerate(groups):
            elsewhere = outside.union(around, *(r for j, r in enumerate(read) if j != i))
            try:
                out.append(fuse(group, escaping={t for op in group for t in op.outputs if aliases.get(t, t) in elsewhere}))
            except GraphError:
                if len(group) == 1:
                    raise
                # no merged structure fits (a block's registers): each op a kernel of its own
                out += kernels_of([[op] for op in group], around.union(*(r for j, r in enumerate(read) if j != i)))
        return out

    direct = _groups(g, ops, subgraph, cands_for, aliases, through_folds=False)
    folded = _groups(g, ops, subgraph, cands_for, aliases, through_folds=True)
    best, not_chosen = kernels_of(direct), []
    if folded != direct:
        other, not_chosen = kernels_of(folded), folded
        if _clearly_faster(_modelled(other), _modelled(best)):
            best, not_chosen = other, direct
    return best, not_chosen


# A modelled difference smaller than this share is no difference: the model's constants are
# rounded figures, and a tie keeps the simpler grouping (no device sync inside a kernel).
RANK_TOLERANCE = 0.01


def _clearly_faster(a: tuple, b: tuple) -> bool:
    """Grouping `a` ranks before `b`: lowerable first, then fewer DRAM bytes (moving the fewest
    bytes is the first objective; a grouping that moves more is never kept for modelled time),
    then modelled time beyond the tolerance."""
    if a[0] != b[0]:
        return a[0] < b[0]
    if a[2] != b[2]:
        return a[2] < b[2]
    return a[1] < b[1] * (1 - RANK_TOLERANCE)


def _modelled(kernels: list[Kernel]) -> tuple[bool, float, int]:
    return (any(k.unlowerable for k in kernels), sum(k.estimate.seconds for k in kernels),
            sum(k.estimate.dram_bytes for k in kernels))


def _compulsory_read(g: BasicGraph, ops: list[BasicOp], name: str, aliases) -> int:
    """Bytes of an external input that any plan must read: all of it, except a table only
    gathered from (an embedding), of which at most the gathered rows."""
    readers = [op for op in ops if name in {aliases.get(t, t) for t in op.inputs}]
    whole = _nbytes(g, [name])
    if readers and all(op.kind == "gather" and aliases.get(op.inputs[0], op.inputs[0]) == name
                       and name not in {aliases.get(t, t) for t in op.inputs[1:]} for op in readers):
        return min(whole, _nbytes(g, {op.outputs[0] for op in readers}))
    return whole


def _folded_away(op: BasicOp, g: BasicGraph, ops, rest, cands_for, copies, unread, aliases) -> bool:
    """A pad every reader now reads through (padfold): nothing needs its output. A reader of a
    view that is the pad's storage (an Identity of it) reads the pad too: a Gather of one kept
    reading a tensor no step wrote (fuzzing)."""
    out = op.outputs[0]
    if op.kind != "pad" or out in _escaping(g, ops) or out in copies or not any(out in u for u in unread.values()):
        return False
    names = {out} | {t for t, storage in aliases.items() if storage == out}
    return not any(names & c.graph.buffers.keys() for r in rest if r is not op for c in cands_for(r).candidates)


def _escaping(g: BasicGraph, ops: list[BasicOp]) -> set[str]:
    """Tensors `ops` produce that the model returns or another op reads."""
    inside = {id(op) for op in ops}
    produced = {t for op in ops for t in op.outputs}
    used = {t for op in g.ops if id(op) not in inside for t in op.inputs} | set(g.outputs)
    return produced & used


def _groups(g: BasicGraph, ops: list[BasicOp], subgraph: list[BasicOp], cands_for, aliases,
            through_folds: bool) -> list[list[BasicOp]]:
    """Greedy, in program order: an op joins the current group when it reads something the
    group produced, every op of the group still shares a parallel primitive with it, and no
    path from the group reaches it through an op outside the group (the kernel would then
    both feed and wait for that op), and the group holds fewer than `max_group_ops()` ops
    (rewriting a group takes time quadratic in its size; see gir/frontend/limits.py). Views that share storage (aliases) are no hop: their
    readers read the storage. `through_folds`: nor is a layout folded into its reader, which
    reads the layout's source."""
    fused = {id(op) for op in ops}

    def reads(op):
        return _sources(op, cands_for) if through_folds and id(op) in fused else op.inputs
    dag = _dependences(subgraph, reads, aliases)
    groups, current = [], []
    produced: set[str] = set()
    cap = max_group_ops()
    for op in ops:
        joins = 0 < len(current) < cap and any(aliases.get(t, t) in produced for t in reads(op)) and \
            not _reenters(dag, {o.name for o in current}, op.name) and \
            aligned([cands_for(o).candidates for o in (*current, op)])
        if joins:
            current.append(op)
        else:
            if current:
                groups.append(current)
            current = [op]
        produced |= set(op.outputs)
    if current:
        groups.append(current)
    return groups


def _dependences(subgraph: list[BasicOp], reads, aliases) -> nx.DiGraph:
    """Producer -> reader edges between the subgraph's ops (`reads(op)`: what op reads)."""
    dag = nx.DiGraph()
    producer = {aliases.get(t, t): op.name for op in subgraph for t in op.outputs if t not in aliases}
    for op in subgraph:
        dag.add_node(op.name)
        dag.add_edges_from((producer[aliases.get(t, t)], op.name) for t in reads(op) if aliases.get(t, t) in producer)
    return dag


def _sources(op: BasicOp, cands_for) -> list[str]:
    """What op reads: its inputs, or where it reads a folded layout, the layout's source."""
    cands = cands_for(op).candidates
    if not cands:
        return op.inputs
    return [b.name for b in cands[0].graph.buffers.values() if b.role == "input"]


def _reenters(dag: nx.DiGraph, group: set[str], name: str) -> bool:
    outside = [p for p in dag.predecessors(name) if p not in group]
    return any(group & nx.ancestors(dag, p) for p in outside)


def _fuse_group(g, ops, *, lowers, limit, cache, aliases, cands_for, escaping) -> Kernel:
    """`escaping`: what the group writes that another kernel, a library op or the caller reads
    (a layout folded into its reader is no reader: the reader reads its source)."""
    per_op = [[_aliased(c, aliases) for c in cands_for(op).candidates] for op in ops]
    choices = common_structures(per_op)
    name = "+".join(op.name for op in ops)
    key, names = _structure_key(g, merge_graphs(name, [c.graph for c in choices[0]], escaping))
    if key in cache:
        kernel, old_names = cache[key]
        return _renamed(kernel, dict(zip(old_names, names)), [op.name for op in ops])
    kernel = _best(choices, name, [op.name for op in ops], limit, escaping, lowers)
    cache[key] = (kernel, names)
    return kernel


def _best(choices, name, op_names, limit, escaping, lowers) -> Kernel:
    """The fastest of `limit` shortlisted choices by the performance model, among those the
    target's emitter lowers (when none does, the fastest: emitting it names the problem)."""
    ranked, rewrite, refused = [], 0.0, []
    first = shortlist(choices, limit)
    later = [c for c in choices if not any(c is f for f in first)]  # tried only while none fits
    for i, chosen in enumerate(first + later):
        if i >= len(first) and ranked:
            break
        merged = chosen[0].graph if escaping is None else merge_graphs(name, [c.graph for c in chosen], escaping)
        start = time.perf_counter()
        try:  # each operator's candidate fits the target; merged, they may not (registers a block holds)
            optimized, log = optimize(merged)
        except GraphError as err:
            refused.append(str(err).splitlines()[-1].strip())
            continue
        finally:
            rewrite += time.perf_counter() - start
        ranked.append(Kernel(name, op_names, optimized, merged, log, estimate(optimized), 0))
        dram = ranked[-1].estimate.dram_bytes
        for spread in spread_choices(optimized):  # a CPU thread's units side by side (gir/fusion/spread.py)
            step = Step("spread-units", spread.description, dram, dram)
            ranked.append(Kernel(name, op_names, spread.graph, merged, [*log, step], estimate(spread.graph), 0))
        for regrouped in reblock_choices(optimized):  # a GPU launch that fills the device (gir/fusion/reblock.py)
            step = Step("reblock", regrouped.description, dram, dram)
            ranked.append(Kernel(name, op_names, regrouped.graph, merged, [*log, step], estimate(regrouped.graph), 0))
    if not ranked:
        raise GraphError(f"{name}: no fused structure fits the target: {'; '.join(sorted(set(refused)))}")
    ranked = _ranked(ranked)
    best = ranked[0]
    for k in ranked:
        k.unlowerable = lowers(k.graph)
        if k.unlowerable is None:
            best = k
            break
    best.explored, best.rewrite_seconds = len(ranked), rewrite
    return best


def _ranked(kernels: list[Kernel]) -> list[Kernel]:
    """Fastest first. Within RANK_TOLERANCE of the fastest the model calls it a tie, which goes
    to fewer DRAM bytes (the compulsory-traffic objective comes first), then to blocks of 128
    threads or more for a kernel of a megabyte or more (`_small_big_blocks`), then to the structure
    whose DRAM bytes move in wider accesses (see gir.ir.vector_access), then to a launch that
    falls least short of filling the machine (`_launch_shortfalls`), then to more blocks where
    there are fewer than two per SM / CU (`_missing_blocks`: more of the device at work), then
    to more threads per block (more warps resident under the block limit, latency the model
    does not see hidden), then to the modelled time and the template's order."""
    fastest = min(k.estimate.seconds for k in kernels)

    def key(k):
        if k.estimate.seconds > fastest * (1 + RANK_TOLERANCE):
            return (1, 0, 0, 0.0, 0, k.estimate.seconds)
        return (0, k.estimate.dram_bytes, _small_big_blocks(k.graph, k.estimate.dram_bytes), *_narrowness(k.graph),
                _launch_shortfalls(k.graph), _missing_blocks(k.graph), -k.graph.prim.units_per_block, k.estimate.seconds)
    return sorted(kernels, key=key)


BIG_KERNEL_BYTES = 1 << 20


def _small_big_blocks(graph, dram_bytes: int) -> int:
    """1 for a kernel moving a megabyte or more in blocks under 128 threads on a GPU: such a
    kernel keeps few warps per SM, which a near-tie in wider accesses does not excuse (ViT's
    LayerNorm, 1.2 MB: two units of four floats a lane against six, both 16 bytes a lane).
    Smaller kernels are launch-bound, and there the wider access decides (BERT-fp16's
    LayerNorm, 0.4 MB: three units of eight halves a lane)."""
    return int(dram_bytes >= BIG_KERNEL_BYTES and _small_blocks(graph))


def _small_blocks(graph) -> bool:
    """Blocks under 128 threads on a target with 16-byte accesses (a GPU; the CPU's one-unit
    blocks say nothing)."""
    t = graph.target
    return t.timing.widest_access_bytes >= 16 and graph.prim.units_per_block * t.lanes_per_unit < MIN_THREADS


def _narrowness(graph) -> tuple[float, float]:
    """Sort key, wider first: the share of DRAM bytes moved 16 bytes at a time, then by any
    vector access (a fp16 LayerNorm row split over three units of eight halves a lane before
    six units of four)."""
    return tuple(-round(share, 3) for share in wide_shares(graph, (16, 0)))


def _launch_shortfalls(graph) -> int:
    """How far a launch falls short of the shape a GPU kernel should have unless it is tiny
    (`reblock.shortfalls`: one for blocks under 128 threads, one for fewer than two blocks per
    SM / CU; 0 fills the machine). Graded, so that where no structure has both (ViT's
    LayerNorm: 197 rows, one a block) the one with 192-thread blocks beats the one with 96. 0 on
    targets without 16-byte accesses (the CPU: one-unit blocks, where this says nothing)."""
    t = graph.target
    return shortfalls(graph.prim, t) if t.timing.widest_access_bytes >= 16 else 0


def _missing_blocks(graph) -> int:
    """Blocks short of two per SM / CU on a GPU (`reblock.missing_blocks`), 0 on the CPU."""
    t = graph.target
    return missing_blocks(graph.prim, t) if t.timing.widest_access_bytes >= 16 else 0


# The quick estimate sums each operator's kernel alone, launches included, so a structure's
# share of it is diluted: BERT-fp16's softmax group (eight ops, launch-bound) quick-estimates
# its eight-halves-a-lane form 3.9% above the scalar one, and after rewriting both model at
# 2.64 us. On targets with 16-byte accesses, a structure within this much of the fastest is a
# tie for the shortlist, which the wider accesses win; the rewritten candidates are then ranked
# with RANK_TOLERANCE.
SHORTLIST_TOLERANCE = 0.10


def shortlist(choices: list[list], limit: int) -> list[list]:
    """The `limit` structures worth rewriting: the templates' first (the tiling the group's
    operators were written to agree on, which fuses best), then the others the time model
    ranks fastest as they stand, each operator's candidate alone (`quick_estimate`: the
    rewrite changes what a group keeps in registers, not how its structure uses the machine;
    ties as in `_ranked`: wider accesses, then launches that fill the machine)."""
    if len(choices) <= limit:
        return choices
    quick = [sum(quick_estimate(c.graph).seconds for c in chosen) for chosen in choices]
    fastest = min(quick[1:])
    wide = choices[0][0].graph.target.timing.widest_access_bytes >= 16
    tolerance = SHORTLIST_TOLERANCE if wide else RANK_TOLERANCE

    def key(i):  # as _ranked: a near-tie goes to big kernels' full blocks, then wider accesses
        if quick[i] > fastest * (1 + tolerance):
            return (1, 0, (0.0, 0.0), 0, quick[i], i)
        fused = _fused_bytes(choices[i])
        return (0, sum(_small_big_blocks(c.graph, fused) for c in choices[i]),
                tuple(map(sum, zip(*(_narrowness(c.graph) for c in choices[i])))),
                sum(_launch_shortfalls(c.graph) for c in choices[i]), quick[i], i)
    rest = sorted(range(1, len(choices)), key=key)
    return [choices[0]] + [choices[i] for i in rest[:limit - 1]]


def _fused_bytes(choice: list) -> int:
    """What a group's fused kernel will move, before it is merged: the DRAM buffers its ops read
    that none of them writes, and what its last op writes (the intermediates stay on chip). The
    ops' own estimates count every intermediate: each op of BERT-fp16's LayerNorm moves up to
    1.2 MB of fp32 alone, the fused kernel 0.4 MB of fp16."""
    written = {n for c in choice for n, b in c.graph.buffers.items() if b.level == DRAM and b.role == "output"}
    read = {n: b for c in choice for n, b in c.graph.buffers.items() if b.level == DRAM and b.role in ("input", "const")}
    last = choice[-1].graph.buffers
    return (sum(b.nbytes for n, b in read.items() if n not in written)
            + sum(b.nbytes for b in last.values() if b.level == DRAM and b.role == "output"))


def _aliased(cand, aliases):
    """A candidate whose reads of view tensors read the storage the view shares."""
    names = {b for b in cand.graph.buffers if b in aliases}
    if not names:
        return cand
    from copy import copy
    renamed = copy(cand)
    renamed.graph = _rename_graph(cand.graph, {n: aliases[n] for n in names})
    return renamed


def _rename_graph(graph: GIRGraph, mapping: dict[str, str]) -> GIRGraph:
    out = GIRGraph(graph.name, graph.prim, graph.target)
    for buf in graph.buffers.values():
        name = mapping.get(buf.name, buf.name)
        if name not in out.buffers:
            out.buffer(name, buf.level, buf.shape or buf.size, buf.dtype, buf.role)
    for _, op in graph.ops():
        out.add(rename_op(op, mapping))
    return out


def _structure_key(g: BasicGraph, merged: GIRGraph):
    """Identical groups (the repeated layers of a transformer) hash alike: the merged graph
    with its DRAM tensors renamed by order of declaration (small constants by value). `names`
    lists the real tensors in that order, so a cached kernel can be renamed onto another copy."""
    names = [b.name for b in merged.buffers.values() if b.level == "dram"]
    canon = {n: f"T{i}" for i, n in enumerate(names)}
    buffers = []
    for b in merged.buffers.values():
        value = g.tensors[b.name].value if b.level == "dram" and b.name in g.tensors else None
        small = value.tobytes() if value is not None and value.size <= 16 else None
        buffers.append((canon.get(b.name, b.name), b.level, b.size, b.dtype, b.role, small))
    ops = tuple(str(rename_op(op, canon)) for _, op in merged.ops())
    return (merged.prim, merged.target.name, tuple(buffers), ops), names


def _renamed(kernel: Kernel, mapping: dict[str, str], op_names) -> Kernel:
    by_buffer = {(key, mapping.get(name, name)): n for (key, name), n in kernel.estimate.dram_by_buffer.items()}
    return Kernel("+".join(op_names), op_names, _rename_graph(kernel.graph, mapping), _rename_graph(kernel.before, mapping),
                  kernel.log, replace(kernel.estimate, dram_by_buffer=by_buffer), kernel.explored, 0.0, reused=True,
                  unlowerable=kernel.unlowerable)


def _order(g: BasicGraph, library: list[BasicOp], kernels: list[Kernel], aliases) -> list:
    """Execution order: a topological order of library calls and kernels by the tensors they pass."""
    dag = nx.DiGraph()
    writers = {}    # a tensor can have several writers: the kernels that write a concat's parts
    steps = list(library) + list(kernels)
    for i, step in enumerate(steps):
        dag.add_node(i)
        outs = step.outputs if isinstance(step, BasicOp) else step.writes
        for t in outs:
            writers.setdefault(aliases.get(t, t), []).append(i)
    for i, step in enumerate(steps):
        ins = step.inputs if isinstance(step, BasicOp) else step.reads
        for t in ins:
            for w in writers.get(aliases.get(t, t), ()):
                if w != i:
                    dag.add_edge(w, i)
    position = {op.name: k for k, op in enumerate(g.ops)}

    def first_op(i):
        step = steps[i]
        return position[step.name] if isinstance(step, BasicOp) else min(position.get(n, 0) for n in step.ops)

    return [steps[i] for i in nx.lexicographical_topological_sort(dag, key=first_op)]


__all__ = ["Plan", "Subgraph", "Kernel", "plan", "LIBRARY_KINDS"]
