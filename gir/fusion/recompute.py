"""Recomputing cheap elementwise producers in their readers: an elementwise op whose result is
read only through data movement (a transpose, a broadcast, a conv window) by other elementwise
ops is inlined into each of them, its operands read through the composed movement.

Why: a movement that reorders or expands a tensor puts a device-wide dependency between its
producer and its readers (any reader element may need any producer element), so the producer's
result goes through DRAM: written once, read again. BERT's q/k/v bias adds (read by the
attention products through head transposes and broadcasts) and EfficientNet's squeeze-excite
scale (read by the next 1x1 conv through its window) pay that for an add or a multiply. Inlined,
the reader computes the add itself from the producer's operands; with no other reader left the
producer and its movement chain disappear. A transcendental is only recomputed where the
movement does not expand (each element computed once), and a producer is kept where operands
it takes from registers would go through DRAM instead (as many elements as it saves).
"""
from __future__ import annotations

from dataclasses import replace
from math import prod

from gir.frontend.basic import BasicGraph, BasicOp, Tensor
from gir.ir.expr import Call, Input, count_ops, substitute
from gir.templates.common import broadcast_strides

from .compose import MOVEMENT, Content, Piece, compose, reindex, single_view

CHEAP = {"add", "sub", "mul", "div", "neg", "max", "min", "relu", "abs"}
MAX_OPS = 8


def recompute_cheap_producers(graph: BasicGraph, subgraphs: list[list[BasicOp]]) -> tuple[BasicGraph, list[list[BasicOp]]]:
    tensors, ops = dict(graph.tensors), list(graph.ops)
    out = []
    for sub in subgraphs:
        sub = list(sub)
        changed = True
        while changed:
            changed = False
            current = replace(graph, tensors=tensors, ops=ops)
            comp, users = compose(current, sub), current.consumers()
            for p in sub:
                rewrites = _inlinings(current, sub, comp, users, p) if p.kind == "elementwise" else None
                if rewrites:
                    for reader, new in rewrites:
                        for t in new[:-1]:
                            tensors[t.outputs[0]] = Tensor(t.outputs[0], t.attrs["shape"], tensors[t.inputs[0]].dtype)
                        _splice(ops, reader, new)
                        _splice(sub, reader, new)
                    _drop_dead(current.outputs, ops, sub)
                    changed = True
                    break
        out.append(sub)
    return replace(graph, tensors=tensors, ops=ops), out


def _splice(ops: list[BasicOp], old: BasicOp, new: list[BasicOp]):
    i = next(i for i, o in enumerate(ops) if o is old)
    ops[i:i + 1] = new


def _drop_dead(outputs, ops: list[BasicOp], sub: list[BasicOp]):
    """Movement and elementwise ops of the subgraph that nothing reads any more."""
    while True:
        read = {t for op in ops for t in op.inputs} | set(outputs)
        dead = [op for op in sub if op.kind in (*MOVEMENT, "elementwise") and op.outputs[0] not in read]
        if not dead:
            return
        ids = {id(op) for op in dead}
        ops[:] = [op for op in ops if id(op) not in ids]
        sub[:] = [op for op in sub if id(op) not in ids]


def _inlinings(graph: BasicGraph, sub, comp, users, p: BasicOp):
    """[(reader, ops replacing it)] inlining p into every reader, or None where some reader of
    p's result (through movement) is not an elementwise op of the subgraph that can take it."""
    t = graph.tensors
    result = p.outputs[0]
    dtype = t[result].dtype
    if result in graph.outputs or count_ops(p.attrs["expr"]) > MAX_OPS or \
            any(t[x].dtype != dtype for x in p.inputs):
        return None
    derived = {result} | {n for n, c in comp.contents.items() if any(q.source == result for q in c.pieces)}
    if derived & set(graph.outputs):
        return None
    inside = {id(op) for op in sub}
    absorbed = {id(op) for op in comp.absorbed}
    readers = list({id(op): op for d in derived for op in users.get(d, []) if id(op) not in absorbed}.values())
    if not readers or any(id(op) not in inside or op.kind != "elementwise" for op in readers):
        return None
    if not any(set(r.inputs) & (derived - {result}) for r in readers):
        return None  # read in place only: ordinary fusion handles it
    if _exposed(graph, sub, users, p) >= t[result].size:
        return None
    rewrites = []
    for r in readers:
        new = _inlined(graph, comp, p, r, derived)
        if new is None:
            return None
        rewrites.append((r, new))
    return rewrites


def _exposed(graph: BasicGraph, sub, users, p: BasicOp) -> int:
    """Elements of p's operands that inlining would newly send through DRAM: operands computed
    in the subgraph (p took them from registers; its readers would now read them through the
    movement), unless a reduction reads them and reaches p only through movement, which puts
    a device-wide dependency between them and p anyway (an SE block's pooled scale: its input
    is stored for the scale either way; a softmax's exponentials, normalised by their own sum
    in the same kernel, are not)."""
    computing = {t for op in sub if op.kind not in MOVEMENT for t in op.outputs}
    return sum(graph.tensors[x].size for x in set(p.inputs)
               if x in computing and not _stored_anyway(sub, users, p, x))


def _stored_anyway(sub, users, p: BasicOp, x: str) -> bool:
    inside = {id(op) for op in sub}
    for r in users.get(x, []):
        if r.kind == "reduce" and id(r) in inside:
            direct = _reach(users, inside, r.outputs[0], through_movement=False)
            if set(p.inputs) & _reach(users, inside, r.outputs[0], True) and not set(p.inputs) & direct:
                return True
    return False


def _reach(users, inside, start: str, through_movement: bool) -> set[str]:
    """Tensors computed from `start` inside the subgraph (optionally not through a layout)."""
    seen, todo = {start}, [start]
    while todo:
        for op in users.get(todo.pop(), []):
            if id(op) in inside and (through_movement or op.kind != "layout") and op.outputs[0] not in seen:
                seen.add(op.outputs[0])
                todo.append(op.outputs[0])
    return seen


def _inlined(graph: BasicGraph, comp, p: BasicOp, r: BasicOp, derived) -> list[BasicOp] | None:
    """Layouts of p's operands over r's index space, then r with p's expression in place of
    each derived operand; None where a read is no single view of p's result or r's dtype differs."""
    t = graph.tensors
    shape = t[r.outputs[0]].shape or (1,)
    source_shape = t[p.outputs[0]].shape or (1,)
    if t[r.outputs[0]].dtype != t[p.outputs[0]].dtype:
        return None
    layouts, inputs, replacement = [], [], {}
    for i, name in enumerate(r.inputs):
        if name not in derived:
            inputs.append(name)
            replacement[i] = Input(len(inputs) - 1)
            continue
        content = comp.contents.get(name) or Content(source_shape, (Piece((0,) * len(source_shape), source_shape, name, 0,
                                                                            _contiguous(source_shape)),))
        view = single_view(content, shape, broadcast_strides(t[name].shape, shape))
        if view is None or view[0] != p.outputs[0]:
            return None
        if _expands(shape, source_shape, view[2]) and not _cheap(p.attrs["expr"]):
            return None
        operands = {}
        for j, x in enumerate(p.inputs):
            own = Content(source_shape, (Piece((0,) * len(source_shape), source_shape, x, 0,
                                               broadcast_strides(t[x].shape, source_shape)),))
            seen = reindex(own, view[1], shape, view[2]) if view[1] < prod(source_shape) else None
            if seen is None or len(seen.pieces) != 1 or seen.pieces[0].lo != (0,) * len(shape) or seen.pieces[0].hi != shape:
                return None
            piece = seen.pieces[0]
            moved = f"{r.outputs[0]}/{p.name}:in{i}.{j}"
            layouts.append(BasicOp(f"{r.name}/recompute {p.name}:in{i}.{j}", "layout", [x], [moved],
                                   {"offset": piece.offset, "shape": shape, "strides": piece.strides}, p.origin))
            inputs.append(moved)
            operands[j] = Input(len(inputs) - 1)
        replacement[i] = substitute(p.attrs["expr"], operands)
    expr = substitute(r.attrs["expr"], replacement)
    return layouts + [replace(r, inputs=inputs, attrs=r.attrs | {"expr": expr})]


def _contiguous(shape) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


def _expands(shape, source_shape, strides) -> bool:
    """The view reads some element of p's result more than once (a broadcast or a window)."""
    return prod(shape) > prod(source_shape) or any(s == 0 and n > 1 for n, s in zip(shape, strides))


def _cheap(expr) -> bool:
    if isinstance(expr, Call):
        return expr.op in CHEAP and all(_cheap(a) for a in expr.args)
    return True
