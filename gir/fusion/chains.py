"""Long runs of elementwise ops composed into one elementwise op before planning.

Why: a fused group is planned by merging one template per op and rewriting the result
(Algorithm 1), and every rewrite step is checked on the whole merged graph, so a group of n
ops costs about n^2 (a chain of 100 ReLUs took a minute, 10,000 would take days). The rewrite's
own merge-elementwise would end with the same single expression, so a run of at least
LONG_RUN elementwise ops, each the only reader of the one before (same shape and dtype, the
intermediate read once and by nothing else), is composed here first, in time linear in its
length. Expressions then get as deep as the run is long; every walk over them (gir.ir.expr,
the emitters, the rewrite rules) is iterative, and the emitted code is one SSA line per
operation either way. Shorter runs are left to the rewrite, so the passes after this one
(commute, recompute, excess attribution) see ordinary models as before.
"""
from __future__ import annotations

from dataclasses import replace

from gir.frontend.basic import BasicGraph, BasicOp
from gir.ir.expr import Input, substitute

LONG_RUN = 9  # ops: just over the zoo's longest run (8, GPT-2's tanh GELU), whose plans stay as they
# were; composing those too would be correct. 8 ReLUs plan in 1.2 s (the CPU target), 1.7 s (the H100 target).


def compose_elementwise_runs(graph: BasicGraph, subgraphs: list[list[BasicOp]]) -> tuple[BasicGraph, list[list[BasicOp]]]:
    t = graph.tensors
    users = graph.consumers()
    where = {id(op): i for i, sub in enumerate(subgraphs) for op in sub}
    outputs = set(graph.outputs)

    def feeds(p: BasicOp) -> BasicOp | None:
        """The reader p's result is composed into, if it is a run's link."""
        name = p.outputs[0]
        readers = users.get(name, [])
        if p.kind != "elementwise" or name in outputs or len(readers) != 1 or id(p) not in where:
            return None
        c = readers[0]
        out = t[c.outputs[0]]
        if c.kind != "elementwise" or where.get(id(c)) != where[id(p)] or c.inputs.count(name) != 1 \
                or t[name].shape != out.shape or t[name].dtype != out.dtype or out.dtype == "bool":
            return None  # same dtype, not bool: both compute in it, so Consts keep their type
        return c

    link = {id(p): c for p in graph.ops if (c := feeds(p)) is not None}
    root = {}  # op id -> id of the last op of its run (where the run's expression ends)
    for op in reversed(graph.ops):
        c = link.get(id(op))
        root[id(op)] = root[id(c)] if c is not None else id(op)
    size: dict[int, int] = {}
    for op in graph.ops:
        size[root[id(op)]] = size.get(root[id(op)], 0) + 1
    composed: dict[str, BasicOp] = {}  # tensor -> the composed op that produces it (within a run)
    dropped: set[int] = set()
    replaced: dict[int, BasicOp] = {}
    for op in graph.ops:
        if size[root[id(op)]] < LONG_RUN or op.kind != "elementwise":
            continue
        inner = [composed.pop(x) for x in op.inputs if x in composed]
        new = _compose(op, {p.outputs[0]: p for p in inner}) if inner else op
        if id(op) in link:
            composed[op.outputs[0]] = new
            dropped.add(id(op))
        else:
            replaced[id(op)] = new
    if not dropped:
        return graph, subgraphs

    def rebuilt(ops):
        return [replaced.get(id(op), op) for op in ops if id(op) not in dropped]
    gone = {op.outputs[0] for op in graph.ops if id(op) in dropped}
    tensors = {n: x for n, x in graph.tensors.items() if n not in gone}
    return replace(graph, tensors=tensors, ops=rebuilt(graph.ops)), [rebuilt(sub) for sub in subgraphs]


def _compose(c: BasicOp, inner: dict[str, BasicOp]) -> BasicOp:
    """c with the (already composed) producers `inner` of some of its inputs substituted in;
    each distinct tensor is one input of the result."""
    inputs: dict[str, int] = {}

    def index(name: str) -> Input:
        return Input(inputs.setdefault(name, len(inputs)))
    repl = {}
    for i, name in enumerate(c.inputs):  # producers' inputs first: the first keeps its numbering,
        if name in inner:                # so its tree is shared, not copied (linear in the run)
            p = inner[name]
            renumber = {j: index(x) for j, x in enumerate(p.inputs)}
            same = all(r.index == j for j, r in renumber.items())
            repl[i] = p.attrs["expr"] if same else substitute(p.attrs["expr"], renumber)
    for i, name in enumerate(c.inputs):
        if name not in inner:
            repl[i] = index(name)
    return replace(c, name=_run_name(c, inner), inputs=list(inputs), attrs=c.attrs | {"expr": substitute(c.attrs["expr"], repl)})


def _run_name(c: BasicOp, inner: dict[str, BasicOp]) -> str:
    """'<first op>..<last op>': what `gir explain` shows for the composed run."""
    first = next(iter(inner.values())).name.split("..")[0]
    return f"{first}..{c.name}"
