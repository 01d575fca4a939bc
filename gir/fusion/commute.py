"""Monotone elementwise ops moved past the max pooling that reads them.

Why: ReLU then max pooling (ResNet's and RedNet's stem) reads the ReLU's result through a
window, which puts a device-wide dependency between the two: the ReLU's result is written and
read back (3.2 MB each way at RedNet-50's stem). A non-decreasing function commutes with max,
relu(max(window)) == max(relu(window)), so the pooling reads the ReLU's input and the ReLU
becomes its epilogue, on four times fewer elements and in the same kernel. With a -inf pad the
swap holds as long as every window holds one element of the input (checked on the window's
own addresses): -inf never wins either max.
"""
from __future__ import annotations

from dataclasses import replace
from math import inf

import numpy as np

from gir.frontend.basic import BasicGraph, BasicOp, Tensor
from gir.ir.expr import Const, Input, fold

from .reorder import splice

NON_DECREASING = {"relu", "sigmoid", "tanh", "exp"}
WITH_A_CONSTANT = {"max", "min", "add"}


def pooling_before_monotone_ops(graph: BasicGraph, subgraphs: list[list[BasicOp]]) -> tuple[BasicGraph, list[list[BasicOp]]]:
    tensors, ops = dict(graph.tensors), list(graph.ops)
    out = []
    for sub in subgraphs:
        sub = list(sub)
        users = replace(graph, tensors=tensors, ops=ops).consumers()
        for p in [op for op in sub if op.kind == "elementwise"]:
            chain = _pooling_chain(graph, tensors, users, sub, p)
            if chain is None:
                continue
            steps, source, moved = [op for op in chain if op is not None], p.inputs[0], []
            for op in steps:
                moved.append(_renamed(tensors, op, source))
                source = moved[-1].outputs[0]
            pool = steps[-1]
            epilogue = replace(p, name=f"{p.name}/after {pool.name}", inputs=[source], outputs=list(pool.outputs))
            for old, new in zip(steps, [[m] for m in moved[:-1]] + [[moved[-1], epilogue]]):
                splice(ops, old, new)
                splice(sub, old, new)
            ops[:] = [op for op in ops if op is not p]
            sub[:] = [op for op in sub if op is not p]
        out.append(sub)
    return replace(graph, tensors=tensors, ops=ops), out


def _pooling_chain(graph: BasicGraph, tensors, users, sub, p: BasicOp):
    """(pad or None, window, max) when p is a non-decreasing function of one tensor whose result
    only a max pooling reads (through a -inf pad and a window layout) and every window holds an
    element of the input."""
    inside = {id(op) for op in sub}
    if len(p.inputs) != 1 or not _non_decreasing(p.attrs["expr"]) or p.outputs[0] in graph.outputs \
            or tensors[p.inputs[0]].dtype != tensors[p.outputs[0]].dtype:
        return None
    chain, name = [], p.outputs[0]
    for kind in ("pad", "layout", "reduce"):
        readers = users.get(name, [])
        if len(readers) != 1 or id(readers[0]) not in inside or name in graph.outputs:
            return None
        op = readers[0]
        if op.kind != kind and kind == "pad":
            chain.append(None)
            continue
        if op.kind != kind:
            return None
        chain.append(op)
        name = op.outputs[0]
    pad, window, pool = chain
    if pool.attrs["op"] != "max" or (pad is not None and (pad.attrs["mode"] != "constant" or pad.attrs.get("value") != -inf)):
        return None
    if not _every_window_holds_input(tensors, pad, window, pool):
        return None
    return pad, window, pool


def _every_window_holds_input(tensors, pad, window, pool) -> bool:
    if pad is None:
        return True
    padded = tensors[pad.outputs[0]].shape
    inside = np.zeros(padded, bool)
    inside[tuple(slice(a, n - b) for n, (a, b) in zip(padded, pad.attrs["pads"]))] = True
    a = window.attrs
    strides = [s * inside.itemsize for s in a["strides"]]
    seen = np.lib.stride_tricks.as_strided(inside.reshape(-1)[a["offset"]:], a["shape"], strides)
    return bool(seen.any(axis=tuple(pool.attrs["axes"])).all())


def _renamed(tensors, op: BasicOp, source: str) -> BasicOp:
    """A copy of op reading `source` and writing a new tensor of its output's shape."""
    old = tensors[op.outputs[0]]
    name = f"{op.outputs[0]}/before monotone"
    tensors[name] = Tensor(name, old.shape, old.dtype)
    return replace(op, name=f"{op.name}/before monotone", inputs=[source], outputs=[name])


def _non_decreasing(expr) -> bool:
    """Built from the one input by non-decreasing functions and max/min/add with a constant."""
    def node(n, ok):
        if n.op in NON_DECREASING and len(n.args) == 1:
            return ok[0]
        if n.op in WITH_A_CONSTANT and len(n.args) == 2:
            consts = [a for a in n.args if isinstance(a, Const)]
            return len(consts) == 1 and all(k for a, k in zip(n.args, ok) if not isinstance(a, Const))
        return False
    return fold(expr, lambda n: isinstance(n, Input), node)  # no recursion: chains may be deep
