"""The report's pictures: the partition of a model (library calls and fused subgraphs, joined by
the tensors they pass) and a GIR-Graph (gOperators, syncs as diamonds, dashed edges for
write-after-read and write-after-write order)."""
from __future__ import annotations

from gir.ir import GIRGraph, Sync
from gir.ir.target import SCOPE_NAMES

from .svg import Node, clip, dag_svg

LIBRARY_FILL, SUBGRAPH_FILL = "#cfe2f3", "#fce5cd"
GOP_FILL = {"Move": "#ffffff", "Elementwise": "#d9ead3", "Reduce": "#d9d2e9", "Broadcast": "#fff2cc",
            "Gather": "#f4cccc"}
SYNC_FILL = ("#ffffff", "#eeeeee", "#fff2cc", "#f4cccc")  # lane, unit, block, device


def partition_svg(plan) -> str:
    """One node per library call and per memory-intensive subgraph, in the plan's step order."""
    owner, nodes = {}, []
    for i, sub in enumerate(plan.subgraphs):
        launches = sum(k.estimate.kernels for k in sub.kernels)
        nodes.append(Node(("s", i), [f"subgraph {i}", f"{len(sub.ops)} ops, {launches} launch(es)",
                                     clip(sub.ops[0].name)], SUBGRAPH_FILL))
        owner.update({id(op): ("s", i) for op in sub.ops})
    for op in plan.partition.library:
        nodes.append(Node(("l", op.name), [f"library {op.kind}", clip(op.name)], LIBRARY_FILL))
        owner[id(op)] = ("l", op.name)
    ops = [op for op in plan.graph.ops if id(op) in owner]
    producer = {t: owner[id(op)] for op in ops for t in op.outputs}
    edges = list(dict.fromkeys((producer[t], owner[id(op)], False) for op in ops for t in op.inputs
                               if t in producer and producer[t] != owner[id(op)]))
    by_key = {n.key: n for n in nodes}
    first = {}
    for k, op in enumerate(ops):
        first.setdefault(owner[id(op)], k)
    ordered = _topological([by_key[key] for key in sorted(by_key, key=lambda key: first.get(key, 0))], edges)
    title = f"{plan.graph.model_name} on {plan.target.name}: {len(plan.partition.library)} library calls, " \
            f"{len(plan.subgraphs)} fused subgraphs"
    return dag_svg(ordered, edges, title)


def gir_svg(graph: GIRGraph, title: str) -> str:
    nodes = []
    for node, op in graph.ops():
        if isinstance(op, Sync):
            nodes.append(Node(node, [f"#{node} Sync({SCOPE_NAMES[op.scope]})", clip(op.slice.buffer, 28)],
                              SYNC_FILL[op.scope], diamond=True))
            continue
        out = op.writes()[0].buffer
        level = graph.buffers[out].level if out in graph.buffers else ""
        nodes.append(Node(node, [f"#{node} {op.kind}", "-> " + clip(out), level], GOP_FILL.get(op.kind, "#ffffff")))
    edges = [(a, b, data["kind"] != "raw") for a, b, data in graph.graph.edges(data=True)]
    return dag_svg(nodes, edges, clip(title, 100) + f"  [{graph.prim}]")


def _topological(nodes: list[Node], edges) -> list[Node]:
    """`nodes` reordered so every edge points forward, keeping the given order where it can
    (a subgraph may feed a library call that comes earlier in the model's op list)."""
    preds = {n.key: {a for a, b, _ in edges if b == n.key} for n in nodes}
    done, out, pending = set(), [], list(nodes)
    while pending:
        ready = next(n for n in pending if preds[n.key] <= done)
        pending.remove(ready)
        out.append(ready)
        done.add(ready.key)
    return out
