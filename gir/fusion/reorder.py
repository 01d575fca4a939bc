"""Reductions made innermost: an elementwise op whose only reader is a reduction over middle
axes is re-expressed over its index space permuted so that the reduced axes come last (and,
where one of them indexes the taps of an unfolded window, split into the window's own
dimensions).

Why: the templates fuse an elementwise producer into a reduction when both walk the same
index order with the reduced axes innermost (a lowered matmul or depthwise conv). RedNet's
involution multiplies a per-pixel kernel with a 7x7 unfold and sums over the 49 taps, which sit
between the channels and the pixels; in ONNX order the product (40 MB a layer) goes through DRAM
and the unfold (49 shifted slices joined by a concat) is written expanded. Reordered, each
operand is a strided layout of its source (the 49 taps, split 7x7, are one affine view of the
padded input), composition and folding read them in place, and product and sum are one kernel.

The same reordering also permutes the kept axes when the reduction's result is read only through
a transpose: BERT's P @ V is transposed back from heads to tokens; the sum then writes the
transposed layout directly and no copy kernel rereads the product.
"""
from __future__ import annotations

from dataclasses import replace
from itertools import product
from math import prod

from gir.frontend.basic import BasicGraph, BasicOp, Tensor, contiguous_strides
from gir.templates.common import broadcast_strides

from .compose import MOVEMENT, Composition, compose, single_view


def innermost_reductions(graph: BasicGraph, subgraphs: list[list[BasicOp]]) -> tuple[BasicGraph, list[list[BasicOp]]]:
    """The graph and subgraphs with every eligible elementwise -> reduce pair reordered."""
    tensors, ops = dict(graph.tensors), list(graph.ops)
    readers = graph.consumers()
    out_subgraphs = []
    for sub in subgraphs:
        comp = None
        producer = {t: op for op in sub for t in op.outputs}
        new_sub = list(sub)
        for r in sub:
            if r.kind != "reduce":
                continue
            permute = _permuting_reader(graph, sub, r, readers)
            if permute is not None and _innermost(graph, r) and _keeps_last(permute[1]):
                written = replace(r, outputs=permute[0].outputs, attrs=r.attrs | {"order": tuple(permute[1])})
                for old, new in ((r, [written]), (permute[0], [])):
                    splice(ops, old, new)
                    splice(new_sub, old, new)
                continue
            e = producer.get(r.inputs[0])
            if e is None or e.kind != "elementwise":
                continue
            if not _eligible(graph, e, r, producer, readers, permute is not None):
                continue
            comp = comp or compose(graph, sub)
            layout = _layout(graph, comp, e, r, permute[1] if permute else None)
            if layout is None:
                continue
            e_ops, r_ops = _rewrite(graph, tensors, e, r, *layout, permute[0] if permute else None)
            for old, new in ((e, e_ops), (r, r_ops)) + (((permute[0], []),) if permute else ()):
                splice(ops, old, new)
                splice(new_sub, old, new)
        out_subgraphs.append(new_sub)
    return replace(graph, tensors=tensors, ops=ops), out_subgraphs


def splice(ops: list[BasicOp], old: BasicOp, new: list[BasicOp]):
    """Replace the op `old` (by identity) with the ops `new`, in place."""
    i = next(i for i, o in enumerate(ops) if o is old)
    ops[i:i + 1] = new


def _innermost(graph: BasicGraph, r: BasicOp) -> bool:
    rank, axes = len(graph.tensors[r.inputs[0]].shape), r.attrs["axes"]
    return axes == tuple(range(rank - len(axes), rank))


def _keeps_last(order) -> bool:
    """The transposed result still has its innermost dimension last: the reduction writes it
    directly, its blocks in the input's order (a grid that matches its producer's), with
    each unit's outputs contiguous."""
    return order[-1] == len(order) - 1


def _eligible(graph: BasicGraph, e: BasicOp, r: BasicOp, producer, readers, permuted: bool) -> bool:
    """The product feeds only the reduction, the reduced axes are not innermost already (or the
    result is read only through a transpose, which the reduction can then write directly), and
    no operand comes from a computing op of the subgraph (that op would then be read in another
    order than it writes, and lose its own fusion)."""
    rank = len(graph.tensors[e.outputs[0]].shape)
    axes = r.attrs["axes"]
    if (axes == tuple(range(rank - len(axes), rank)) and not permuted) or e.outputs[0] in graph.outputs:
        return False
    if [op.name for op in readers.get(e.outputs[0], [])] != [r.name]:
        return False
    return all(producer.get(t) is None or producer[t].kind in MOVEMENT for t in e.inputs)


def _permuting_reader(graph: BasicGraph, sub, r: BasicOp, readers):
    """(layout, order) when r's result is read only by a layout of the subgraph that permutes
    its dimensions (BERT's heads transposed back after P @ V): dimension i of the layout is
    dimension order[i] of r's result."""
    out = r.outputs[0]
    users = readers.get(out, [])
    if r.attrs["keepdims"] or out in graph.outputs or len(users) != 1 or users[0].kind != "layout" \
            or not any(op is users[0] for op in sub):
        return None
    layout, shape = users[0], graph.tensors[out].shape
    a, own = layout.attrs, contiguous_strides(shape)
    if a["offset"] != 0 or len(a["shape"]) != len(shape):
        return None
    order = []
    for n, stride in zip(a["shape"], a["strides"]):
        match = [j for j in range(len(shape)) if j not in order and shape[j] == n and (own[j] == stride or n == 1)]
        if not match:
            return None
        order.append(match[0])
    return (layout, order) if order != sorted(order) else None


def _layout(graph: BasicGraph, comp: Composition, e: BasicOp, r: BasicOp, order):
    """(new shape, operand strides) with the kept axes in `order` (default: as they are) and the
    reduced axes last, each split into factors where that makes every composed operand one
    affine view of its source; None if no split does."""
    shape = graph.tensors[e.outputs[0]].shape
    axes = r.attrs["axes"]
    kept = [d for d in range(len(shape)) if d not in axes]
    kept = kept if order is None else [kept[i] for i in order]
    for split in product(*(_factorings(shape[d]) for d in axes)):
        new_shape = tuple(shape[d] for d in kept) + tuple(f for fs in split for f in fs)
        strides = [_strides(graph.tensors[t].shape, shape, kept, axes, split) for t in e.inputs]
        if all(t not in comp.contents or single_view(comp.contents[t], new_shape, s) is not None
               for t, s in zip(e.inputs, strides)):
            return new_shape, strides
    return None


def _factorings(n: int) -> list[tuple[int, ...]]:
    """n whole first, then as two factors (a window's rows x columns)."""
    return [(n,)] + [(a, n // a) for a in range(2, n) if n % a == 0]


def _strides(operand: tuple, shape: tuple, kept, axes, split) -> tuple[int, ...]:
    """The operand's broadcast strides over the kept axes, then over each reduced axis's factors."""
    own = broadcast_strides(operand, shape)
    out = [own[d] for d in kept]
    for d, factors in zip(axes, split):
        out += [own[d] * prod(factors[i + 1:]) for i in range(len(factors))]
    return tuple(out)


def _rewrite(graph: BasicGraph, tensors: dict, e: BasicOp, r: BasicOp, shape, strides, permute: BasicOp | None):
    """(ops replacing e: layouts of its operands and the product over `shape`; ops replacing r:
    the reduction of the last axes, writing the permuting layout's result where there is one,
    then a reshape where r kept the reduced dimensions)."""
    e_ops, operands = [], []
    for i, (name, s) in enumerate(zip(e.inputs, strides)):
        view = f"{e.outputs[0]}/reordered_in{i}"
        tensors[view] = Tensor(view, shape, tensors[name].dtype)
        e_ops.append(BasicOp(f"{e.name}/reorder_in{i}", "layout", [name], [view],
                             {"offset": 0, "shape": shape, "strides": s}, e.origin))
        operands.append(view)
    product_name = f"{e.outputs[0]}/reordered"
    tensors[product_name] = Tensor(product_name, shape, tensors[e.outputs[0]].dtype)
    e_ops.append(replace(e, inputs=operands, outputs=[product_name]))
    kept = len(graph.tensors[e.outputs[0]].shape) - len(r.attrs["axes"])
    attrs = r.attrs | {"axes": tuple(range(kept, len(shape))), "keepdims": False}
    if permute is not None:
        return e_ops, [replace(r, inputs=[product_name], outputs=permute.outputs, attrs=attrs)]
    out = tensors[r.outputs[0]]
    if not r.attrs["keepdims"]:
        return e_ops, [replace(r, inputs=[product_name], attrs=attrs)]
    flat = f"{out.name}/reordered"
    tensors[flat] = Tensor(flat, shape[:kept], out.dtype)
    return e_ops, [replace(r, inputs=[product_name], outputs=[flat], attrs=attrs),
                   BasicOp(f"{r.name}/reorder_out", "view", [flat], [out.name], {}, r.origin)]
