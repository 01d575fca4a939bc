"""Gather indices checked on every engine: an out-of-range index is an error naming the node,
never a clamped (silently wrong) row.

Two checks, because a kernel cannot raise: on the host, before anything runs, the indices
that come straight from a graph input (through views only: the embedding lookup of every
language model); and, for indices computed inside the graph, a flag the kernel sets where it
clamped an index (the CPU engine reads it after each kernel that gathers). The interpreter
checks every index itself."""
from __future__ import annotations


class GatherIndexError(ValueError):
    """An index outside [-n, n) of the axis it selects from; the message names model and node."""


def input_gathers(plan) -> list[tuple]:
    """(node origin, graph input, extent) for each gather whose indices are a graph input
    (or a view of one: the values are the same)."""
    g = plan.graph
    views = {op.outputs[0]: op.inputs[0] for op in g.ops if op.kind == "view"}
    found = []
    for op in g.ops:
        if op.kind != "gather":
            continue
        source = op.inputs[1]
        while source in views or source in plan.aliases:
            source = views.get(source) or plan.aliases[source]
        if source in g.inputs:
            found.append((op.origin, source, g.tensors[op.inputs[0]].shape[op.attrs["axis"]]))
    return found


def check_input_indices(gathers: list[tuple], feeds: dict, model: str) -> None:
    for origin, name, extent in gathers:
        values = feeds[name]
        bad = (values < -extent) | (values >= extent)
        if values.size and bad.any():
            raise GatherIndexError(f"{model}: {origin}: index {int(values[bad].reshape(-1)[0])} in input {name!r} "
                                   f"is outside [-{extent}, {extent}) of the axis it selects from")


def gather_origins(plan, op_names) -> str:
    """The gather nodes among a kernel's basic ops, for the error a kernel's flag raises."""
    by_name = {op.name: op for op in plan.graph.ops}
    origins = [by_name[n].origin for n in op_names if n in by_name and by_name[n].kind == "gather"]
    return ", ".join(dict.fromkeys(origins)) or "a Gather"
