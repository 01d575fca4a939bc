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
movement does not expand (each element computed once), a producer is kept where operands it
takes from registers would go through DRAM instead (as many elements as it saves), and where
recomputing it takes longer than its DRAM round trip at the target's peak rates (`_pays`).

A producer absorbs the elementwise ops that only it reads (batch norm, ReLU), and a reader may
take it through a constant pad (a conv window): its operands are then read through the same pad
and an inside mask restores the pad value on the border. SAR-DRN's last residual sum is
recomputed in its padded 3x3 conv this way.
"""
from __future__ import annotations

from dataclasses import replace
from math import prod

import numpy as np

from gir.frontend.basic import BasicGraph, BasicOp, Tensor, contiguous_strides
from gir.ir.dtypes import itemsize, np_dtype
from gir.ir.expr import Call, Input, call, count_ops, evaluate, postorder, substitute
from gir.ir.target import Target
from gir.templates.common import broadcast_strides

from .compose import MOVEMENT, Content, Piece, compose, identity, reindex, single_view
from .padfold import constant_pad
from .reorder import splice

CHEAP = {"add", "sub", "mul", "div", "neg", "max", "min", "relu", "abs"}
MAX_OPS = 8


def recompute_cheap_producers(graph: BasicGraph, subgraphs: list[list[BasicOp]], target: Target) -> tuple[BasicGraph, list[list[BasicOp]]]:
    tensors, ops = dict(graph.tensors), list(graph.ops)
    out = []
    for sub in subgraphs:
        sub = list(sub)
        changed = True
        while changed:
            changed = False
            current = replace(graph, tensors=tensors, ops=ops)
            comp, users = compose(current, sub), current.consumers()
            producer = {o: op for op in sub for o in op.outputs}
            for p in sub:
                rewrites = _inlinings(current, sub, comp, users, producer, p, target) if p.kind == "elementwise" else None
                if p.kind == "elementwise" and not rewrites:
                    rewrites = _inlinings_into_copies(current, sub, comp, users, p, target)
                if rewrites:
                    for reader, new in rewrites:
                        splice(ops, reader, new)
                        splice(sub, reader, new)
                    _drop_dead(current.outputs, ops, sub)
                    changed = True
                    break
        out.append(sub)
    return replace(graph, tensors=tensors, ops=ops), out


def _drop_dead(outputs, ops: list[BasicOp], sub: list[BasicOp]):
    """Movement, pad and elementwise ops of the subgraph that nothing reads any more."""
    while True:
        read = {t for op in ops for t in op.inputs} | set(outputs)
        dead = [op for op in sub if op.kind in (*MOVEMENT, "elementwise", "pad") and op.outputs[0] not in read]
        if not dead:
            return
        ids = {id(op) for op in dead}
        ops[:] = [op for op in ops if id(op) not in ids]
        sub[:] = [op for op in sub if id(op) not in ids]


def _inlinings(graph: BasicGraph, sub, comp, users, producer, p: BasicOp, target: Target):
    """[(reader, ops replacing it)] inlining p (with the single-reader producers it absorbs)
    into every reader, or None where some reader of p's result (through movement, or through a
    constant pad then movement) is not an elementwise op of the subgraph that can take it."""
    t = graph.tensors
    result = p.outputs[0]
    inside = {id(op) for op in sub}
    p = _absorbing(graph, producer, users, p)
    if result in graph.outputs or count_ops(p.attrs["expr"]) > MAX_OPS or \
            any(t[x].dtype != t[result].dtype for x in p.inputs):
        return None
    frames = {result: None}  # tensors read as p's result, or as a constant pad of it
    frames |= {op.outputs[0]: op for op in users.get(result, []) if id(op) in inside and constant_pad(op, t)}
    via = {n: f for f in frames for n, c in comp.contents.items() if any(q.source == f for q in c.pieces)} | \
        {f: f for f in frames}
    if set(via) & set(graph.outputs):
        return None
    absorbed = {id(op) for op in comp.absorbed} | {id(op) for op in frames.values() if op is not None}
    readers = list({id(op): op for d in via for op in users.get(d, []) if id(op) not in absorbed}.values())
    if not readers or any(id(op) not in inside or op.kind != "elementwise" for op in readers):
        return None
    if not any(set(r.inputs) & (set(via) - {result}) for r in readers):
        return None  # read in place only: ordinary fusion handles it
    if _exposed(graph, sub, inside, users, p) >= t[result].size or not _pays(graph, p, readers, via, frames, target):
        return None
    rewrites = []
    for r in readers:
        new = _inlined(graph, comp, p, r, {n: frames[f] for n, f in via.items()})
        if new is None:
            return None
        rewrites.append((r, new))
    return rewrites


def _inlinings_into_copies(graph: BasicGraph, sub, comp, users, p: BasicOp, target: Target):
    """As `_inlinings`, where some of p's result leaves the subgraph (or the model) through a
    copying layout that is one view of it: a transpose or head split feeding a library matmul.
    Each such copy becomes a view and an identity elementwise op, which then takes p's
    expression, so p is computed where the copy wrote (BERT's bias adds before the head
    transposes: one kernel instead of an add and a copy). None where p does not then inline."""
    inside = {id(op) for op in sub}
    copies = [m for m in sub if m.kind == "layout" and _copies_out(graph, comp, users, inside, m, p.outputs[0])]
    if not copies:
        return None
    tensors, ops, trial = dict(graph.tensors), list(graph.ops), list(sub)
    split = {}
    for m in copies:
        moved = f"{m.outputs[0]}/moved"
        tensors[moved] = Tensor(moved, tensors[m.outputs[0]].shape, tensors[m.outputs[0]].dtype)
        split[id(m)] = [replace(m, outputs=[moved]),
                        BasicOp(f"{m.name}/copy", "elementwise", [moved], list(m.outputs), {"expr": Input(0), "dtype": tensors[m.outputs[0]].dtype}, m.origin)]
        splice(ops, m, split[id(m)])
        splice(trial, m, split[id(m)])
    current = replace(graph, tensors=tensors, ops=ops)
    rewrites = _inlinings(current, trial, compose(current, trial), current.consumers(),
                          {o: op for op in trial for o in op.outputs}, p, target)
    if not rewrites:
        return None
    graph.tensors.update(tensors)
    return [(m, split[id(m)]) for m in copies] + rewrites


def _copies_out(graph: BasicGraph, comp, users, inside, m: BasicOp, result: str) -> bool:
    """m writes a tensor read outside the subgraph (or returned) whose elements all come from
    `result`, through one view of it."""
    w = m.outputs[0]
    content = comp.contents.get(w)
    if content is None or {q.source for q in content.pieces} != {result}:
        return False
    if w not in graph.outputs and all(id(op) in inside for op in users.get(w, [])):
        return False
    shape = graph.tensors[w].shape or (1,)
    return single_view(content, shape, contiguous_strides(shape)) is not None


def _absorbing(graph: BasicGraph, producer, users, p: BasicOp) -> BasicOp:
    """p with the elementwise producers of its operands substituted in, where p is their only
    reader and reads them in place (SAR-DRN's batch norm and ReLU before the residual add):
    inlining p alone would send those operands through DRAM in its place."""
    t = graph.tensors
    for i, x in enumerate(p.inputs):
        q = producer.get(x)
        if q is None or q.kind != "elementwise" or [op.name for op in users.get(x, [])] != [p.name] \
                or x in graph.outputs or t[x].shape != t[p.outputs[0]].shape or t[x].dtype != t[p.outputs[0]].dtype:
            continue
        q = _absorbing(graph, producer, users, q)
        inputs = p.inputs[:i] + q.inputs + p.inputs[i + 1:]
        shift = {j: Input(j if j < i else j + len(q.inputs) - 1) for j in range(len(p.inputs)) if j != i}
        shift[i] = substitute(q.attrs["expr"], {k: Input(i + k) for k in range(len(q.inputs))})
        return _absorbing(graph, producer, users, replace(p, inputs=inputs, attrs=p.attrs | {"expr": substitute(p.attrs["expr"], shift)}))
    return p


def _pays(graph: BasicGraph, p: BasicOp, readers, via, frames, target: Target) -> bool:
    """The recomputation (p's operations once per element its readers read through expanding
    movement, beyond the elements p computes once) takes less time at the target's peak
    arithmetic rate than writing and reading p's result at its DRAM bandwidth. A GPU recomputes
    BERT's bias adds in QK^T (128 reads per element); a CPU, whose ridge point is 4x lower,
    keeps SAR-DRN's residual sum rather than recompute it nine times per output channel."""
    t = graph.tensors
    result = t[p.outputs[0]]
    extra = 0
    for r in readers:
        moved = [n for n in r.inputs if n in via and n != p.outputs[0]]
        if moved:
            padded = any(frames[via[n]] is not None and not _border_kept(graph, p, frames[via[n]]) for n in moved)
            extra += max(0, t[r.outputs[0]].size - result.size) * (count_ops(p.attrs["expr"]) + 2 * padded)
    saved = 2 * result.size * itemsize(result.dtype)
    return extra / target.peak_flops <= saved / target.dram_bandwidth


def _exposed(graph: BasicGraph, sub, inside, users, p: BasicOp) -> int:
    """Elements of p's operands that inlining would newly send through DRAM: operands computed
    in the subgraph (p took them from registers; its readers would now read them through the
    movement), unless a reduction reads them and reaches p only through movement, which puts
    a device-wide dependency between them and p anyway (an SE block's pooled scale: its input
    is stored for the scale either way; a softmax's exponentials, normalised by their own sum
    in the same kernel, are not)."""
    computing = {t for op in sub if op.kind not in MOVEMENT for t in op.outputs}
    return sum(graph.tensors[x].size for x in set(p.inputs)
               if x in computing and not _stored_anyway(inside, users, p, x))


def _stored_anyway(inside, users, p: BasicOp, x: str) -> bool:
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


def _inlined(graph: BasicGraph, comp, p: BasicOp, r: BasicOp, frames) -> list[BasicOp] | None:
    """Layouts of p's operands over r's index space, then r with p's expression in place of
    each operand it reads as p's result (`frames`: name -> None, or the constant pad it reads p
    through: operands padded too, and the pad's border restored by an inside mask); None where a
    read is no single view of p's result or r's dtype differs."""
    t = graph.tensors
    shape = t[r.outputs[0]].shape or (1,)
    if t[r.outputs[0]].dtype != t[p.outputs[0]].dtype:
        return None
    ops, inputs, replacement = [], [], {}
    for i, name in enumerate(r.inputs):
        if name not in frames:
            inputs.append(name)
            replacement[i] = Input(len(inputs) - 1)
            continue
        pad = frames[name]
        frame = p.outputs[0] if pad is None else pad.outputs[0]
        frame_shape = t[frame].shape or (1,)
        content = comp.contents.get(name) or identity(frame, frame_shape)
        view = single_view(content, shape, broadcast_strides(t[name].shape, shape))
        if view is None or view[0] != frame or view[1] >= prod(frame_shape):
            return None
        if _expands(shape, frame_shape, view[2]) and not _cheap(p.attrs["expr"]):
            return None
        operands = {}
        mask = [] if pad is None or _border_kept(graph, p, pad) else [_inside_mask(graph, pad)]
        for j, x in enumerate(p.inputs + mask):
            tag = f"{p.name}:in{i}.{j}"
            source, prep = (x, []) if pad is None or x in mask else _padded_operand(graph, pad, x, f"{r.name}/recompute {tag}")
            if prep and x in comp.contents:
                return None  # a pad cannot read through movement: the moved operand would be written
            seen = reindex(_whole(source, frame_shape, broadcast_strides(t[source].shape, frame_shape)), view[1], shape, view[2])
            if seen is None or len(seen.pieces) != 1 or seen.pieces[0].lo != (0,) * len(shape) or seen.pieces[0].hi != shape:
                return None
            piece, moved = seen.pieces[0], f"{r.outputs[0]}/{tag}"
            t[moved] = Tensor(moved, shape, t[source].dtype)
            ops += prep + [BasicOp(f"{r.name}/recompute {tag}", "layout", [source], [moved],
                                   {"offset": piece.offset, "shape": shape, "strides": piece.strides}, p.origin)]
            inputs.append(moved)
            operands[j] = Input(len(inputs) - 1)
        value = substitute(p.attrs["expr"], operands)
        if mask:
            value = call("where", call("gt", operands[len(p.inputs)], 0.5), value, pad.attrs.get("value", 0.0))
        replacement[i] = value
    expr = substitute(r.attrs["expr"], replacement)
    return ops + [replace(r, inputs=inputs, attrs=r.attrs | {"expr": expr})]


def _whole(source: str, shape, strides) -> Content:
    """`shape` read from `source` with `strides` (0 where broadcast): one operand as p sees it."""
    return Content(shape, (Piece((0,) * len(shape), shape, source, 0, tuple(strides)),))


def _padded_operand(graph: BasicGraph, pad: BasicOp, x: str, name: str):
    """(tensor to read, ops making it): an operand of p as the pad sees p's result. One that is
    broadcast along every padded dimension is read as it is; another gets the same pad (its
    border values are masked out)."""
    t = graph.tensors
    rank = len(t[pad.outputs[0]].shape)
    own = (1,) * (rank - len(t[x].shape)) + tuple(t[x].shape)
    pads = _operand_pads(pad, own)
    if pads is None:
        return x, []
    out = f"{name}:pad"
    if out not in t:
        padded = tuple(n + a + b for n, (a, b) in zip(own, pads))
        t[out] = Tensor(out, padded[rank - len(t[x].shape):], t[x].dtype)
    pads = pads[rank - len(t[x].shape):]
    return out, [BasicOp(f"{name}:pad", "pad", [x], [out], {"pads": tuple(pads), "mode": "constant", "value": 0.0}, pad.origin)]


def _operand_pads(pad: BasicOp, own) -> list | None:
    """The pad an operand of shape `own` (aligned to the pad's rank) gets: the pad's own along
    the dimensions it spans, none where it is broadcast; None when it is broadcast along every
    padded dimension (read as it is)."""
    pads = [tuple(q) if n > 1 else (0, 0) for q, n in zip(pad.attrs["pads"], own)]
    return None if all(q == (0, 0) for q in pads) else pads


def _border_kept(graph: BasicGraph, p: BasicOp, pad: BasicOp) -> bool:
    """p computed on the pad's border (its padded operands there 0, the others, constants
    broadcast along every padded dimension, as they are) gives the pad value everywhere: the
    recomputation needs no inside mask (a ReLU through a zero pad; not a batch norm, whose
    shift is nonzero)."""
    t = graph.tensors
    rank = len(t[pad.outputs[0]].shape)
    values = []
    for x in p.inputs:
        own = (1,) * (rank - len(t[x].shape)) + tuple(t[x].shape)
        if _operand_pads(pad, own) is None:
            if not t[x].is_const:
                return False
            values.append(np.asarray(t[x].value).reshape(own))
        else:
            values.append(np.zeros((1,) * rank, np_dtype(t[x].dtype)))
    with np.errstate(all="ignore"):
        border = evaluate(p.attrs["expr"], values)
    return bool(np.all(border == pad.attrs.get("value", 0.0)))


def _inside_mask(graph: BasicGraph, pad: BasicOp) -> str:
    """A constant, 1 inside the padded tensor's source box and 0 on its border, broadcast along
    the dimensions the pad leaves alone."""
    t = graph.tensors
    name = f"{pad.outputs[0]}/inside"
    if name not in t:
        out = t[pad.outputs[0]]
        pads = pad.attrs["pads"]
        shape = tuple(n if a or b else 1 for n, (a, b) in zip(out.shape, pads))
        value = np.zeros(shape, np_dtype(out.dtype))
        value[tuple(slice(a, n - b) if a or b else slice(None) for n, (a, b) in zip(shape, pads))] = 1
        t[name] = Tensor(name, shape, out.dtype, value)
    return name


def _expands(shape, source_shape, strides) -> bool:
    """The view reads some element of p's result more than once (a broadcast or a window)."""
    return prod(shape) > prod(source_shape) or any(s == 0 and n > 1 for n, s in zip(shape, strides))


def _cheap(expr) -> bool:
    return all(n.op in CHEAP for n in postorder(expr) if isinstance(n, Call))
