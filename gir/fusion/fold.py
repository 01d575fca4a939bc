"""Folding composed views into their consumers: an elementwise op or a reduction that reads a
layout (a broadcast, a window unfold, a transpose) reads the layout's source through the
composed strides instead of a materialised copy. This is what keeps a lowered matrix-vector
product or depthwise convolution from writing its expanded operands to DRAM."""
from __future__ import annotations

from dataclasses import replace

from gir.frontend.basic import BasicGraph, BasicOp, contiguous_strides
from gir.templates import Candidates, candidates, elementwise, reduce
from gir.templates.common import broadcast_strides

from .compose import Composition, single_view
from .padfold import ConstantPad, constant_pad, fold_pad


def view_of(comp: Composition, tensor: str, shape: tuple, strides: tuple):
    """(source, offset, strides over `shape`) when reading `tensor` with `strides` is one
    affine read of one source tensor; None otherwise."""
    content = comp.contents.get(tensor)
    return None if content is None else single_view(content, shape, strides)


def folded(op: BasicOp, graph: BasicGraph, comp: Composition, target) -> tuple[Candidates, set[str]] | None:
    """Candidates reading composed inputs through their views, and the tensors no longer read."""
    t = graph.tensors
    if op.kind == "elementwise":
        shape = t[op.outputs[0]].shape or (1,)
        views, skipped = [], set()
        for name in op.inputs:
            bstrides = broadcast_strides(t[name].shape, shape)
            view = view_of(comp, name, shape, bstrides)
            views.append(view or (name, 0, bstrides))
            if view:
                skipped.add(name)
        if not skipped:
            return None
        rejected: list = []
        return Candidates(op, elementwise.generate(op, t, target, rejected, views), rejected), skipped
    if op.kind == "reduce":
        name = op.inputs[0]
        shape = t[name].shape or (1,)
        view = view_of(comp, name, shape, contiguous_strides(shape))
        if view is None:
            return None
        rejected = []
        return Candidates(op, reduce.generate(op, t, target, rejected, view), rejected), {name}
    return None


def provider(graph: BasicGraph, comp: Composition, target):
    """candidates(op) for the planner: folded where possible, the op's own templates else; a
    folded read (a conv or pooling window) also reads through a constant pad where it can
    (padfold). Also returns the
    tensors that folding made unnecessary to write."""
    cache: dict[str, Candidates] = {}
    unread: dict[str, set] = {}
    pads = {p.output: p for p in (constant_pad(op, graph.tensors) for op in graph.ops) if p}

    def get(op: BasicOp) -> Candidates:
        if op.name not in cache:
            found = folded(op, graph, comp, target)
            if not (found and found[0].candidates):
                cache[op.name] = candidates(op, graph.tensors, target)
                return cache[op.name]
            cache[op.name], unread[op.name] = found
            for name in {b for c in cache[op.name].candidates for b in c.graph.buffers if b in pads}:
                if _through(cache[op.name], pads[name]):
                    unread.setdefault(op.name, set()).add(name)
        return cache[op.name]
    return get, unread


def _through(cands: Candidates, pad: ConstantPad) -> bool:
    """Make the candidates read the pad's source where they can; True when all now do (the
    ones that cannot are dropped when others can)."""
    kept = []
    for c in cands.candidates:
        g = fold_pad(c.graph, pad) if pad.output in c.graph.buffers else c.graph
        if g is not None:
            kept.append(replace(c, graph=g))
    if kept:
        cands.candidates = kept
    return bool(kept)
